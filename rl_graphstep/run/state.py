"""What a checkpoint of a training run holds, and putting it back: the loop's counters, the
learner, the replay buffer, the random-number states, the environments."""

from __future__ import annotations

import dataclasses
import io
import pickle
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from rl_graphstep.core.errors import CheckpointError, ConfigError, display_path
from rl_graphstep.data.normalizer import ObservationNormalizer, RewardNormalizer
from rl_graphstep.data.nstep import NStepRows
from rl_graphstep.envs.vector import EpisodeStatistics, rng_state, set_rng_state
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.onpolicy import OnPolicyLearner
from rl_graphstep.run.checkpoint import FORMAT, networks_mismatch, save_checkpoint
from rl_graphstep.run.collector import Collector
from rl_graphstep.run.nonfinite import NonFiniteTally
from rl_graphstep.run.rollouts import RolloutCollector
from rl_graphstep.settings.config import (
    Config,
    config_from_dict,
    config_to_dict,
    saved_config_values,
)
from rl_graphstep.settings.values import flag_of


@dataclass
class Progress:
    """The loop's counters, saved in every checkpoint. ``seed_returns`` and ``tallies`` hold
    one entry per seed (one for a single run): each seed's last 10 returns and its non-finite
    tally."""

    global_step: int = 0
    episodes: int = 0
    episode_stats: EpisodeStatistics = field(default_factory=lambda: EpisodeStatistics(1))
    seed_returns: list[deque[float]] = field(default_factory=lambda: [deque(maxlen=10)])
    tallies: list[NonFiniteTally] = field(default_factory=lambda: [NonFiniteTally("")])

    @classmethod
    def of(cls, env_id: str, seeds: Sequence[int], num_envs: int) -> Progress:
        """Fresh counters for the run's ``seeds`` (each tally named by its seed, which its
        warning and the run's last line give), ``num_envs`` envs each."""
        return cls(episode_stats=EpisodeStatistics(len(seeds) * num_envs),
                   seed_returns=[deque(maxlen=10) for _ in seeds],
                   tallies=[NonFiniteTally(env_id, seed=None if len(seeds) == 1 else seed)
                            for seed in seeds])

    @property
    def recent_returns(self) -> deque[float]:
        """A single run's last 10 returns."""
        return self.seed_returns[0]

    @property
    def nonfinite(self) -> NonFiniteTally:
        """A single run's tally; a group's first (which also counts the group's updates)."""
        return self.tallies[0]

    @property
    def grouped(self) -> bool:
        return len(self.tallies) > 1


# Settings a resumed run takes from its folder, or that the start line shows anyway.
_NOT_CHANGES = ("resume", "log_dir", "run_name", "total_timesteps", "actor", "critic", "seed",
                "num_seeds", "seeds")


def resumed_config(cfg: Config, saved: dict[str, Any], run_dir: Path) -> tuple[Config, str]:
    """The config a run resumed in ``run_dir`` trains with and records, and the start line's
    words for the settings that differ from the run's ``saved`` config (``""`` for none).

    Its folder and name are where it trains, whatever ``cfg`` says. Its seeds are its own:
    ``cfg`` built by hand (not by ``load_config(["--resume", RUN, ...])``, which starts from
    the run's config and refuses other seeds) is one line when they differ."""
    run = config_from_dict(saved_config_values(saved),
                           source=f"the config of {display_path(str(run_dir))}")
    if cfg.seed_list != run.seed_list:
        raise ConfigError(
            f"the config's seeds ({' '.join(map(str, cfg.seed_list))}) are not those of the "
            f"resumed run {display_path(str(run_dir))} ({' '.join(map(str, run.seed_list))}): a "
            "run resumes with its own seeds; build the config with load_config(['--resume', "
            "RUN, ...]), which starts from the run's own")
    problem = (_temperature_problem(cfg, run) or _switch_problem(cfg, run)
               or _critic_support_problem(cfg, run))
    if problem:
        raise ConfigError(problem)
    cfg = dataclasses.replace(cfg, log_dir=str(run_dir.parent), run_name=run_dir.name)
    before, now = config_to_dict(run), config_to_dict(cfg)
    changed = [f"{flag_of(name)} {_shown(before[name])} -> {_shown(now[name])}"
               for name in now if name not in _NOT_CHANGES and now[name] != before[name]]
    return cfg, ("; changed from the run's config: " + ", ".join(changed)) if changed else ""


def _temperature_problem(cfg: Config, run: Config) -> str | None:
    """Why a resumed SAC run cannot take ``cfg``'s temperature settings, or None: whether
    the temperature is learned decides the actor optimizer's groups, and a learned one
    goes on from its checkpoint's value, which ``--alpha`` (its start) no longer sets."""
    if run.algo != "sac":
        return None
    if cfg.autotune != run.autotune:
        given, own = (("--no-autotune", "learns its temperature (--autotune)") if run.autotune
                      else ("--autotune", f"keeps its temperature at --alpha {run.alpha}"))
        return (f"{given} does not match: the resumed run {own}, and a run resumes with its "
                f"temperature's optimizer as it was; drop {given}")
    if cfg.autotune and cfg.alpha != run.alpha:
        return (f"--alpha {cfg.alpha} does not apply on resume: the run learns its temperature "
                f"(--autotune), and --alpha only started it (at {run.alpha}); drop --alpha")
    return None


# Switches a run cannot change on resume, and what the resumed run did without and with
# each: --obs-norm and --reward-norm, its networks learned on observations and rewards as they
# were (raw, or scaled by statistics it goes on counting); --layer-norm decides the
# networks' layers, which the checkpoint's weights fill.
FIXED_SWITCHES = {
    "obs_norm": ("the resumed run trained on raw observations",
                 "the resumed run trained on normalised observations (--obs-norm)"),
    "reward_norm": ("the resumed run learned from raw rewards",
                    "the resumed run learned from scaled rewards (--reward-norm)"),
    "layer_norm": ("the resumed run's networks have no LayerNorm",
                   "the resumed run's networks have LayerNorms (--layer-norm)"),
}


def _switch_problem(cfg: Config, run: Config) -> str | None:
    """Why a resumed run cannot take ``cfg``'s value of a switch of FIXED_SWITCHES, or
    None."""
    for name, (without, with_) in FIXED_SWITCHES.items():
        if getattr(cfg, name) != getattr(run, name):
            flag = flag_of(name)
            given = flag if getattr(cfg, name) else f"--no-{flag[2:]}"
            return (f"{given} does not match: {with_ if getattr(run, name) else without}; "
                    f"drop {given}")
    return None


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(map(str, value))
    return "none" if value is None else str(value)


def _critic_support_problem(cfg: Config, run: Config) -> str | None:
    """Why a resumed run cannot take ``cfg``'s ``--critic-atoms``, ``--v-min`` or
    ``--v-max``, or None: the atoms are the critic's outputs, which the checkpoint's weights
    fill, and the bounds the values its logits were trained to mean."""
    for name in ("critic_atoms", "v_min", "v_max"):
        given, own = getattr(cfg, name), getattr(run, name)
        if given != own:
            flag = flag_of(name)
            return (f"{flag} {_shown(given)} does not match: the resumed run's critic was "
                    f"trained with {flag} {_shown(own)}; drop {flag}")
    return None


def _pickled_envs(envs: gym.vector.VectorEnv) -> bytes | None:
    # A sync vector env of pure-Python envs pickles with its full state (exact resume);
    # cloudpickle (gymnasium's own dependency) because gymnasium builds them from closures.
    # Others (subprocesses, simulators with native handles) restart their episodes instead.
    try:
        return cloudpickle.dumps(envs)
    except Exception:
        return None


def save_run(cfg: Config, run_dir: Path, progress: Progress,
             learner: OffPolicyLearner | OnPolicyLearner,
             collector: Collector | RolloutCollector, *, with_envs: bool = True) -> Path:
    """Write a checkpoint of the run as it stands (the last transition stored first);
    without the envs' state where ``with_envs`` is false (their episodes restart on resume).

    An on-policy run saves no rollout: its learner is the one of the last update, and a
    resumed run starts a fresh rollout from the saved envs. Saved at a rollout boundary (the
    loop's periodic and final checkpoints) that is the run going on exactly; saved mid-rollout
    (a stop, an error), the steps of the rollout under way are not learned from."""
    collector.flush(progress.global_step)
    policy = collector.policy
    staged = policy.staged_actor() if policy is not None else []
    buffer = collector.buffer
    observations, rewards = _normalizers(learner)
    state = {
        "format": FORMAT,
        "config": config_to_dict(cfg),
        "run_name": run_dir.name,
        "global_step": progress.global_step,
        "episodes": progress.episodes,
        **_progress_state(progress, learner),
        "episode_stats": progress.episode_stats.state_dict(),
        "agent": learner.state_dict(),
        "rng": rng_state(),
        "envs": _pickled_envs(collector.envs) if with_envs else None,
        "observations": collector.observations,
        "buffer": buffer.state_dict() if cfg.save_buffer and buffer is not None else None,
        "staged_actor": staged or None,
        # The n-step windows under way and their rows not stored yet (--n-step above 1).
        "nstep": collector.nstep.state_dict() if collector.nstep is not None else None,
        # Saved whether or not the buffer is: an obs-norm policy acts through them.
        "obs_normalizer": _state_of(observations),
        # PPO's --reward-norm: the return statistics and each env's running return.
        "reward_normalizer": _state_of(rewards),
    }
    return save_checkpoint(run_dir, progress.global_step, state, keep=cfg.keep_checkpoints)


def restore_run(state: dict[str, Any], learner: OffPolicyLearner | OnPolicyLearner,
                progress: Progress,
                envs: gym.vector.VectorEnv, nstep: NStepRows | None = None
                ) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    """Put a checkpoint back: learner (before any capture), buffer, counters, RNG, envs, and
    the n-step windows into ``nstep`` (this run's, with --n-step above 1; a run resumed with
    --n-step 1 drops those it saved); returns the envs to continue with and their
    observations."""
    try:
        learner.load_state_dict(state["agent"])
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        algorithm = learner.algorithm
        built = (f"the actor {type(algorithm.actor).__name__} and critic "
                 f"{type(algorithm.critic).__name__}")
        raise CheckpointError(networks_mismatch(state, learner.cfg, error, built)) from None
    if isinstance(learner, OffPolicyLearner) and state.get("buffer") is not None:
        learner.buffer.load_state_dict(state["buffer"])
    observations, rewards = _normalizers(learner)
    _load_normalizer(observations, state.get("obs_normalizer"), "observation")
    _load_normalizer(rewards, state.get("reward_normalizer"), "reward")
    progress.global_step = int(state["global_step"])
    progress.episodes = int(state["episodes"])
    _load_progress_state(progress, state, learner.updates)
    set_rng_state(state["rng"])
    saved = _load_envs(state["envs"]) if state.get("envs") is not None else None
    go_on = saved is not None and _same_kind(saved, envs)
    if nstep is not None and state.get("nstep") is not None:
        # Windows of episodes that restart end where the checkpoint was written.
        nstep.load_state_dict(state["nstep"], episodes_go_on=go_on)
    if go_on:
        if state.get("episode_stats") is not None:
            progress.episode_stats.load_state_dict(state["episode_stats"])
        envs.close()
        return saved, state["observations"]
    if saved is None:
        why = "the environments could not be saved with the checkpoint"
    else:
        # Another --num-envs or --vec-env: the envs the run asked for, not the saved ones
        # (which would step as many as before, as before, while the run said otherwise).
        saved.close()
        why = f"the checkpoint holds {_kind(saved)}, this run steps {_kind(envs)}"
    warnings.warn(f"{why}; their episodes restart on resume", stacklevel=3)
    if rewards is not None:  # the returns of the episodes that restart
        rewards.restart_episodes()
    observations, _ = envs.reset()
    return envs, observations


def _normalizers(learner: OffPolicyLearner | OnPolicyLearner
                 ) -> tuple[ObservationNormalizer | None, RewardNormalizer | None]:
    """The run's ``--obs-norm`` and ``--reward-norm`` statistics (None where off): the
    replay buffer's, or the rollout's."""
    if isinstance(learner, OffPolicyLearner):
        return learner.buffer.normalizer, None
    return learner.rollout.normalizer, learner.rollout.reward_normalizer


def _state_of(normalizer: ObservationNormalizer | RewardNormalizer | None
              ) -> dict[str, Any] | None:
    return None if normalizer is None else normalizer.state_dict()


def _load_normalizer(normalizer: ObservationNormalizer | RewardNormalizer | None,
                     saved: dict[str, Any] | None, what: str) -> None:
    """The ``what`` (observation, reward) statistics back; a run with and a checkpoint
    without them (or the other way round) cannot meet: ``resumed_config`` refuses another
    ``--obs-norm`` or ``--reward-norm``."""
    if normalizer is None or saved is None:
        return
    try:
        normalizer.load_state_dict(saved)
    except ValueError as error:
        raise CheckpointError(f"the checkpoint's {what} statistics do not fit this run: "
                              f"{error}") from None


def _same_kind(saved: gym.vector.VectorEnv, envs: gym.vector.VectorEnv) -> bool:
    # By kind, not class: a checkpoint's one sync env may predate OneEnvVector.
    return _kind(saved) == _kind(envs)


# The --vec-env kind of each vector env class make_vec_env builds.
_KINDS = {"OneEnvVector": "sync", "SyncVectorEnv": "sync", "AsyncVectorEnv": "async",
          "SharedMemoryVectorEnv": "shared"}


def _kind(envs: gym.vector.VectorEnv) -> str:
    """``2 sync envs``, as --num-envs and --vec-env name them."""
    kind = _KINDS.get(type(envs).__name__, type(envs).__name__)
    return f"{envs.num_envs} {kind} env{'s' if envs.num_envs > 1 else ''}"


def _progress_state(progress: Progress, learner: OffPolicyLearner | OnPolicyLearner
                    ) -> dict[str, Any]:
    """A single run's returns and tally as before; a group's as one list per seed."""
    if not progress.grouped:
        return {"recent_returns": list(progress.recent_returns),
                "nonfinite": progress.nonfinite.state_dict(learner)}
    return {"recent_returns": [list(r) for r in progress.seed_returns],
            "nonfinite": [t.state_dict(learner) for t in progress.tallies]}


def _load_progress_state(progress: Progress, state: dict[str, Any], updates: int) -> None:
    if not progress.grouped:
        progress.recent_returns.extend(state["recent_returns"])
        progress.nonfinite.load_state_dict(state.get("nonfinite"), updates)
        return
    for returns, saved in zip(progress.seed_returns, state["recent_returns"], strict=True):
        returns.extend(saved)
    for tally, saved in zip(progress.tallies, state["nonfinite"], strict=True):
        tally.load_state_dict(saved, updates)


# The env modules of checkpoints written before the package's folders: saved envs name their
# classes by module path.
_MOVED_MODULES = {
    "rl_graphstep.envs": "rl_graphstep.envs.vector",
    "rl_graphstep.envmake": "rl_graphstep.envs.make",
    "rl_graphstep.envcheck": "rl_graphstep.envs.check",
    "rl_graphstep.sharedenvs": "rl_graphstep.envs.shared",
}


class _EnvUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(_MOVED_MODULES.get(module, module), name)


def _load_envs(data: bytes) -> Any:
    """The saved envs, also from a checkpoint whose env classes lived in modules since moved."""
    return _EnvUnpickler(io.BytesIO(data)).load()
