"""How much memory a device has to give, and one clear line when a buffer or the networks
asked for will not fit: checked before allocating, and again when an allocation fails."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

import gymnasium as gym
import torch

from rl_graphstep.core.errors import ConfigError

if TYPE_CHECKING:
    from rl_graphstep.settings.config import Config

__all__ = ["allocation_errors", "available_memory", "check_networks_fit", "format_bytes",
           "is_out_of_memory"]

# Float32 copies of every default network parameter a run holds: the weights, their
# gradients, Adam's two moments, and a target (or acting) copy.
_COPIES_PER_PARAMETER = 5


def format_bytes(nbytes: int) -> str:
    """``512 B``, ``1.5 KiB``, ``3.7 GiB``."""
    if nbytes < 1024:
        return f"{nbytes} B"
    for exponent, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if nbytes >= 1024**exponent:
            return f"{nbytes / 1024**exponent:.1f} {unit}"
    raise AssertionError("unreachable")


def available_memory(device: torch.device) -> tuple[int, str] | None:
    """Bytes an allocation on `device` may use and a phrase naming them; None if unknown."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free, f"{device} has {format_bytes(free)} free"
    if device.type == "cpu":
        free = meminfo_available()
        if free is not None:
            return free, f"this machine has {format_bytes(free)} of memory available"
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            return None  # no sysconf (Windows): let the allocation itself decide
        return total, f"this machine has {format_bytes(total)} of memory"
    return None


def meminfo_available(path: str = "/proc/meminfo") -> int | None:
    """Linux's estimate of the memory that can be allocated without swapping (MemAvailable,
    which counts reclaimable caches), in bytes; None where there is no such file or line.
    Compared with the total instead, a buffer passed the check that the allocation (or the
    kernel's OOM killer) then stopped."""
    try:
        with open(path, encoding="ascii") as meminfo:
            for line in meminfo:
                key, _, value = line.partition(":")
                if key == "MemAvailable":
                    return int(value.split()[0]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def is_out_of_memory(error: BaseException) -> bool:
    """Whether an error is a failed allocation: Python's MemoryError, CUDA's
    torch.OutOfMemoryError, or the CPU allocator's "can't allocate memory" RuntimeError."""
    return (isinstance(error, (MemoryError, torch.OutOfMemoryError))
            or "can't allocate memory" in str(error))


def _linear_parameters(sizes: Sequence[int]) -> int:
    return sum(fan_in * fan_out + fan_out for fan_in, fan_out in pairwise(sizes))


def default_network_bytes(observation_size: int, action_size: int,
                          hidden_sizes: Sequence[int], num_critics: int, *,
                          actor: bool = True, critic: bool = True, atoms: int = 0) -> int:
    """About the bytes the default actor and critic take during training (see
    ``_COPIES_PER_PARAMETER``); the actor counted with SAC's two heads, an upper bound; the
    critic's members with ``atoms`` outputs each where distributional."""
    parameters = 0
    if actor:
        parameters += _linear_parameters([observation_size, *hidden_sizes, 2 * action_size])
    if critic:
        parameters += num_critics * _linear_parameters(
            [observation_size + action_size, *hidden_sizes, atoms or 1])
    return parameters * _COPIES_PER_PARAMETER * 4


def check_networks_fit(cfg: Config, observation_space: gym.Space, action_space: gym.Space,
                       device: torch.device, *, default_actor: bool, default_critic: bool,
                       num_critics: int) -> None:
    """Refuse ``--hidden-sizes`` whose default networks would not fit in ``device``'s
    memory, before allocating any of it (an allocation that succeeds on an overcommitting
    host is then killed when it is first written)."""
    if not (default_actor or default_critic):
        return
    sizes = (int(observation_space.shape[0]), int(action_space.shape[0]))
    # CrossQ's critic has widths of its own (--critic-hidden-sizes).
    critic_sizes = cfg.critic_hidden_sizes or cfg.hidden_sizes
    needed = (default_network_bytes(*sizes, cfg.hidden_sizes, num_critics, actor=default_actor,
                                    critic=False)
              + default_network_bytes(*sizes, critic_sizes, num_critics, actor=False,
                                      critic=default_critic, atoms=cfg.critic_atoms))
    available = available_memory(device)
    if available is None or needed <= available[0]:
        return
    flag = "--critic-hidden-sizes" if cfg.critic_hidden_sizes else "--hidden-sizes"
    widths = " ".join(map(str, critic_sizes if cfg.critic_hidden_sizes else cfg.hidden_sizes))
    raise ConfigError(f"{flag} {widths} make networks that need about "
                      f"{format_bytes(needed)} with their gradients and optimizer state, but "
                      f"{available[1]}; use smaller {flag}")


@contextlib.contextmanager
def allocation_errors(device: torch.device) -> Iterator[None]:
    """Turn a failed allocation while building the networks into one ConfigError line."""
    try:
        yield
    except (MemoryError, RuntimeError) as error:
        if not is_out_of_memory(error):
            raise
        where = (available_memory(device) or (0, f"{device} has too little memory"))[1]
        raise ConfigError(f"the networks do not fit in memory ({where}); use smaller "
                          "--hidden-sizes or a smaller custom network (--actor-kwargs, "
                          "--critic-kwargs)") from None
