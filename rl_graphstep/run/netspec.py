"""A run's networks: built from their specs and checked (:func:`make_networks`), and what the
run records about custom ones, so that ``--resume`` and ``evaluate`` rebuild them from any
folder as they were trained.

Every run's config (saved in each checkpoint, shown in tensorboard) names each custom network
by a spec string; the default networks stay ``null``. A network given

- by module (``package.module:Class``) is recorded as given: it is importable code;
- by file (``path/to/file.py:Class``) is copied into ``<run>/networks/`` when the run starts and
  recorded as ``networks/file.py:Class``, relative to the run folder, so the run resumes and
  evaluates from any folder (and after being moved) with the code it was trained with;
- as a class from Python is recorded as ``module:QualName`` when that finds it again, as a file
  spec (copied) when it lives in a script or a file loaded by path, and with a warning when
  nothing can find it again (a class defined inside a function, or in an interactive session);
- as a built module is recorded by its class, with the kwargs unknown (``{}``): resume and
  evaluate build ``Class(observation_space, action_space)`` and load the saved weights into
  it, and a warning says so at the start when that build would not fit those weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import re
import shutil
import sys
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import torch
from torch import nn

from rl_graphstep.core.errors import ConfigError, display_path
from rl_graphstep.core.netcheck import check_actor, check_critic
from rl_graphstep.core.usercode import is_file_path
from rl_graphstep.data.memory import allocation_errors, check_networks_fit
from rl_graphstep.networks.custom import NetworkSpec, build_network, load_network_classes
from rl_graphstep.networks.seeds import stack_pairs
from rl_graphstep.settings.config import Config

if TYPE_CHECKING:
    from rl_graphstep.algorithms.base import OffPolicyAlgorithm

__all__ = [
    "NETWORKS_DIR",
    "class_spec",
    "describe_networks",
    "networks_of_run",
    "record_networks",
    "refuse_built_for_group",
    "run_relative",
]

NETWORKS_DIR = "networks"
"""The folder of a run that keeps the source of its file-path networks."""

ROLES = ("actor", "critic")

# Modules networks.custom.load_class makes for files loaded by path: found again by their file only.
_FILE_MODULE_PREFIX = "_rl_graphstep_plugin_"
_MAIN_GUARD = re.compile(r"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:", re.MULTILINE)
# The warnings below name the user's line that called train(): their stacklevels count the
# frames from there (train -> _train -> record_networks -> ...).
# Built modules a train() call has trained in place: a second call starts from their weights.
_trained_modules: weakref.WeakSet[nn.Module] = weakref.WeakSet()


# --------------------------------------------------------------------------------------------
# Before the networks are built: where a run's recorded specs point
# --------------------------------------------------------------------------------------------


def run_relative(spec: str | None, run_dir: Path) -> str | None:
    """``spec`` as recorded in the config of the run in ``run_dir``, made usable from any folder:
    a relative file spec is the run's copy (``networks/file.py:Class``), so it is taken from the
    run folder. Checkpoints written before the copies existed recorded paths relative to the
    folder the run started in: such a path is kept when the run folder has no such file but the
    current folder has. Module specs and absolute paths are returned as they are."""
    if spec is None:
        return None
    location, _, class_name = spec.rpartition(":")
    if not is_file_path(location) or Path(location).expanduser().is_absolute():
        return spec
    in_run = run_dir / location
    if not in_run.is_file() and Path(location).is_file():
        return spec
    return f"{in_run.resolve()}:{class_name}"


def networks_of_run(cfg: Config, recorded: dict[str, Any], run_dir: Path,
                    actor: NetworkSpec | None, critic: NetworkSpec | None
                    ) -> tuple[NetworkSpec | None, NetworkSpec | None]:
    """The networks a resumed run builds: those given from Python, else the config's, where a
    spec still equal to the checkpoint's ``recorded`` one is taken from the run folder (see
    :func:`run_relative`); a spec given anew (a flag) is the user's, relative to the current
    folder."""
    chosen = []
    for role, given in zip(ROLES, (actor, critic), strict=True):
        spec = getattr(cfg, role)
        if given is None and spec is not None and spec == recorded.get(role):
            given = run_relative(spec, run_dir)
        chosen.append(given)
    return chosen[0], chosen[1]


# --------------------------------------------------------------------------------------------
# After the networks are built: what the run records
# --------------------------------------------------------------------------------------------


def record_networks(cfg: Config, run_dir: Path, actor: NetworkSpec | None, actor_net: nn.Module,
                    critic: NetworkSpec | None, critic_net: nn.Module,
                    observation_space: gym.Space, action_space: gym.Space
                    ) -> tuple[Config, str]:
    """``cfg`` with the spec of each network actually used (see the module docstring), file
    networks copied into ``run_dir/networks/``; and the start line's words naming the custom
    classes (``"actor ResidualActor (examples.residual_actor)"``, ``""`` for the defaults).

    ``actor`` / ``critic``: what the run was given (from Python, else the config's spec), or
    None for the algorithm's default.
    """
    specs: dict[str, str | None] = {}
    words = []
    for role, given, network in (("actor", actor, actor_net), ("critic", critic, critic_net)):
        if given is None:
            specs[role] = None
            continue
        spec, origin = _spec_to_record(given, role)
        if isinstance(given, nn.Module):
            _warn_if_not_rebuildable(given, spec, role, observation_space, action_space)
            # Resumed, its weights are the checkpoint's, whatever it held before.
            _warn_if_trained_before(given, role, warn=not cfg.resume)
        specs[role] = _with_copy(spec, run_dir)
        if _in_folder(spec.rpartition(":")[0], run_dir):  # the run's own copy, resumed
            origin = specs[role].rpartition(":")[0]
        words.append(f"{role} {type(network).__name__} ({origin})")
    return dataclasses.replace(cfg, **specs), ", ".join(words)


def _spec_to_record(given: NetworkSpec, role: str) -> tuple[str, str]:
    """(the spec, before any copy; where the class comes from, for the start line)."""
    if isinstance(given, str):
        location = given.rpartition(":")[0]
        if is_file_path(location):
            path = Path(location).expanduser().resolve()
            return f"{path}:{given.rpartition(':')[2]}", display_path(str(path))
        return given, location
    cls = given if isinstance(given, type) else type(given)
    spec = class_spec(cls, role)
    location = spec.rpartition(":")[0]
    origin = display_path(location) if is_file_path(location) else location
    return spec, origin + ("" if isinstance(given, type) else ", built")


def class_spec(cls: type, role: str = "network") -> str:
    """The spec that finds ``cls`` again: ``module:QualName`` when importing the module by
    that name gives ``cls``; else ``/path/file.py:QualName`` when ``cls`` lives in a real file
    (a script run as ``__main__``, a file loaded by path); else ``module:QualName`` with a
    warning that resume and evaluate cannot find it (a class defined inside a function, or in
    an interactive session), where :func:`rl_graphstep.networks.custom.load_class` refuses it."""
    module_name, qualname = cls.__module__, cls.__qualname__
    name = cls.__name__
    if "<locals>" in qualname:
        warnings.warn(
            f"{role}: {name} is defined inside a function ({qualname}), so --resume and "
            f"evaluate cannot import it again; define it at module level", stacklevel=6)
        return f"{module_name}:{qualname}"
    importable = module_name != "__main__" and not module_name.startswith(_FILE_MODULE_PREFIX)
    if importable and _lookup(_import(module_name), qualname) is cls:
        return f"{module_name}:{qualname}"
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if file and Path(file).suffix == ".py" and Path(file).is_file() \
            and _lookup(module, qualname) is cls:
        path = Path(file).resolve()
        if module_name == "__main__" and not _MAIN_GUARD.search(path.read_text("utf-8")):
            warnings.warn(
                f"{role}: {name} is defined in the script {display_path(str(path))}, which "
                f"--resume and evaluate run again to find it: keep the script's own work "
                f"under `if __name__ == \"__main__\":`", stacklevel=6)
        return f"{path}:{qualname}"
    where = "an interactive session" if module_name == "__main__" else f"module {module_name}"
    warnings.warn(
        f"{role}: {name} cannot be found again by name (it is defined in {where}), so "
        f"--resume and evaluate cannot build it; define it in a module or a file", stacklevel=6)
    return f"{module_name}:{qualname}"


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ImportError:
        return None


def _lookup(module: Any, qualname: str) -> Any:
    """``module.A.B`` for qualname ``A.B``; None where any part is missing."""
    value = module
    for part in qualname.split("."):
        value = getattr(value, part, None)
    return value


def _with_copy(spec: str, run_dir: Path) -> str:
    """A file spec with its file copied into ``run_dir/networks/`` (unless it lies in the run
    folder already), relative to the run folder; other specs as they are."""
    location, _, class_name = spec.rpartition(":")
    if not is_file_path(location):
        return spec
    source = Path(location)
    run = run_dir.resolve()
    if not _in_folder(location, run_dir):
        source = _copy_source(source, run / NETWORKS_DIR)
    return f"{source.relative_to(run).as_posix()}:{class_name}"


def _in_folder(location: str, folder: Path) -> bool:
    """Whether the file ``location`` (absolute, or a module name: never) lies in ``folder``."""
    return is_file_path(location) and Path(location).is_relative_to(folder.resolve())


def _copy_source(source: Path, folder: Path) -> Path:
    """``source`` copied into ``folder`` as ``<stem>.py``, or ``<stem>_<hash>.py`` when a
    different file of that name is there already (two files of one name, or an edited file
    given to a resumed run: older checkpoints keep pointing at the copy they were trained
    with)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = source.read_bytes()
    target = folder / source.name
    if target.exists() and target.read_bytes() != data:
        target = folder / f"{source.stem}_{hashlib.sha256(data).hexdigest()[:8]}{source.suffix}"
    if not target.exists():
        shutil.copyfile(source, target)
    return target


def _warn_if_not_rebuildable(network: nn.Module, spec: str, role: str,
                             observation_space: gym.Space, action_space: gym.Space) -> None:
    """Resume and evaluate build ``Class(observation_space, action_space)`` for a network
    given built (its constructor arguments are unknown): say now if that will not fit its
    weights. The trial build draws from a forked generator, so the run's stream is untouched."""
    cls = type(network)
    why = ""
    try:
        with torch.random.fork_rng(devices=[]):
            fresh = cls(observation_space, action_space)
    except Exception as error:  # any constructor failure: the warning names it
        why = f"{cls.__name__}(observation_space, action_space) raises {type(error).__name__}"
    else:
        shapes = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
        if shapes != {k: tuple(v.shape) for k, v in network.state_dict().items()}:
            why = f"{cls.__name__}(observation_space, action_space) has other parameter shapes"
    if why:
        warnings.warn(
            f"{role}: {cls.__name__} was given built, so its constructor arguments are unknown "
            f"and --resume and evaluate build {spec.rpartition(':')[2]} with {role}_kwargs {{}}, "
            f"which will not fit its weights ({why}); pass the class and {role}_kwargs instead",
            stacklevel=5)


def _warn_if_trained_before(network: nn.Module, role: str, *, warn: bool) -> None:
    """A built module is trained in place: passed to a second run it starts from the first
    run's weights, whatever the seed. Say so, since two such calls look identical."""
    if warn and network in _trained_modules:
        warnings.warn(
            f"{role}: this {type(network).__name__} was trained in place by an earlier train() "
            f"call and starts from those weights; build a fresh one (after torch.manual_seed) "
            f"to repeat a run", stacklevel=5)
    _trained_modules.add(network)


def describe_networks(words: str) -> str:
    """The start line's part naming the custom networks, ``""`` without any."""
    return f"; {words}" if words else ""


def make_networks(algorithm: type[OffPolicyAlgorithm], cfg: Config, observation_space: gym.Space,
                  action_space: gym.Space, device: torch.device, actor: NetworkSpec | None = None,
                  critic: NetworkSpec | None = None) -> tuple[nn.Module, nn.Module]:
    """The actor and critic: given ones (class, module or ``module:Class``), else those of
    ``cfg.actor``/``cfg.critic``, else the algorithm's defaults; each checked once on an
    example batch before any capture."""
    actor, critic = actor or cfg.actor, critic or cfg.critic
    check_networks_fit(cfg, observation_space, action_space, device,
                       default_actor=actor is None, default_critic=critic is None,
                       num_critics=algorithm.num_critics)
    with allocation_errors(device):
        actor_net, critic_net = build_networks(algorithm, cfg, observation_space,
                                               action_space, device, actor, critic)
    sizes = {"observation_size": observation_space.shape[0],
             "action_size": action_space.shape[0], "device": device}
    check_actor(actor_net, kind=algorithm.actor_kind, **sizes)
    check_critic(critic_net, min_members=algorithm.num_critics, atoms=cfg.critic_atoms,
                 **sizes)
    return actor_net, critic_net


def build_networks(algorithm: Any, cfg: Config, observation_space: gym.Space,
                   action_space: gym.Space, device: torch.device, actor: NetworkSpec | None,
                   critic: NetworkSpec | None) -> tuple[nn.Module, nn.Module]:
    """The actor and critic on ``device``, unchecked: ``actor``/``critic`` built from their
    class or spec with ``cfg``'s kwargs (a built module as it is), else ``algorithm``'s
    ``default_actor``/``default_critic`` (any algorithm class, PPO's included)."""
    actor_net = (build_network(actor, observation_space, action_space, cfg.actor_kwargs,
                               role="actor") if actor is not None
                 else algorithm.default_actor(observation_space, action_space, cfg))
    critic_net = (build_network(critic, observation_space, action_space, cfg.critic_kwargs,
                                role="critic") if critic is not None
                  else algorithm.default_critic(observation_space, action_space, cfg))
    return actor_net.to(device), critic_net.to(device)


def refuse_built_for_group(actor: NetworkSpec | None, critic: NetworkSpec | None) -> None:
    """A built module cannot be a group's: it has one initialisation, where each seed needs
    its own."""
    for role, given in (("actor", actor), ("critic", critic)):
        if isinstance(given, nn.Module):
            raise ConfigError(f"a built {role} module has one initialisation and a group of "
                              f"seeds needs one per seed: pass its class, or train with "
                              f"--num-seeds 1")


def make_seed_networks(algorithm: type[OffPolicyAlgorithm], cfg: Config, seeds: Sequence[int],
                       observation_space: gym.Space, action_space: gym.Space,
                       device: torch.device, actor: NetworkSpec | None = None,
                       critic: NetworkSpec | None = None) -> tuple[nn.Module, nn.Module]:
    """:func:`make_networks` for a run of ``seeds``: for one seed its networks as today; for
    K seeds each seed's networks built as that seed alone builds them, stacked on a leading
    seed dimension (``rl_graphstep.networks.seeds``). A built module cannot be a group's: it has one
    initialisation, where each seed needs its own."""
    if len(seeds) == 1:
        return make_networks(algorithm, cfg, observation_space, action_space, device, actor,
                             critic)
    refuse_built_for_group(actor, critic)
    # Each seed builds from one class: a file spec loaded per seed would give each its own.
    actor, critic = load_network_classes((actor or cfg.actor, "actor"),
                                         (critic or cfg.critic, "critic"))
    return stack_pairs(lambda _seed: make_networks(algorithm, cfg, observation_space,
                                                   action_space, device, actor, critic),
                       seeds, observation_size=observation_space.shape[0],
                       action_size=action_space.shape[0])
