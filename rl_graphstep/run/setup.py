"""Setting a training run up for its loop: the run folder and its ownership, the checkpoint it
resumes, the plan, the environments, the networks, the learner, the collector and the logs."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rl_graphstep.algorithms import algorithm_class, check_settings, is_on_policy
from rl_graphstep.core.compiling import updates_ahead
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.normalizer import (
    NormalizationForm,
    ObservationNormalizer,
    RewardNormalizer,
)
from rl_graphstep.data.nstep import NStepRows
from rl_graphstep.data.rollout import Rollout
from rl_graphstep.envs.vector import (
    check_trained_observations,
    first_reset,
    make_vec_env,
    seed_everything,
)
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.onpolicy import OnPolicyLearner
from rl_graphstep.networks.custom import NetworkSpec
from rl_graphstep.networks.seeds import SeedStack
from rl_graphstep.run.acting import ActionPipe, acting_policy
from rl_graphstep.run.checkpoint import (
    CHECKPOINT_DIR,
    list_checkpoints,
    load_checkpoint,
    set_aside_later,
)
from rl_graphstep.run.cli import suggested_command
from rl_graphstep.run.collector import Collector
from rl_graphstep.run.console import LoopClock
from rl_graphstep.run.netspec import (
    describe_networks,
    make_seed_networks,
    networks_of_run,
    record_networks,
)
from rl_graphstep.run.pponets import make_ppo_networks
from rl_graphstep.run.rollouts import RolloutCollector
from rl_graphstep.run.rundir import (
    PartialSaves,
    RunLock,
    check_run_dir,
    check_writable_folder,
    claim_run_dir,
    clean_partial_saves,
    own_run_dir,
    run_dir_of,
    set_aside_earlier_logs,
)
from rl_graphstep.run.runlog import RunLog
from rl_graphstep.run.state import Progress, restore_run, resumed_config
from rl_graphstep.settings.config import Config, network_problem
from rl_graphstep.settings.plan import RunPlan, plan_run

Reporter = Callable[[int, list[list[float]]], None]
"""``report(step, recent)``: each seed's recent episode returns at a log interval."""


@dataclasses.dataclass
class Run:
    """Everything the loop works with, set up by :func:`set_up`."""

    cfg: Config  # with the custom networks' specs as recorded
    run_dir: Path
    progress: Progress
    learner: OffPolicyLearner | OnPolicyLearner
    collector: Collector | RolloutCollector
    plan: RunPlan
    log: RunLog
    clock: LoopClock
    first_line: str
    staged_actor: list[torch.Tensor] | None = None  # a resumed run's (see ActionPipe)
    report: Reporter | None = None  # see train.train


def _check_named_folder(cfg: Config, run_dir: Path, *, resumed: bool) -> None:
    """A folder the run was named to: no run's checkpoints in it but the one resumed, and
    checkpoints writable now, not found unwritable at the first save after the whole span."""
    if not resumed and list_checkpoints(run_dir):
        raise ConfigError(f"{run_dir} already holds a run with checkpoints; pick another "
                          "--run-name, or continue it with: "
                          f"{suggested_command('train', '--resume', str(run_dir))}")
    check_writable_folder(run_dir / CHECKPOINT_DIR, "checkpoints", "" if cfg.resume
                          else " or pick another --log-dir or --run-name")


def _moved_and_resumed(cfg: Config, resumed: dict[str, Any] | None, step: int,
                       stored: int | None,
                       changes: str, set_aside: Path | None, earlier: Path | None,
                       removed: PartialSaves | None) -> str:
    """The first line's end: where a resume starts and what it changed, and what the start
    moved or removed in the folder. ``stored``: the replay buffer's rows (None for an
    on-policy run, which has none to refill)."""
    return ((f"; resumed at step {step}{changes}" if resumed else "")
            + (_refill_note(cfg, step, stored)
               if resumed is not None and resumed.get("buffer") is None and stored is not None
               else "")
            + (f"; later checkpoints moved to {set_aside}" if set_aside else "")
            + (f"; the logs of an earlier start, which saved no checkpoint, moved to "
               f"{earlier}" if earlier else "")
            + (f"; {removed.describe()}" if removed else ""))


def set_up(cfg: Config, device: torch.device, actor: NetworkSpec, critic: NetworkSpec,
           owned: contextlib.ExitStack, cpus: int | None = None, *,
           launched: float | None = None) -> Run:
    """The run folder (owned until ``owned`` closes), the checkpoint to resume, the plan
    (for ``cpus`` CPUs, see ``plan_run``), the envs, the networks, the learner, the collector
    and the logs (which record ``launched``, the Unix time the process was launched, where
    given)."""
    _check_networks_asked(cfg, actor, critic)
    run_dir = run_dir_of(cfg)
    check_run_dir(run_dir)
    # A folder named by the clock is claimed when the run starts logging (see below).
    by_clock = not cfg.resume and not cfg.run_name
    # Owned before the checkpoint is read and anything is checked or written in the folder.
    if not by_clock:
        own_run_dir(cfg, run_dir, owned)
    resumed = (load_checkpoint(cfg.resume, env_id=cfg.env_id, algo=cfg.algo)
               if cfg.resume else None)
    changes = ""
    if resumed is not None:  # trained and recorded in its own folder, as it was or told
        cfg, changes = resumed_config(cfg, resumed["config"], run_dir)
    if not by_clock:  # a new folder named by the clock has no checkpoints/ yet
        _check_named_folder(cfg, run_dir, resumed=resumed is not None)
    removed = None if by_clock else clean_partial_saves(run_dir)
    start_step = int(resumed["global_step"]) if resumed else 0
    plan = _plan(cfg, device, start_step, cpus)
    seeds = cfg.seed_list  # a group of K seeds steps K x num_envs envs
    seed_everything(seeds[0])
    envs = make_vec_env(cfg.env_id, num_envs=len(seeds) * cfg.num_envs, seed=seeds[0],
                        kind=plan.vec_env, workers=plan.env_workers, algo=cfg.algo)
    # Closed however the run ends, a set-up that fails below included: an async env's
    # workers would outlive it, each printing a traceback. (The loop closes them first;
    # closing again does nothing. A resume may replace envs: the lambda closes the last.)
    owned.callback(lambda: envs.close())
    observation_space, action_space = envs.single_observation_space, envs.single_action_space
    if resumed is not None:  # before its networks meet ones built for another env
        check_trained_observations(cfg.env_id, observation_space, resumed, str(run_dir),
                                   "resume")
    observation_size, action_size = observation_space.shape[0], _action_size(action_space)

    if resumed is not None:  # its recorded file networks are the copies in its folder
        actor, critic = networks_of_run(cfg, resumed["config"], run_dir, actor, critic)
    learner = _learner(cfg, plan, observation_space, action_space, actor, critic)
    algorithm = learner.algorithm
    buffer = None if isinstance(learner, OnPolicyLearner) else learner.buffer
    progress = Progress.of(cfg.env_id, seeds, cfg.num_envs)
    # n-step rows are built on the host as transitions arrive (see data.nstep).
    nstep = (NStepRows(cfg.n_step, cfg.gamma, len(seeds), cfg.num_envs, observation_size,
                       action_size) if cfg.n_step > 1 else None)
    if resumed is not None:
        envs, observations = restore_run(resumed, learner, progress, envs, nstep)
    else:
        # Seed k's env i gets seed_k + i: the seed a run of seed k alone gives it.
        observations = first_reset(envs, seeds[0] if len(seeds) == 1 else
                                   [s + i for s in seeds for i in range(cfg.num_envs)])
    # Resumed from an older checkpoint: the later ones belong to the abandoned timeline. Moved
    # once the checkpoint is restored, so a resume refused on the way leaves them be.
    set_aside = set_aside_later(run_dir, int(resumed["global_step"])) if resumed else None
    collector = _collector(cfg, envs, observations, learner, progress, nstep,
                           resumed=resumed is not None)
    if by_clock:
        # Made here, not earlier, so that bad input leaves no empty folder behind; a run
        # started in the same second (the name's resolution) gets a folder of its own.
        run_dir = claim_run_dir(run_dir)
        owned.enter_context(RunLock(run_dir))
    cfg, custom = record_networks(cfg, run_dir, actor or cfg.actor, _first(algorithm.actor),
                                  critic or cfg.critic, _first(algorithm.critic),
                                  observation_space, action_space)
    # A named run started again after one that ended before its first checkpoint: moved
    # once nothing else can stop the start.
    earlier = set_aside_earlier_logs(run_dir) if resumed is None and not by_clock else None
    log = RunLog.open(cfg, run_dir, progress.global_step, resumed=bool(resumed),
                      launched=launched)
    storage = _rollout_words(learner.rollout) if buffer is None else buffer.describe()
    first_line = (f"{run_dir}: {cfg.algo.upper()} on {cfg.env_id}, {device}; "
                  f"{storage}" + describe_networks(custom)
                  + _moved_and_resumed(cfg, resumed, progress.global_step,
                                       None if buffer is None else len(buffer), changes,
                                       set_aside, earlier, removed))
    return Run(cfg, run_dir, progress, learner, collector, plan, log,
               LoopClock(progress.global_step), first_line,
               resumed.get("staged_actor") if resumed else None)


def _plan(cfg: Config, device: torch.device, start_step: int, cpus: int | None) -> RunPlan:
    """How the run's updates and envs run (``plan_run``); an on-policy learner acts itself,
    in line (no action stream)."""
    on_policy = is_on_policy(cfg.algo)
    plan = plan_run(cfg, device, updates_ahead=_updates_ahead(cfg, start_step, on_policy),
                    cpus=cpus)
    if on_policy:
        plan = dataclasses.replace(plan, action_stream=False, insist_on_action_stream=False,
                                   acting_note=ON_POLICY_ACTING)
    return plan


def _collector(cfg: Config, envs: gym.vector.VectorEnv, observations: Any,
               learner: OffPolicyLearner | OnPolicyLearner, progress: Progress,
               nstep: NStepRows | None, *, resumed: bool) -> Collector | RolloutCollector:
    """The collector of the learner's kind, on the envs as set up (or restored)."""
    if isinstance(learner, OnPolicyLearner):
        return RolloutCollector(envs, observations, learner, progress.nonfinite,
                                seed_tallies=progress.tallies)
    collector = Collector(envs, observations, learner.buffer, progress.nonfinite,
                          seed_tallies=progress.tallies if progress.grouped else (),
                          nstep=nstep)
    buffer, algorithm = learner.buffer, learner.algorithm
    if resumed and learner.updates > 0 and len(buffer) < cfg.batch_size:
        # A trained policy resumed without a batch in its buffer acts at once, eagerly,
        # until the buffer refills one and the learner is built; nothing is captured for it.
        normalize = None if buffer.normalizer is None else buffer.normalizer.normalize
        collector.act_with(ActionPipe(acting_policy(algorithm, algorithm.actor, normalize),
                                      envs.num_envs, buffer.observation_size,
                                      envs.single_action_space, learner.device))
    return collector


def _check_networks_asked(cfg: Config, actor: NetworkSpec, critic: NetworkSpec) -> None:
    """What set-up checks before anything else, also of a Config built in Python: its
    algorithm, and network settings the networks would ignore (a run trained before that
    check resumes as it trained)."""
    check_settings(cfg)
    if not cfg.resume:
        problem = network_problem(cfg, actor=(actor or cfg.actor) is not None,
                                  critic=(critic or cfg.critic) is not None)
        if problem:
            raise ConfigError(problem)


ON_POLICY_ACTING = ("actions sampled in line by the learner"
                    " (the action stream serves off-policy learners)")


def _updates_ahead(cfg: Config, start_step: int, on_policy: bool) -> int:
    """The minibatch (on-policy) or replay (off-policy) updates the run will still make,
    which decide automatic compiling."""
    if not on_policy:
        return updates_ahead(cfg.total_timesteps, start_step, cfg.learning_starts,
                             cfg.num_envs, cfg.updates_per_step)
    rollouts = max(0, cfg.total_timesteps - start_step) // (cfg.num_envs * cfg.num_steps)
    return rollouts * cfg.update_epochs * cfg.num_minibatches


def _action_size(space: gym.Space) -> int:
    """The width of an action as the learner stores it: 1 for a Discrete one (its index)."""
    return 1 if isinstance(space, gym.spaces.Discrete) else space.shape[0]


def _rollout_words(rollout: Rollout) -> str:
    """The first line's words for the rollout storage, as ``buffer.describe()`` for a
    replay buffer."""
    seeds = f"{rollout.seeds} seeds x " if rollout.seeds > 1 else ""
    return (f"rollouts: {seeds}{rollout.num_steps} steps x {rollout.num_envs} env"
            f"{'s' if rollout.num_envs > 1 else ''} on {rollout.device}")


def _learner(cfg: Config, plan: RunPlan, observation_space: gym.spaces.Box,
             action_space: gym.Space, actor: NetworkSpec, critic: NetworkSpec
             ) -> OffPolicyLearner | OnPolicyLearner:
    """The run's learner: each seed's networks, the algorithm, the replay buffer (with the
    observation statistics of ``--obs-norm``) on the plan's device; for PPO, its rollout
    storage (with the statistics of ``--obs-norm`` and ``--reward-norm``) and the on-policy
    learner."""
    seeds, device = len(cfg.seed_list), plan.device
    observation_size, action_size = observation_space.shape[0], _action_size(action_space)
    kind = algorithm_class(cfg.algo)
    if is_on_policy(cfg.algo):
        actor_net, critic_net = make_ppo_networks(kind, cfg, cfg.seed_list, observation_space,
                                                  action_space, device, actor, critic)
        rollout = _rollout(cfg, kind.observation_form, observation_size, action_size, device)
        return OnPolicyLearner(kind(actor_net, critic_net, cfg, device=device, seeds=seeds),
                               rollout, cfg, plan)
    actor_net, critic_net = make_seed_networks(kind, cfg, cfg.seed_list, observation_space,
                                               action_space, device, actor, critic)
    normalizer = (ObservationNormalizer(seeds, observation_size, device,
                                        form=kind.observation_form)
                  if cfg.obs_norm else None)
    buffer = ReplayBuffer(cfg.buffer_size, observation_size, action_size, device, seeds=seeds,
                          normalizer=normalizer)
    algorithm = kind(actor_net, critic_net, cfg, action_size=action_size, device=device,
                     seeds=seeds)
    return OffPolicyLearner(algorithm, buffer, cfg, plan)


def _rollout(cfg: Config, form: NormalizationForm, observation_size: int, action_size: int,
             device: torch.device) -> Rollout:
    """PPO's rollout storage, with the statistics of ``--obs-norm`` (in ``form``) and
    ``--reward-norm`` where asked for."""
    seeds = len(cfg.seed_list)
    normalizer = (ObservationNormalizer(seeds, observation_size, device, form=form)
                  if cfg.obs_norm else None)
    rewards = RewardNormalizer(seeds, cfg.num_envs, cfg.gamma) if cfg.reward_norm else None
    return Rollout(cfg.num_steps, cfg.num_envs, observation_size, action_size, device,
                   seeds=seeds, normalizer=normalizer, reward_normalizer=rewards)


def _refill_note(cfg: Config, step: int, stored: int) -> str:
    """What the first line of a run resumed without its replay buffer says: that its updates
    wait until the buffer holds a batch again, and for how many steps; nothing when they would
    not have run in that time anyway (before ``learning_starts``) or the run is done."""
    # Each step stores num_envs rows per seed; a batch is batch_size rows of each seed.
    steps = -(-(cfg.batch_size - stored) // cfg.num_envs) * cfg.num_envs
    if steps <= 0 or step >= cfg.total_timesteps or step + steps <= cfg.learning_starts:
        return ""
    return (f"; the replay buffer was not saved (--save-buffer saves it): updates wait until "
            f"it holds a batch again ({steps} steps)")


def _first(network: nn.Module) -> nn.Module:
    """A network as one seed has it: a group's first seed's (what the run records)."""
    return network.member(0) if isinstance(network, SeedStack) else network
