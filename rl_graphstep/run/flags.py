"""The command line of a training run: one flag per Config field, --help with the defaults
that will apply, and load_config (defaults < the env's YAML < --config < flags)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rl_graphstep.algorithms import ALGORITHMS, check_algorithm, check_settings, listed
from rl_graphstep.core.errors import ConfigError, display_path, type_name
from rl_graphstep.run.checkpoint import find_checkpoint, load_checkpoint, run_folder_of
from rl_graphstep.run.cli import OneLineParser, argument_list
from rl_graphstep.settings.config import (
    FIELD_TYPES,
    FIELDS,
    Config,
    coerce_mapping,
    field_default,
    removed_flags,
    saved_config_values,
)
from rl_graphstep.settings.configfile import (
    DuplicateKeyError,
    default_config_file,
    load_yaml,
    read_config_file,
)
from rl_graphstep.settings.fieldtypes import user_path
from rl_graphstep.settings.seedgroup import check_resumed_seeds, check_seed_flags, group_seeds
from rl_graphstep.settings.values import CHOICES, SWITCH_FIELDS, SWITCH_MODES, flag_of

if TYPE_CHECKING:  # importlib.resources.abc is Python 3.11+; the package supports 3.10
    from importlib.resources.abc import Traversable

# Flags whose value is a YAML/JSON mapping, parsed here so a bad one reads as one from YAML.
KWARGS_FIELDS = ("actor_kwargs", "critic_kwargs")


def build_parser(shown: ShownDefaults | None = None) -> argparse.ArgumentParser:
    """One --kebab-case flag per Config field; flags not given stay absent from the namespace.
    ``shown``: the defaults the help texts give (the built-in ones when None)."""
    # Mistakes raise one ConfigError line; no abbreviations (--learning is no --learning-starts).
    parser = OneLineParser(
        prog="python -m rl_graphstep.train",
        description="Train an actor-critic agent (SAC, TD3, DDPG, CrossQ off-policy; PPO "
                    "on-policy) with CUDA-graph-captured updates."
        + (f" {shown.note}" if shown else ""),
        epilog=(
            "Precedence: built-in defaults < the shipped YAML for --algo and the env "
            "(configs/{algo}_pendulum.yaml for Pendulum-v1, configs/{algo}_mujoco.yaml for "
            "MuJoCo envs, configs/{algo}_classic.yaml for CartPole, Acrobot and MountainCar; "
            "only without --config) < --config FILE < flags given here."
        ),
        argument_default=argparse.SUPPRESS,
        removed=removed_flags(),
    )
    parser.add_argument(
        "--config", metavar="FILE",
        help="YAML file of field: value overrides (keys as below), or a shipped one by its "
             "name, such as sac_mujoco_parallel"
    )
    for name, f in FIELDS.items():
        if not listed(f):  # the settings of an algorithm that is not here yet
            continue
        kind = FIELD_TYPES[name]
        what = (f"algorithm, one of {', '.join(ALGORITHMS)}" if name == "algo"
                else f.metadata["help"])
        help_text = f"{what} ({_default_text(name, shown)})"
        flags = [flag_of(name), "--env"] if name == "env_id" else [flag_of(name)]
        if kind is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, help=help_text)
        elif kind in (tuple[int, ...], tuple[int, ...] | None):
            parser.add_argument(*flags, type=int, nargs="+", metavar="N", help=help_text)
        elif name in KWARGS_FIELDS:
            # Parsed by load_config, so a bad mapping is a ConfigError like one from YAML.
            parser.add_argument(*flags, type=str, metavar="YAML", help=help_text)
        elif name in SWITCH_FIELDS:
            # --graph alone means on and --no-graph off (so --action-stream and
            # --no-action-stream, a bool flag once, keep their meaning).
            parser.add_argument(*flags, type=str, nargs="?", const="on",
                                metavar="{" + ",".join(SWITCH_MODES) + "}", help=help_text)
            parser.add_argument("--no-" + flag_of(name)[2:], dest=name, action="store_const",
                                const="off", help=f"the same as {flag_of(name)} off")
        elif name in CHOICES or name == "algo":
            # Choices are validated by Config (the algorithm's name by the registry), so flags
            # and YAML share one error message.
            metavar = "{" + ",".join(CHOICES.get(name, ALGORITHMS)) + "}"
            parser.add_argument(*flags, type=str, metavar=metavar, help=help_text)
        else:
            scalar = {int: int, float: float, float | None: float}.get(kind, str)
            metavar = {int: "INT", float: "FLOAT", float | None: "FLOAT"}.get(kind, "STR")
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
        return _file_defaults(seen.config, seen.config, "", keep_choice=True)
    env_id, algo = seen.env_id or FIELDS["env_id"].default, seen.algo or FIELDS["algo"].default
    try:
        check_algorithm(algo)
    except ConfigError as err:
        return ShownDefaults({}, None, f"Built-in defaults shown: {err}.")
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
        peek.add_argument(*([flag_of(name), "--env"] if name == "env_id" else [flag_of(name)]),
                          dest=name)
    try:
        return peek.parse_known_args(argv)[0]
    except _PeekFailed:
        return None


def _file_defaults(path: Path | Traversable | str, source: str, which: str, *, keep_choice: bool
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
        value = load_yaml(text)
    except DuplicateKeyError as err:
        raise ConfigError(f"{flag_of(name)} {text!r}: {err}; give it once") from None
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(
            f"{flag_of(name)} must be a YAML/JSON mapping such as {example}, got {text!r} "
            f"({problem})"
        ) from None
    if value is None:  # an empty string: no keyword arguments
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(
            f"{flag_of(name)} must be a YAML/JSON mapping with string keys such as {example}, "
            f"got {text!r}"
        )
    return value


def command_line_values(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The flags given on the command line (and ``config``), typed; defaults left out."""
    argv = argument_list(argv, "command_line_values()")
    given = vars(build_parser(help_defaults(argv)).parse_args(argv))
    for name in ("hidden_sizes", "seeds"):
        if name in given:
            given[name] = tuple(given[name])
    check_seed_flags(given)
    for name in KWARGS_FIELDS:
        if name in given:
            given[name] = _parse_kwargs_flag(name, given[name])
    return given


def load_config(argv: Sequence[str] | None = None, *,
                base: Mapping[str, Any] | None = None) -> Config:
    """Parse argv (sys.argv[1:] when None) into a validated Config; user errors: ConfigError.

    With ``--resume RUN`` the run's own config, from its latest checkpoint, replaces the
    defaults and YAML files, so that the command line and ``train(load_config([...]))`` from
    Python resume alike; the flags given still override it, but for what a run keeps (its
    folder, name and seeds). ``base``: that config where the caller has already loaded it.
    """
    argv = argument_list(argv, "load_config()")
    if base is not None and not isinstance(base, Mapping):
        raise TypeError(f"load_config()'s base takes a checkpoint's config mapping, got "
                        f"{type_name(base)}")
    given = command_line_values(argv)
    config_file = given.pop("config", None)
    if base is None and given.get("resume") is not None:
        base = load_checkpoint(given["resume"])["config"]
    if base is not None:
        if config_file is not None:
            raise ConfigError("--config cannot be combined with --resume: a resumed run keeps "
                              "its own config; override single settings with their flags")
        saved = coerce_mapping(saved_config_values(base, resuming=True),
                               "the resumed run's config")
        check_resumed_seeds(group_seeds(*(saved.get(name, FIELDS[name].default)
                                          for name in ("seed", "num_seeds", "seeds"))), given)
        check_resumed_task(saved, given)
        if given.get("resume") is not None and ("run_name" in given or "log_dir" in given):
            check_resumed_folder(given["resume"], given)
        cfg = Config(**{**saved, **given})
        check_settings(cfg)
        return cfg
    if config_file is None:
        # The env's shipped file for the --algo given (a --config file replaces it altogether).
        env_id = given.get("env_id", FIELDS["env_id"].default)
        config_file = default_config_file(env_id, given.get("algo", FIELDS["algo"].default))
    from_file = read_config_file(config_file) if config_file is not None else {}
    if "algo" in from_file and "algo" not in given:
        check_algorithm(from_file["algo"], f"config file {str(config_file)!r}")
    # Flag values are typed by argparse; Config checks their values with --flag naming.
    cfg = Config(**{**from_file, **given})
    check_settings(cfg)
    return cfg


def check_resumed_task(saved: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """A run resumes on its own env with its own algorithm: its networks, optimizers and
    replay buffer are theirs."""
    run_env = saved.get("env_id", FIELDS["env_id"].default)
    run_algo = saved.get("algo", FIELDS["algo"].default)
    for name, own in (("env_id", run_env), ("algo", run_algo)):
        if name in given and given[name] != own:
            flag = "--env" if name == "env_id" else flag_of(name)
            raise ConfigError(f"{flag} {given[name]} does not match: the resumed run is "
                              f"{run_algo} on {run_env}, and a run resumes with its own env "
                              f"and algorithm; drop {flag}")


def check_resumed_folder(resume: str, given: Mapping[str, Any]) -> None:
    """A resumed run trains on in its own folder: a --run-name or --log-dir that names
    another would be recorded in its checkpoints while it does not."""
    folder = run_folder_of(find_checkpoint(resume))
    moved = [name for name, differs in (
        ("log_dir", lambda v: user_path(v).resolve() != folder.parent.resolve()),
        ("run_name", lambda v: v != folder.name)) if name in given and differs(given[name])]
    if moved:
        flags = " and ".join(flag_of(name) for name in moved)
        raise ConfigError(f"{flags} cannot be combined with --resume: the resumed run keeps its "
                          f"folder and name ({display_path(str(folder))}); drop {flags}")
