"""The typed run configuration: every setting of a run, the checks across settings, and its
plain-value form for files and checkpoints (a value's type: fieldtypes; a value alone: values;
the seed group's rules: seedgroup; YAML files: configfile; the command line: run.flags)."""

from __future__ import annotations

import dataclasses
import difflib
import typing
import warnings
from collections.abc import Mapping
from typing import Any

from rl_graphstep.core.errors import ConfigError, type_name
from rl_graphstep.settings.fieldtypes import typed_value, user_path
from rl_graphstep.settings.seedgroup import group_problem, group_seeds
from rl_graphstep.settings.values import SWITCH_FIELDS, flag_of, value_problem


def option(default: Any, help: str, *, algos: tuple[str, ...] | None = None) -> Any:
    """A dataclass field with a default and the help text its command-line flag shows;
    ``algos``: the only algorithms that read it (None: every one), so that a run of another
    refuses it rather than ignore it (``rl_graphstep.algorithms.unread_settings_problem``)."""
    metadata = dict(helps(help))
    if algos is not None:
        metadata["algos"] = algos
    return dataclasses.field(default=default, metadata=metadata)


def helps(help: str) -> Mapping[str, str]:
    """Field metadata with the flag's help text, for fields spelled out with dataclasses.field
    (a mutable default needs `dataclasses.field(default_factory=dict, metadata=helps(...))`;
    ruff's RUF009 only knows `field` as a field specifier)."""
    return {"help": help}


def field_default(f: dataclasses.Field[Any]) -> Any:
    """The default value of a Config field, whether given directly or by a factory."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


# Who reads a setting that not every algorithm reads (see option's ``algos``).
PPO_ONLY = ("ppo",)
OFF_POLICY = ("sac", "td3", "ddpg", "crossq")
CROSSQ_ONLY = ("crossq",)
TEMPERATURE = ("sac", "crossq")  # the soft actor-critics' entropy temperature
TD3_ONLY = ("td3",)
NOISY_ACTORS = ("td3", "ddpg")  # deterministic actors, which explore with added noise
# Target networks and plain MLP critics: all but CrossQ, which has neither (its critic reads
# its own TD target and normalises by batch renormalisation).
TARGET_NETWORKS = ("sac", "td3", "ddpg")
SAC_ONLY = ("sac",)


@dataclasses.dataclass(frozen=True)
class Config:
    """Every setting of a training run; defaults follow CleanRL's sac_continuous_action.py
    (and td3_continuous_action.py for the TD3/DDPG noise settings)."""

    env_id: str = option("Pendulum-v1", "gymnasium environment id")
    algo: str = option("sac", "algorithm, a name in rl_graphstep.algorithms.ALGORITHMS")
    seed: int = option(1, "seed of python, numpy, torch and the environments (with "
                       "--num-seeds, the group's first seed)")
    num_seeds: int = option(
        1, "train this many seeds, --seed to --seed + N - 1, in one process and one update "
        "each step (1: the single run); with --seeds, the count of those"
    )
    seeds: tuple[int, ...] | None = option(
        None, "the group's seeds, e.g. 3 5 7, instead of --seed and --num-seeds"
    )
    total_timesteps: int = option(1_000_000, "environment steps of the whole run")
    device: str = option("auto", "where to train: auto (cuda if available), cpu or cuda")
    graph: str = option("auto", "captured CUDA-graph updates: auto (on with cuda), on or off")
    run_name: str | None = option(
        None, "run folder under --log-dir; None: {env_id}__{algo}__{seed}__{date_time}"
    )
    log_dir: str = option("runs", "folder that holds the tensorboard run folders")
    compile: str = option(
        "auto", "torch.compile the update steps before capture: auto (on with CUDA graphs "
        "when the run's updates would save more time than compiling takes), on or off"
    )
    num_envs: int = option(1, "parallel environments of the vector env")
    vec_env: str = option(
        "auto", "how the environments step: sync (gymnasium's SyncVectorEnv, in this "
        "process), async (its AsyncVectorEnv, one subprocess per env, through pipes), "
        "shared (worker processes polling shared memory, one per CPU but one) or auto "
        "(shared with CUDA graphs, several envs and at least 4 CPUs on x86-64, else sync)"
    )
    updates_per_step: int = option(1, "gradient updates per environment iteration",
                                   algos=OFF_POLICY)
    tf32: bool = option(
        False, "float32 matmuls on TF32 tensor cores (CUDA; a CPU run is unchanged): faster, "
        "with products rounded to a 10-bit mantissa"
    )
    action_stream: str = option(
        "auto", "with CUDA graphs, select each action on a stream of its own, beside the "
        "updates, waiting for none of them: from the actor as it was at the previous action "
        "(one round of updates behind), with the exploration noise drawn on the host; auto "
        "(on with CUDA graphs and an actor that takes host noise), on, or off (on the "
        "updates' stream, from the actor after the last update, noise drawn on the device)",
        algos=OFF_POLICY)
    buffer_size: int = option(1_000_000, "replay buffer capacity in transitions", algos=OFF_POLICY)
    batch_size: int = option(256, "rows per gradient update", algos=OFF_POLICY)
    obs_norm: bool = option(
        False, "normalise observations by each seed's running mean and std. Off-policy: "
        "(x - mean) / (std + 0.01), updated from the observations of every stored transition: "
        "the replay buffer keeps raw ones, the updates and the policy see normalised ones; for "
        "badly scaled observations (Humanoid, Ant) and many envs, as FastTD3 and FastSAC do. "
        "PPO: CleanRL's clip((x - mean) / sqrt(var + 1e-8), -10, 10), updated from every "
        "observation the envs return (resets included) before the policy acts on it; the "
        "rollout keeps normalised ones")
    gamma: float = option(0.99, "discount factor")
    n_step: int = option(
        1, "n-step returns: each stored transition sums up to N discounted rewards (fewer "
        "where the episode ends) and bootstraps N steps later; 1: one-step targets",
        algos=OFF_POLICY)
    tau: float = option(0.005, "target network Polyak averaging rate", algos=TARGET_NETWORKS)
    learning_starts: int = option(
        5000, "environment steps of random actions before learning", algos=OFF_POLICY)
    policy_lr: float = option(3e-4, "actor (and SAC temperature) learning rate", algos=OFF_POLICY)
    q_lr: float = option(1e-3, "critic learning rate", algos=OFF_POLICY)
    weight_decay: float = option(
        0.0, "decoupled weight decay of the actor's and critic's optimizers: > 0 makes them "
        "AdamW with it, for large batches and several updates per step, as FastTD3 (0.1) "
        "and FastSAC (0.001) use it; 0: Adam. The SAC temperature is never decayed",
        algos=OFF_POLICY)
    policy_frequency: int = option(
        2, "critic updates per actor update (delayed actor; TD3's policy delay)",
        algos=OFF_POLICY)
    target_network_frequency: int = option(
        1, "critic updates per target network update (SAC; TD3 and DDPG move their targets "
        "with each delayed actor update, every --policy-frequency)",
        algos=SAC_ONLY)
    alpha: float = option(0.2, "initial entropy temperature (SAC, CrossQ)", algos=TEMPERATURE)
    autotune: bool = option(
        True, "learn the temperature towards the target entropy (SAC, CrossQ)",
        algos=TEMPERATURE)
    policy_noise: float = option(
        0.2, "TD3 target policy smoothing noise std, in [-1, 1] action units", algos=TD3_ONLY)
    noise_clip: float = option(
        0.5, "TD3 clip of the target policy smoothing noise, [-1, 1] units", algos=TD3_ONLY)
    exploration_noise: float = option(
        0.1, "TD3/DDPG Gaussian exploration noise std, in [-1, 1] action units",
        algos=NOISY_ACTORS)
    hidden_sizes: tuple[int, ...] = option((256, 256), "hidden layer widths of actor and critic")
    layer_norm: bool = option(
        False, "a LayerNorm after each hidden layer of the built-in actor and critic, before "
        "its ReLU: for large batches (thousands of rows) and several updates per step, where "
        "FastSAC uses it to keep the critic from growing unstable; off: plain MLPs, as "
        "CleanRL's. Not for custom --actor/--critic",
        algos=TARGET_NETWORKS)
    critic_atoms: int = option(
        0, "a distributional (C51) critic: each member's value is a categorical distribution "
        "over this many atoms spread evenly on [--v-min, --v-max], trained by cross-entropy "
        "towards the projected target distribution, as FastTD3 and FastSAC do (51 as in C51, "
        "101 there); 0: the scalar critic trained by mean squared error",
        algos=TARGET_NETWORKS)
    v_min: float | None = option(
        None, "with --critic-atoms, the lowest value of the critic's support: below the "
        "lowest return to expect (|Q| is at most about max|r| / (1 - gamma))",
        algos=TARGET_NETWORKS)
    v_max: float | None = option(
        None, "with --critic-atoms, the highest value of the critic's support: above the "
        "highest return to expect",
        algos=TARGET_NETWORKS)
    actor: str | None = option(
        None, "custom actor class, package.module:ClassName or path/to/file.py:ClassName"
    )
    critic: str | None = option(
        None, "custom critic class, package.module:ClassName or path/to/file.py:ClassName"
    )
    actor_kwargs: dict[str, Any] = dataclasses.field(
        default_factory=dict,
        metadata=helps("keyword arguments of a custom --actor's constructor, a YAML/JSON mapping"),
    )
    critic_kwargs: dict[str, Any] = dataclasses.field(
        default_factory=dict,
        metadata=helps("keyword arguments of a custom --critic's constructor, a YAML/JSON mapping"),
    )
    critic_max_grad_norm: float = option(100.0, "critic gradient-norm clip", algos=OFF_POLICY)
    actor_max_grad_norm: float = option(100.0, "actor gradient-norm clip", algos=OFF_POLICY)
    log_interval: int = option(1000, "environment steps between tensorboard writes")
    progress: bool = option(
        True, "show progress: a bar on a terminal, else a line at most every 10 s (off: only "
        "the first lines and the last)"
    )
    checkpoint_every: int = option(
        50_000, "environment steps between checkpoints (one is always written at the end)"
    )
    keep_checkpoints: int = option(3, "how many of the newest checkpoints to keep")
    save_buffer: bool = option(
        False, "include the replay buffer in checkpoints (exact resume)", algos=OFF_POLICY)
    resume: str | None = option(
        None, "continue the run in this folder (runs/<run>) from its latest checkpoint"
    )
    nonfinite_limit: int = option(
        1000, "stop after this many consecutive updates skipped for non-finite values"
    )
    # PPO (CleanRL's ppo_continuous_action.py names and defaults): read by PPO alone, and
    # refused, not ignored, by a run of another algorithm.
    learning_rate: float = option(3e-4, "PPO: the actor's and critic's learning rate",
                                  algos=PPO_ONLY)
    anneal_lr: bool = option(
        True, "PPO: anneal the learning rate linearly to 0 over the run's rollouts",
        algos=PPO_ONLY)
    num_steps: int = option(2048, "PPO: steps of each env per rollout", algos=PPO_ONLY)
    gae_lambda: float = option(0.95, "PPO: the lambda of generalised advantage estimation",
                               algos=PPO_ONLY)
    num_minibatches: int = option(
        32, "PPO: minibatches per epoch; must divide --num-envs x --num-steps", algos=PPO_ONLY)
    update_epochs: int = option(10, "PPO: epochs of minibatch updates per rollout",
                                algos=PPO_ONLY)
    norm_adv: bool = option(True, "PPO: normalise the advantages of each minibatch",
                            algos=PPO_ONLY)
    clip_coef: float = option(0.2, "PPO: the surrogate (and value) clipping coefficient",
                              algos=PPO_ONLY)
    clip_vloss: bool = option(True, "PPO: clip the value loss around the rollout's values",
                              algos=PPO_ONLY)
    ent_coef: float = option(0.0, "PPO: coefficient of the entropy bonus", algos=PPO_ONLY)
    vf_coef: float = option(0.5, "PPO: coefficient of the value loss", algos=PPO_ONLY)
    max_grad_norm: float = option(0.5, "PPO: gradient-norm clip, one norm over the actor's "
                                  "and the critic's gradients (CleanRL's)", algos=PPO_ONLY)
    target_kl: float | None = option(
        None, "PPO: stop a rollout's epochs once an epoch ends with approx_kl above this "
        "(per seed); None: always run every epoch", algos=PPO_ONLY)
    reward_norm: bool = option(
        False, "PPO: scale each reward by the running std of its env's discounted return "
        "(CleanRL's NormalizeReward, one variance per seed pooling its envs), clipped to "
        "+-10, before it enters the rollout; the logged episode returns stay the env's",
        algos=PPO_ONLY)
    # CrossQ (the original implementation's names where it has them): read by CrossQ alone.
    critic_hidden_sizes: tuple[int, ...] | None = option(
        None, "CrossQ: hidden layer widths of the critic (the paper's are 2048 wide); None: "
        "--hidden-sizes", algos=CROSSQ_ONLY)
    batch_renorm_momentum: float = option(
        0.01, "CrossQ: how far each training call moves batch renormalisation's running "
        "statistics towards the batch's (Flax's decay 0.99)", algos=CROSSQ_ONLY)
    batch_renorm_warmup: int = option(
        100_000, "CrossQ: training calls of each batch renormalisation layer that are plain "
        "batch normalisation, before its corrections start", algos=CROSSQ_ONLY)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            # Direct construction gets the same type checks as YAML (and lists become tuples,
            # so a Config stays hashable); frozen, hence object.__setattr__.
            object.__setattr__(self, f.name, _coerce(f.name, getattr(self, f.name)))
            problem = value_problem(f.name, getattr(self, f.name))
            if problem:
                raise ConfigError(f"{flag_of(f.name)} {problem}")
        if self.seeds is not None and self.num_seeds == 1:
            # num_seeds is always the group's size K, however the seeds were given.
            object.__setattr__(self, "num_seeds", len(self.seeds))
        problem = group_problem(self.seed, self.num_seeds, self.seeds)
        if problem:
            raise ConfigError(problem)
        if self.autotune and self.alpha == 0:
            raise ConfigError("--alpha must be > 0 with --autotune (it starts log(alpha)), got 0.0")
        problem = _learning_problem(self) or _support_problem(self)
        if problem:
            raise ConfigError(problem)

    @property
    def seed_list(self) -> tuple[int, ...]:
        """The seeds of the run, one for a single run: ``--seeds`` as given, else ``--seed``
        to ``--seed + --num-seeds - 1``. Their count is ``num_seeds``."""
        return group_seeds(self.seed, self.num_seeds, self.seeds)

    def __hash__(self) -> int:
        # The generated hash would fail on the kwargs dicts; hash a frozen copy of every value.
        return hash(tuple(_freeze(getattr(self, f.name)) for f in dataclasses.fields(self)))


def _learning_problem(cfg: Config) -> str | None:
    """Why a run of ``cfg`` would end without a single update (and save untrained networks),
    or None. Updates start once more than ``learning_starts`` steps are taken and the buffer
    holds a batch. PPO has neither (``algorithms.ppo.check_ppo_config`` checks its rollout)."""
    if cfg.algo not in OFF_POLICY:
        return None
    if cfg.batch_size > cfg.buffer_size:
        return (f"--batch-size {cfg.batch_size} is above --buffer-size {cfg.buffer_size}: the "
                "replay buffer could never hold one batch, so no update would run; lower "
                "--batch-size or raise --buffer-size")
    if cfg.learning_starts >= cfg.total_timesteps:
        return (f"--learning-starts {cfg.learning_starts} is not below --total-timesteps "
                f"{cfg.total_timesteps}: the run would end before its first update; lower "
                "--learning-starts or raise --total-timesteps")
    if cfg.batch_size >= cfg.total_timesteps:
        return (f"--batch-size {cfg.batch_size} is not below --total-timesteps "
                f"{cfg.total_timesteps}: the run would end before the replay buffer holds one "
                "batch, so no update would run; lower --batch-size or raise --total-timesteps")
    return None


def _support_problem(cfg: Config) -> str | None:
    """Why ``cfg``'s distributional critic settings do not make a support, or None: atoms
    need both bounds, lowest first, and bounds need atoms."""
    bounds = [flag_of(name) for name in ("v_min", "v_max") if getattr(cfg, name) is not None]
    if not cfg.critic_atoms:
        if bounds:
            named = " and ".join(bounds)
            what = "are the bounds" if len(bounds) == 2 else "is a bound"
            return (f"{named} {what} of a distributional critic's support, but --critic-atoms "
                    f"is 0 (the scalar critic); give --critic-atoms 51 (or 101) too, or drop "
                    f"{named}")
        return None
    # The scale to suggest: the largest |Q| of rewards of 1, discounted by gamma.
    scale = (f"|Q| is at most about max|r| / (1 - gamma) = max|r| x {1 / (1 - cfg.gamma):g}"
             if cfg.gamma < 1 else "|Q| is at most about the largest episode return")
    if len(bounds) < 2:
        return (f"--critic-atoms {cfg.critic_atoms} needs the support's bounds --v-min and "
                f"--v-max (e.g. --v-min -1700 --v-max 0 for Pendulum-v1; {scale})")
    assert cfg.v_min is not None and cfg.v_max is not None
    if not cfg.v_min < cfg.v_max:
        return (f"--v-min {cfg.v_min:g} must be below --v-max {cfg.v_max:g}: they are the "
                f"lowest and highest values of the critic's support ({scale})")
    return None


FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(Config)}
# Resolved annotations (the module uses postponed evaluation, so f.type is a string).
FIELD_TYPES: dict[str, Any] = typing.get_type_hints(Config)

# Settings that left Config -> the line a flag or YAML key naming one gets instead (each was a
# boolean flag, so its --no- form too). {old} is the name as the user wrote it; any other
# {field} names today's setting, as a flag on the command line and as a key in a file.
REMOVED: dict[str, str] = {
    "async_envs": "{old} was replaced by {vec_env} async ({vec_env} auto is the default)",
    "env_worker": "{old} was removed: it never measured faster than the default; use "
                  "{vec_env} async to step the environments in subprocesses",
    "overlap": "{old} was removed: the loop always steps the environments while the GPU "
               "updates",
}


class _Spelling(dict[str, str]):
    """``str.format_map`` names: ``old`` as given, every other key a setting's flag or key."""

    def __init__(self, old: str, *, as_flag: bool) -> None:
        super().__init__(old=old)
        self.as_flag = as_flag

    def __missing__(self, name: str) -> str:
        return flag_of(name) if self.as_flag else f"{name}:"


def removed_flags() -> dict[str, str]:
    """Every command-line spelling of a removed setting -> its line."""
    return {flag: message.format_map(_Spelling(flag, as_flag=True))
            for name, message in REMOVED.items()
            for flag in (flag_of(name), "--no-" + flag_of(name)[2:])}


def _removed_key(name: str, source: str) -> str:
    return REMOVED[name].format_map(_Spelling(f"config key {name!r} in {source}", as_flag=False))

def _freeze(value: Any) -> Any:
    """A hashable stand-in for a (nested) YAML value: lists become tuples and dicts frozensets
    of their items (equal dicts in another key order must hash alike)."""
    if isinstance(value, Mapping):
        return frozenset((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(_freeze(v) for v in value)
    return value


def unused_kwargs_problem(cfg: Config, *, actor: bool, critic: bool) -> str | None:
    """Why ``cfg``'s network keyword arguments would be ignored, or None: the default actor
    or critic takes none (its widths are ``--hidden-sizes``). ``actor``/``critic``: whether a
    custom one is built (given to ``train`` or named by ``cfg``)."""
    for role, custom in (("actor", actor), ("critic", critic)):
        kwargs = getattr(cfg, f"{role}_kwargs")
        if kwargs and not custom:
            flag = flag_of(f"{role}_kwargs")
            return (f"{flag} {kwargs} is given for the default {role}, which takes no keyword "
                    f"arguments (its widths are --hidden-sizes); give {flag_of(role)} "
                    f"package.module:ClassName too, or drop {flag}")
    return None


def layer_norm_problem(cfg: Config, *, actor: bool, critic: bool) -> str | None:
    """Why ``cfg``'s ``--layer-norm`` would not do what it says, or None: it puts LayerNorm
    into the built-in networks, and a custom one builds its own layers. ``actor``/``critic``:
    whether a custom one is built (given to ``train`` or named by ``cfg``)."""
    custom = [flag_of(role) for role, given in (("actor", actor), ("critic", critic)) if given]
    if not cfg.layer_norm or not custom:
        return None
    which = " and ".join(custom)
    return (f"--layer-norm is for the built-in networks, but {which} "
            f"{'is a custom one' if len(custom) == 1 else 'are custom ones'}, whose layers "
            f"are its own: put LayerNorm into the custom network, or drop --layer-norm")


def network_problem(cfg: Config, *, actor: bool, critic: bool) -> str | None:
    """Why ``cfg``'s network settings would be ignored: :func:`unused_kwargs_problem` or
    :func:`layer_norm_problem`."""
    return (unused_kwargs_problem(cfg, actor=actor, critic=critic)
            or layer_norm_problem(cfg, actor=actor, critic=critic))


# Fields that name a folder or file: a leading ~ is the user's home (see user_path).
_PATHS = ("log_dir", "resume")


def _coerce(name: str, value: Any) -> Any:
    """Convert one YAML/dict value to the field's type; ConfigError names what was expected."""
    value = typed_value(name, FIELD_TYPES[name], value, switch=name in SWITCH_FIELDS)
    if name in _PATHS and isinstance(value, str) and value.startswith("~"):
        value = str(user_path(value))
    return value


def coerce_mapping(data: Mapping[Any, Any], source: str) -> dict[str, Any]:
    """Check keys, types and values of a partial config mapping; `source` names it in errors."""
    out: dict[str, Any] = {}
    for key, raw in data.items():
        if key in REMOVED:
            raise ConfigError(_removed_key(key, source))
        if key not in FIELDS:
            close = difflib.get_close_matches(str(key), FIELDS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(
                f"unknown config key {key!r} in {source}{hint}; valid keys: {', '.join(FIELDS)}"
            )
        try:
            value = _coerce(key, raw)
        except ConfigError as err:
            raise ConfigError(f"{err} in {source}") from None
        problem = value_problem(key, value)
        if problem:
            raise ConfigError(f"{key} {problem} in {source}")
        out[key] = value
    return out


def config_from_dict(data: Mapping[str, Any], source: str = "the config mapping") -> Config:
    """Build a Config from a (partial) mapping of field names; missing keys keep defaults."""
    if not isinstance(data, Mapping):
        raise TypeError("config_from_dict() takes a mapping of settings such as "
                        f"{{'batch_size': 64}}, got {type_name(data)}")
    return Config(**coerce_mapping(data, source))


def saved_config_values(saved: Mapping[str, Any], *, resuming: bool = False) -> dict[str, Any]:
    """A checkpoint's saved config in today's fields. Runs from before --vec-env saved
    ``async_envs`` (true is ``vec_env: async``), ``env_worker`` and ``overlap`` (dropped: the
    envs step in this process, beside the updates). ``resuming``: say so where the run was
    stepped by the env worker."""
    values = {key: value for key, value in saved.items() if key not in REMOVED}
    if "vec_env" not in saved:
        # Such a run stepped its envs in the process (sync) or in subprocesses (async).
        values["vec_env"] = "async" if saved.get("async_envs") is True else "sync"
    if resuming and saved.get("env_worker") is True:
        warnings.warn("this run stepped its environments in the env worker, which was removed; "
                      "they now step in this process (--vec-env sync)", stacklevel=3)
    return values


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain YAML/JSON-safe values (tuples become lists, also inside the kwargs dicts);
    config_from_dict round-trips it."""
    return {k: plain_value(v) for k, v in dataclasses.asdict(cfg).items()}


def plain_value(value: Any) -> Any:
    """A value as YAML/JSON holds it: tuples become lists, also inside mappings."""
    if isinstance(value, Mapping):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    return value
