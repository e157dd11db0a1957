"""The actor-critic algorithms, by the name ``--algo`` takes: the one registry. A new
algorithm is a module in this folder and one line in ``_CLASSES``. The off-policy ones
(SAC, TD3, DDPG, CrossQ) train with a replay buffer; PPO with rollouts (``ON_POLICY``).

Classes are imported on first use, so that the command line can list the names without
importing any algorithm (torch and the networks).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.settings.config import Config, field_default
from rl_graphstep.settings.values import flag_of

if TYPE_CHECKING:
    from rl_graphstep.algorithms.base import OffPolicyAlgorithm
    from rl_graphstep.algorithms.ddpg import DDPG
    from rl_graphstep.algorithms.ppo import PPO
    from rl_graphstep.algorithms.sac import SAC
    from rl_graphstep.algorithms.td3 import TD3

__all__ = ["ALGORITHMS", "DDPG", "OFF_POLICY_ALGORITHMS", "ON_POLICY", "PPO", "SAC", "TD3",
           "OffPolicyAlgorithm", "algorithm_class", "check_algorithm", "check_settings",
           "is_on_policy", "listed"]

# --algo name -> "module:Class"; a new algorithm is one line here.
_CLASSES: dict[str, str] = {
    "sac": "rl_graphstep.algorithms.sac:SAC",
    "td3": "rl_graphstep.algorithms.td3:TD3",
    "ddpg": "rl_graphstep.algorithms.ddpg:DDPG",
    "crossq": "rl_graphstep.algorithms.crossq:CrossQ",
    "ppo": "rl_graphstep.algorithms.ppo:PPO",
}
# The algorithms that learn from rollouts of their current policy (the on-policy learner).
ON_POLICY: tuple[str, ...] = ("ppo",)


def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


class _Registry(Mapping[str, Any]):
    """A read-only ``{name: class}`` mapping whose names need no import and whose classes
    are imported when looked up; ``off_policy``: only the off-policy ones."""

    def __init__(self, *, off_policy: bool = False) -> None:
        self.off_policy = off_policy

    def _names(self) -> list[str]:
        return [n for n in _CLASSES if not (self.off_policy and n in ON_POLICY)]

    def __getitem__(self, name: str) -> Any:
        if name not in self._names():
            raise KeyError(name)
        return _load(_CLASSES[name])

    def __contains__(self, name: object) -> bool:
        return name in self._names()  # Mapping's default would import the class

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        kind = "OFF_POLICY_ALGORITHMS" if self.off_policy else "ALGORITHMS"
        return f"{kind}({', '.join(self._names())})"


ALGORITHMS: Mapping[str, Any] = _Registry()
"""Every algorithm, by name: the off-policy classes and PPO."""
OFF_POLICY_ALGORITHMS: Mapping[str, type[OffPolicyAlgorithm]] = _Registry(off_policy=True)
"""SAC, TD3 and DDPG: the algorithms of the replay buffer and the off-policy learner."""


def is_on_policy(name: str) -> bool:
    """Whether ``--algo name`` learns from rollouts (the on-policy learner) rather than a
    replay buffer; imports nothing."""
    return name in ON_POLICY


def check_algorithm(name: str, source: str | None = None) -> None:
    """Raise a one-line ConfigError where ``name`` (``--algo``, or the ``algo`` of the file
    ``source`` names) is no algorithm here; imports nothing."""
    if name not in _CLASSES:
        where = f"algo must be one of {{}}, got {name!r} in {source}" if source else \
            f"--algo must be one of {{}}, got {name!r}"
        raise ConfigError(where.format(", ".join(_CLASSES)))


def check_settings(cfg: Config) -> None:
    """``check_algorithm`` of ``cfg.algo``, and a one-line ConfigError where ``cfg`` sets a
    field only other algorithms read (its ``algos``; see ``settings.config.option``): a run
    that silently ignored it would train with something other than what was asked."""
    check_algorithm(cfg.algo)
    for f in dataclasses.fields(cfg):
        algos = f.metadata.get("algos")
        if algos is None or cfg.algo in algos or getattr(cfg, f.name) == field_default(f):
            continue
        # Each by its class's name (SAC, CrossQ), read off the registry without an import.
        names = [_CLASSES[name].rpartition(":")[2] for name in algos if name in _CLASSES]
        readers = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        raise ConfigError(f"{flag_of(f.name)} is a setting of {readers} alone, which --algo "
                          f"{cfg.algo} does not read: leave it out")


def listed(f: dataclasses.Field[Any]) -> bool:
    """Whether the field is a setting of some algorithm here (``--help`` lists only those)."""
    return any(name in _CLASSES for name in f.metadata.get("algos", _CLASSES))


def algorithm_class(name: str) -> Any:
    """The class ``--algo name`` trains, imported now; an unknown name is one ConfigError line."""
    check_algorithm(name)
    return ALGORITHMS[name]

_EXPORTS: dict[str, str] = {
    "OffPolicyAlgorithm": "rl_graphstep.algorithms.base:OffPolicyAlgorithm",
    **{_CLASSES[name].rpartition(":")[2]: _CLASSES[name] for name in _CLASSES},
}


def __getattr__(name: str) -> Any:
    # `from rl_graphstep.algorithms import SAC` imports the class then, not with the package.
    if name in _EXPORTS:
        return _load(_EXPORTS[name])
    raise AttributeError(f"module 'rl_graphstep.algorithms' has no attribute {name!r}")
