"""The typed run configuration: dataclass defaults < the env's default YAML < --config < flags."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.resources
import json
import math
import typing
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rl_graphstep.algorithms import ALGORITHMS
from rl_graphstep.cli import OneLineParser
from rl_graphstep.errors import ConfigError

if TYPE_CHECKING:  # importlib.resources.abc is Python 3.11+; the package supports 3.10
    from importlib.resources.abc import Traversable

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
# The values of every on/off setting that can also be left to the machine.
SWITCH_MODES: tuple[str, ...] = ("auto", "on", "off")
VEC_ENVS: tuple[str, ...] = ("sync", "async")

# Env-id base names (before "-vN") that share the MuJoCo default hyperparameters.
MUJOCO_ENVS: frozenset[str] = frozenset(
    {
        "Ant",
        "HalfCheetah",
        "Hopper",
        "Humanoid",
        "HumanoidStandup",
        "InvertedDoublePendulum",
        "InvertedPendulum",
        "Pusher",
        "Reacher",
        "Swimmer",
        "Walker2d",
    }
)


def option(default: Any, help: str) -> Any:
    """A dataclass field with a default and the help text its command-line flag shows."""
    return dataclasses.field(default=default, metadata=helps(help))


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


@dataclasses.dataclass(frozen=True)
class Config:
    """Every setting of a training run; defaults follow CleanRL's sac_continuous_action.py
    (and td3_continuous_action.py for the TD3/DDPG noise settings)."""

    env_id: str = option("Pendulum-v1", "gymnasium environment id")
    algo: str = option("sac", f"algorithm, one of {', '.join(ALGORITHMS)}")
    seed: int = option(1, "seed of python, numpy, torch and the environments")
    total_timesteps: int = option(1_000_000, "environment steps of the whole run")
    device: str = option("auto", "where to train: auto (cuda if available), cpu or cuda")
    graph: str = option("auto", "captured CUDA-graph updates: auto (on with cuda), on or off")
    run_name: str | None = option(
        None, "run folder under --log-dir; None: {env_id}__{algo}__{seed}__{unix time}"
    )
    log_dir: str = option("runs", "folder that holds the tensorboard run folders")
    compile: str = option(
        "auto", "torch.compile the update steps before capture: auto (on with cuda), on or off"
    )
    num_envs: int = option(1, "parallel environments of the vector env")
    vec_env: str = option(
        "sync", "how the --num-envs environments step: sync (gymnasium's SyncVectorEnv, in "
        "this process) or async (its AsyncVectorEnv, one subprocess per env)"
    )
    updates_per_step: int = option(1, "gradient updates per environment iteration")
    tf32: bool = option(
        False, "float32 matmuls on TF32 tensor cores (CUDA): faster, with products rounded "
        "to a 10-bit mantissa"
    )
    action_stream: str = option(
        "auto", "with CUDA graphs, select each action on a stream of its own, beside the "
        "updates, waiting for none of them: from the actor as it was at the previous action "
        "(one round of updates behind), with the exploration noise drawn on the host; auto "
        "(on with CUDA graphs and an actor that takes host noise), on, or off (on the "
        "updates' stream, from the actor after the last update, noise drawn on the device)"
    )
    buffer_size: int = option(1_000_000, "replay buffer capacity in transitions")
    batch_size: int = option(256, "rows per gradient update")
    gamma: float = option(0.99, "discount factor")
    tau: float = option(0.005, "target network Polyak averaging rate")
    learning_starts: int = option(5000, "environment steps of random actions before learning")
    policy_lr: float = option(3e-4, "actor (and SAC temperature) learning rate")
    q_lr: float = option(1e-3, "critic learning rate")
    policy_frequency: int = option(
        2, "critic updates per actor update (delayed actor; TD3's policy delay)"
    )
    target_network_frequency: int = option(
        1, "critic updates per target network update (SAC; TD3 and DDPG move their targets "
        "with each delayed actor update, every --policy-frequency)"
    )
    alpha: float = option(0.2, "initial entropy temperature (SAC)")
    autotune: bool = option(True, "learn the temperature towards the target entropy (SAC)")
    policy_noise: float = option(
        0.2, "TD3 target policy smoothing noise std, in [-1, 1] action units"
    )
    noise_clip: float = option(0.5, "TD3 clip of the target policy smoothing noise, [-1, 1] units")
    exploration_noise: float = option(
        0.1, "TD3/DDPG Gaussian exploration noise std, in [-1, 1] action units"
    )
    hidden_sizes: tuple[int, ...] = option((256, 256), "hidden layer widths of actor and critic")
    actor: str | None = option(
        None, "custom actor class, package.module:ClassName or path/to/file.py:ClassName"
    )
    critic: str | None = option(
        None, "custom critic class, package.module:ClassName or path/to/file.py:ClassName"
    )
    actor_kwargs: dict[str, Any] = dataclasses.field(
        default_factory=dict,
        metadata=helps("keyword arguments of the actor constructor, a YAML/JSON mapping"),
    )
    critic_kwargs: dict[str, Any] = dataclasses.field(
        default_factory=dict,
        metadata=helps("keyword arguments of the critic constructor, a YAML/JSON mapping"),
    )
    critic_max_grad_norm: float = option(100.0, "critic gradient-norm clip")
    actor_max_grad_norm: float = option(100.0, "actor gradient-norm clip")
    log_interval: int = option(1000, "environment steps between tensorboard writes")
    progress: bool = option(
        True, "show progress: a bar on a terminal, else a line at most every 10 s (off: only "
        "the first lines and the last)"
    )
    checkpoint_every: int = option(
        50_000, "environment steps between checkpoints (one is always written at the end)"
    )
    keep_checkpoints: int = option(3, "how many of the newest checkpoints to keep")
    save_buffer: bool = option(False, "include the replay buffer in checkpoints (exact resume)")
    resume: str | None = option(
        None, "continue the run in this folder (runs/<run>) from its latest checkpoint"
    )
    nonfinite_limit: int = option(
        1000, "stop after this many consecutive updates skipped for non-finite values"
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            # Direct construction gets the same type checks as YAML (and lists become tuples,
            # so a Config stays hashable); frozen, hence object.__setattr__.
            object.__setattr__(self, f.name, _coerce(f.name, getattr(self, f.name)))
            problem = _value_problem(f.name, getattr(self, f.name))
            if problem:
                raise ConfigError(f"{_flag(f.name)} {problem}")
        if self.autotune and self.alpha == 0:
            raise ConfigError("--alpha must be > 0 with --autotune (it starts log(alpha)), got 0.0")
        problem = _learning_problem(self)
        if problem:
            raise ConfigError(problem)

    def __hash__(self) -> int:
        # The generated hash would fail on the kwargs dicts; hash a frozen copy of every value.
        return hash(tuple(_freeze(getattr(self, f.name)) for f in dataclasses.fields(self)))


def _learning_problem(cfg: Config) -> str | None:
    """Why a run of ``cfg`` would end without a single update (and save untrained networks),
    or None. Updates start once more than ``learning_starts`` steps are taken and the buffer
    holds a batch."""
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


FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(Config)}
# Resolved annotations (the module uses postponed evaluation, so f.type is a string).
_TYPES: dict[str, Any] = typing.get_type_hints(Config)

# Settings that left Config -> the line a flag or YAML key naming one gets instead (each was a
# boolean flag, so its --no- form too). {old} is the name as the user wrote it; any other
# {field} names today's setting, as a flag on the command line and as a key in a file.
REMOVED: dict[str, str] = {
    "async_envs": "{old} was replaced by {vec_env} async ({vec_env} sync is the default)",
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
        return _flag(name) if self.as_flag else f"{name}:"


def removed_flags() -> dict[str, str]:
    """Every command-line spelling of a removed setting -> its line."""
    return {flag: message.format_map(_Spelling(flag, as_flag=True))
            for name, message in REMOVED.items()
            for flag in (_flag(name), "--no-" + _flag(name)[2:])}


def _removed_key(name: str, source: str) -> str:
    return REMOVED[name].format_map(_Spelling(f"config key {name!r} in {source}", as_flag=False))

_POSITIVE_INTS = (
    "total_timesteps",
    "num_envs",
    "updates_per_step",
    "buffer_size",
    "batch_size",
    "policy_frequency",
    "target_network_frequency",
    "log_interval",
    "checkpoint_every",
    "keep_checkpoints",
    "nonfinite_limit",
)
_CHOICES: dict[str, tuple[str, ...]] = {
    "algo": tuple(ALGORITHMS), "device": DEVICES, "vec_env": VEC_ENVS, "graph": SWITCH_MODES,
    "compile": SWITCH_MODES, "action_stream": SWITCH_MODES,
}
# The auto/on/off settings: YAML 1.1 reads a bare on/off as true/false, and configs saved
# before --action-stream had an auto value hold a bool there; both mean on/off.
_SWITCHES = tuple(name for name, choices in _CHOICES.items() if choices is SWITCH_MODES)


_NOISES = ("policy_noise", "noise_clip", "exploration_noise")
_KWARGS = ("actor_kwargs", "critic_kwargs")
_SPEC_FORMS = "package.module:ClassName or path/to/file.py:ClassName"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


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


def _spec_problem(value: str) -> str | None:
    """Only the `something:ClassName` shape is checked here; importing happens at build time."""
    where, colon, name = value.rpartition(":")
    if not colon:
        return f"must be {_SPEC_FORMS}, got {value!r} (no ':')"
    # A dotted name is a class's __qualname__ (Outer.Inner), as runs record classes passed
    # from Python; "<locals>" ones are refused with their reason when loaded.
    parts = name.split(".")
    if not where.strip() or not all(p.isidentifier() or p == "<locals>" for p in parts):
        return f"must be {_SPEC_FORMS}, got {value!r}"
    return None


# numpy's legacy global seeding (np.random.seed) takes [0, 2**32 - 1]; torch sizes and
# counts are int64.
SEED_MAX = 2**32 - 1
INT_MAX = 2**63 - 1
# More environments than this is a typo: each is an object (or a process) of its own.
MAX_NUM_ENVS = 4096
_STRINGS = ("env_id", "log_dir", "run_name", "resume", "actor", "critic")


def _limit_problem(name: str, value: Any) -> str | None:
    """Values that pass the field's own check but that numpy, torch or the file system
    cannot take: seeds and counts out of range, infinite rates, unusable names."""
    if name == "seed" and value > SEED_MAX:
        return f"must be at most {SEED_MAX} (2**32 - 1, numpy's seed range), got {value}"
    if name in (*_POSITIVE_INTS, "learning_starts") and value > INT_MAX:
        return f"must be at most {INT_MAX} (2**63 - 1), got {value}"
    if name == "num_envs" and value > MAX_NUM_ENVS:
        return f"must be at most {MAX_NUM_ENVS}, got {value}"
    if name in ("policy_lr", "q_lr") and not math.isfinite(value):
        return f"must be a finite number > 0, got {value!r}"
    if name in _STRINGS and isinstance(value, str):
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            return f"must not contain control characters such as NUL or a newline, got {value!r}"
        if name == "resume" and not value.strip():
            return "must not be empty: give a run folder or a checkpoint file"
        if name == "run_name" and ("/" in value or "\\" in value or value in (".", "..")):
            return f"must be one folder name (no / or \\, not . or ..), got {value!r}"
    return None


def _value_problem(name: str, value: Any) -> str | None:
    """What is wrong with one (already well-typed) value, or None when it is fine."""
    if name in _CHOICES and value not in _CHOICES[name]:
        return f"must be one of {', '.join(_CHOICES[name])}, got {value!r}"
    if name in _POSITIVE_INTS and value <= 0:
        return f"must be a positive int, got {value!r}"
    if name in ("seed", "learning_starts") and value < 0:
        return f"must be >= 0, got {value!r}"
    if name == "tau" and not 0 < value <= 1:
        return f"must be in (0, 1], got {value!r}"
    if name == "gamma" and not 0 <= value <= 1:
        return f"must be in [0, 1], got {value!r}"
    if name in ("policy_lr", "q_lr", "critic_max_grad_norm", "actor_max_grad_norm") and not (
        value > 0
    ):
        return f"must be > 0, got {value!r}"
    if name == "alpha" and not (value >= 0 and math.isfinite(value)):
        return f"must be a finite number >= 0, got {value!r}"
    if name == "hidden_sizes" and (not value or any(w <= 0 for w in value)):
        return f"must be one or more positive ints, got {list(value)!r}"
    if name in _NOISES and not (value >= 0 and math.isfinite(value)):
        return f"must be a finite number >= 0, got {value!r}"
    if name in ("actor", "critic") and value is not None:
        return _spec_problem(value)
    if name in ("env_id", "log_dir", "run_name") and value == "":
        return "must not be empty"
    return _limit_problem(name, value)


# ----------------------------------------------------------------------------- typed values


def _as_int(value: Any) -> int:
    # bool is an int subclass, but `batch_size: true` is a mistake, not 1.
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int):
        return value
    # PyYAML follows YAML 1.1, where 1e6 is a string and 1.0e+6 a float: accept both when whole.
    number = float(value) if isinstance(value, (str, float)) else math.nan
    if not number.is_integer():
        raise TypeError
    return int(number)


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string
        return float(value)
    raise TypeError


def _coerce(name: str, value: Any) -> Any:
    """Convert one YAML/dict value to the field's type; ConfigError names what was expected."""
    kind = _TYPES[name]
    expected = {int: "an int", float: "a number", bool: "true or false", str: "a string"}
    try:
        if kind is int:
            return _as_int(value)
        if kind is float:
            return _as_float(value)
        if kind is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if name in _SWITCHES and isinstance(value, bool):
            return "on" if value else "off"
        if kind in (str, str | None):
            if value is None and kind is not str:
                return None
            if not isinstance(value, str):
                raise TypeError
            return value
        if kind == dict[str, Any]:
            # A copy, so later changes to the caller's dict do not reach the frozen Config.
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise TypeError
            return dict(value)
        # tuple[int, ...]
        if not isinstance(value, (list, tuple)):
            raise TypeError
        return tuple(_as_int(v) for v in value)
    except (TypeError, ValueError):
        if kind == dict[str, Any]:
            what = "a mapping of keyword arguments (string keys), e.g. {width: 128}"
        else:
            fallback = "a string or null" if kind == str | None else "a list of ints"
            what = expected.get(kind, fallback)
        raise ConfigError(f"{name} must be {what}, got {value!r}") from None


def _coerce_mapping(data: Mapping[Any, Any], source: str) -> dict[str, Any]:
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
        problem = _value_problem(key, value)
        if problem:
            raise ConfigError(f"{key} {problem} in {source}")
        out[key] = value
    return out


def config_from_dict(data: Mapping[str, Any], source: str = "the config mapping") -> Config:
    """Build a Config from a (partial) mapping of field names; missing keys keep defaults."""
    return Config(**_coerce_mapping(data, source))


def saved_config_values(saved: Mapping[str, Any], *, resuming: bool = False) -> dict[str, Any]:
    """A checkpoint's saved config in today's fields. Runs from before --vec-env saved
    ``async_envs`` (true is ``vec_env: async``), ``env_worker`` and ``overlap`` (dropped: the
    envs step in this process, beside the updates). ``resuming``: say so where the run was
    stepped by the env worker."""
    values = {key: value for key, value in saved.items() if key not in REMOVED}
    if saved.get("async_envs") is True:
        values.setdefault("vec_env", "async")
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


def to_markdown_table(cfg: Config) -> str:
    """A `| key | value |` table of every field, for tensorboard's text panel."""
    rows = [f"| {k} | {_cell(v)} |" for k, v in config_to_dict(cfg).items()]
    return "\n".join(["| key | value |", "|---|---|", *rows])


def _cell(value: Any) -> str:
    # Mappings as JSON, the form --actor-kwargs takes; a bare "|" would end the cell early.
    text = json.dumps(value, default=str) if isinstance(value, dict) else str(value)
    return text.replace("|", "\\|")


# ----------------------------------------------------------------------------- YAML files


def default_config_file(env_id: str, algo: str = "sac") -> Traversable | None:
    """The shipped `configs/{algo}_{family}.yaml` tuned for env_id's family, or None (also for
    an unknown algo, which Config then reports)."""
    base = env_id.rsplit("/", 1)[-1].split("-v")[0]
    family = "pendulum" if base == "Pendulum" else "mujoco" if base in MUJOCO_ENVS else None
    if family is None or algo not in ALGORITHMS:
        return None
    path = _configs_dir() / f"{algo}_{family}.yaml"
    return path if path.is_file() else None


def _configs_dir() -> Traversable:
    """The shipped configs: package data when installed, the checkout's `configs/` when the
    package runs straight from a source tree (not installed)."""
    try:
        return importlib.resources.files("rl_graphstep.configs")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "configs"


def read_config_file(path: Path | Traversable | str) -> dict[str, Any]:
    """Read, type-check and value-check one YAML config file (a partial mapping of fields)."""
    path = Path(path) if isinstance(path, str) else path
    name = str(path)
    if not path.is_file():
        what = "is not a file" if isinstance(path, Path) and path.exists() else "does not exist"
        raise ConfigError(f"config file {name!r} {what}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file {name!r} is not valid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {name!r} cannot be read: {err}") from None
    if data is None:  # an empty file (or only comments) changes nothing
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {name!r} must be a mapping of key: value lines, "
            f"got a YAML {type(data).__name__}"
        )
    return _coerce_mapping(data, name)


# ----------------------------------------------------------------------------- command line


def build_parser(shown: ShownDefaults | None = None) -> argparse.ArgumentParser:
    """One --kebab-case flag per Config field; flags not given stay absent from the namespace.
    ``shown``: the defaults the help texts give (the built-in ones when None)."""
    # Mistakes raise one ConfigError line; no abbreviations (--learning is no --learning-starts).
    parser = OneLineParser(
        prog="python -m rl_graphstep.train",
        description="Train an off-policy actor-critic agent with CUDA-graph-captured updates."
        + (f" {shown.note}" if shown else ""),
        epilog=(
            "Precedence: built-in defaults < the shipped YAML for --algo and the env "
            "(configs/{algo}_pendulum.yaml for Pendulum-v1, configs/{algo}_mujoco.yaml for "
            "MuJoCo envs; only without --config) < --config FILE < flags given here."
        ),
        argument_default=argparse.SUPPRESS,
        removed=removed_flags(),
    )
    parser.add_argument(
        "--config", metavar="FILE", help="YAML file of field: value overrides (keys as below)"
    )
    for name, f in FIELDS.items():
        kind = _TYPES[name]
        help_text = f"{f.metadata['help']} ({_default_text(name, shown)})"
        flags = [_flag(name), "--env"] if name == "env_id" else [_flag(name)]
        if kind is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, help=help_text)
        elif kind == tuple[int, ...]:
            parser.add_argument(*flags, type=int, nargs="+", metavar="N", help=help_text)
        elif name in _KWARGS:
            # Parsed by load_config, so a bad mapping is a ConfigError like one from YAML.
            parser.add_argument(*flags, type=str, metavar="YAML", help=help_text)
        elif name in _SWITCHES:
            # --graph alone means on and --no-graph off (so --action-stream and
            # --no-action-stream, a bool flag once, keep their meaning).
            parser.add_argument(*flags, type=str, nargs="?", const="on",
                                metavar="{" + ",".join(SWITCH_MODES) + "}", help=help_text)
            parser.add_argument("--no-" + _flag(name)[2:], dest=name, action="store_const",
                                const="off", help=f"the same as {_flag(name)} off")
        elif name in _CHOICES:
            # Choices are validated by Config, so flags and YAML share one error message.
            metavar = "{" + ",".join(_CHOICES[name]) + "}"
            parser.add_argument(*flags, type=str, metavar=metavar, help=help_text)
        else:
            scalar = kind if kind in (int, float) else str
            metavar = {int: "INT", float: "FLOAT"}.get(kind, "STR")
            metavar = {"env_id": "ID", "actor": "SPEC", "critic": "SPEC"}.get(name, metavar)
            parser.add_argument(*flags, type=scalar, metavar=metavar, help=help_text)
    return parser


@dataclasses.dataclass(frozen=True)
class ShownDefaults:
    """What --help gives as the defaults: the values of the YAML file that will apply (named
    by ``source``) over the built-in ones, and a note on where they come from."""

    values: Mapping[str, Any]
    source: str | None
    note: str


class _PeekFailed(Exception):
    pass


class _PeekParser(argparse.ArgumentParser):
    """Raises instead of exiting: a bad command line is the full parser's to report."""

    def error(self, message: str) -> typing.NoReturn:
        raise _PeekFailed(message)


def help_defaults(argv: Sequence[str] | None) -> ShownDefaults | None:
    """With --help, the defaults that apply for the --env, --algo and --config given beside
    it (argparse prints the help while parsing, so they are peeked at first); None without
    --help, so that parsing a command line reads no file."""
    seen = _peek(argv)
    if seen is None or not seen.help:
        return None
    if seen.resume is not None:
        return ShownDefaults({}, None, "Built-in defaults shown; with --resume the run's "
                             "saved config replaces them.")
    if seen.config is not None:  # it may set env_id and algo itself
        return _file_defaults(Path(seen.config), seen.config, "", keep_choice=True)
    env_id, algo = seen.env_id or FIELDS["env_id"].default, seen.algo or FIELDS["algo"].default
    problem = _value_problem("algo", algo)
    if problem:
        return ShownDefaults({}, None, f"Built-in defaults shown: --algo {problem}.")
    path = default_config_file(env_id, algo)
    if path is None:
        return ShownDefaults({}, None, f"Built-in defaults shown: no shipped YAML for --env "
                             f"{env_id} --algo {algo}.")
    # The shipped file's env_id and algo are those that picked it: not defaults to show.
    return _file_defaults(path, f"configs/{path.name}", f" for --env {env_id} --algo {algo}",
                          keep_choice=False)


def _peek(argv: Sequence[str] | None) -> argparse.Namespace | None:
    """--help, --env, --algo, --config and --resume from argv, the rest ignored; None when
    the command line is wrong (the full parser then reports it, before any help)."""
    peek = _PeekParser(add_help=False)
    peek.add_argument("-h", "--help", action="store_true")
    for name in ("env_id", "algo", "config", "resume"):
        peek.add_argument(*([_flag(name), "--env"] if name == "env_id" else [_flag(name)]),
                          dest=name)
    try:
        return peek.parse_known_args(argv)[0]
    except _PeekFailed:
        return None


def _file_defaults(path: Path | Traversable, source: str, which: str, *, keep_choice: bool
                   ) -> ShownDefaults:
    """The file's values as the defaults to show; a file that cannot be read: the built-in
    ones, and why (the run itself would stop with that line)."""
    try:
        values = read_config_file(path)
    except ConfigError as err:
        return ShownDefaults({}, None, f"Built-in defaults shown: {err}.")
    if not keep_choice:
        values = {k: v for k, v in values.items() if k not in ("env_id", "algo")}
    return ShownDefaults(values, source, f"Defaults shown{which}: {source} over the built-in "
                         "values.")


def _default_text(name: str, shown: ShownDefaults | None) -> str:
    """``default: 1000, from configs/sac_pendulum.yaml; without it: 5000`` where the file
    changes the built-in default, else ``default: 5000`` (argparse breaks lines at hyphens,
    hence no "built-in" here)."""
    built_in = _show(field_default(FIELDS[name]))
    if shown is None or name not in shown.values or _show(shown.values[name]) == built_in:
        return f"default: {built_in}"
    return f"default: {_show(shown.values[name])}, from {shown.source}; without it: {built_in}"


def _show(default: Any) -> str:
    if isinstance(default, tuple):
        return " ".join(map(str, default))
    if isinstance(default, dict):
        return json.dumps(default)
    return str(default)


def _parse_kwargs_flag(name: str, text: str) -> dict[str, Any]:
    """`--actor-kwargs '{"width": 128}'` (JSON, or YAML flow such as '{width: 128}')."""
    example = "'{\"width\": 128}'"
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(
            f"{_flag(name)} must be a YAML/JSON mapping such as {example}, got {text!r} ({problem})"
        ) from None
    if value is None:  # an empty string: no keyword arguments
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(
            f"{_flag(name)} must be a YAML/JSON mapping with string keys such as {example}, "
            f"got {text!r}"
        )
    return value


def command_line_values(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The flags given on the command line (and ``config``), typed; defaults left out."""
    given = vars(build_parser(help_defaults(argv)).parse_args(argv))
    if "hidden_sizes" in given:
        given["hidden_sizes"] = tuple(given["hidden_sizes"])
    for name in _KWARGS:
        if name in given:
            given[name] = _parse_kwargs_flag(name, given[name])
    return given


def load_config(argv: Sequence[str] | None = None, *,
                base: Mapping[str, Any] | None = None) -> Config:
    """Parse argv (sys.argv[1:] when None) into a validated Config; user errors: ConfigError.

    ``base`` (a resumed run's own config) replaces the defaults and YAML files; the flags
    given still override it.
    """
    given = command_line_values(argv)
    config_file = given.pop("config", None)
    if base is not None:
        if config_file is not None:
            raise ConfigError("--config cannot be combined with --resume: a resumed run keeps "
                              "its own config; override single settings with their flags")
        saved = saved_config_values(base, resuming=True)
        return Config(**{**_coerce_mapping(saved, "the resumed run's config"), **given})
    if config_file is None:
        # The env's shipped file for the --algo given (a --config file replaces it altogether).
        env_id = given.get("env_id", FIELDS["env_id"].default)
        config_file = default_config_file(env_id, given.get("algo", FIELDS["algo"].default))
    from_file = read_config_file(config_file) if config_file is not None else {}
    # Flag values are typed by argparse; Config checks their values with --flag naming.
    return Config(**{**from_file, **given})
