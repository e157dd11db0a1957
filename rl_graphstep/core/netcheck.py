"""Checks of a built actor or critic: one forward pass on a random batch before any capture, so
a wrong shape, range or host sync is one line naming the class, not a failed capture. The
helpers that run a method and check what it returned are public: PPO's networks are checked
with them too (``core.ppocheck``)."""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from rl_graphstep.core.errors import ConfigError, display_path, user_frame, user_location

__all__ = [
    "ActorKind",
    "check_actor",
    "check_critic",
    "check_devices",
    "check_tensor",
    "describe_host_sync",
    "evaluation_action",
    "forked_rng",
    "run_checked",
]

ActorKind = str
""""stochastic" (SAC: forward returns (action, log_prob)) or "deterministic" (TD3, DDPG)."""

ACTOR_KINDS = ("stochastic", "deterministic")

_GRAPH_HINT = (
    "which cannot run inside a CUDA graph: keep tensors on the device "
    "(torch.where instead of if) or use --graph off"
)
# PyTorch's sync debug mode raises a RuntimeError with this text (c10/cuda/CUDAFunctions.h).
_SYNC_ERROR_TEXT = "synchronizing CUDA operation"
_SYNC_MODE_NOTICE = "Synchronization debug mode is a prototype feature"


def check_actor(
    actor: nn.Module,
    *,
    kind: ActorKind,
    observation_size: int,
    action_size: int,
    device: torch.device,
    batch_size: int = 256,
) -> None:
    """Run `actor` once on a random batch and check what a captured update will rely on.

    `kind="stochastic"` (SAC): forward returns `(action (B, A), log_prob (B,))`;
    `kind="deterministic"` (TD3, DDPG): forward returns `action (B, A)`. Actions must be
    float32, finite and in [-1, 1]; every parameter and buffer must be on `device`. On CUDA
    the forward runs under `torch.cuda.set_sync_debug_mode("error")`, so a host sync is
    caught here. No random numbers of the run are consumed. `deterministic_action`, where
    the actor has one, is checked the same way (host syncs aside: evaluation runs it
    eagerly); a stochastic actor without one gets a warning, since evaluation then takes its
    sampled action.

    Raises:
        ConfigError: one line naming the class and what is wrong.
    """
    if kind not in ACTOR_KINDS:
        raise ValueError(f"kind must be one of {ACTOR_KINDS}, got {kind!r}")
    name = type(actor).__name__
    check_devices(actor, name, device)
    with forked_rng(device):
        observations = torch.randn(batch_size, observation_size, device=device)
        output = run_checked(actor, (observations,), name, device)

    expected = (batch_size, action_size)
    if kind == "deterministic":
        if isinstance(output, tuple | list):
            raise ConfigError(
                f"{name}.forward returned a {type(output).__name__}, expected a tensor action "
                f"{expected} (a deterministic actor returns only the action)"
            )
        check_tensor(name, output, "", expected, device)
        _check_action_range(name, output)
        _check_deterministic_action(actor, kind, observations, expected, device)
        return

    if isinstance(output, Tensor):
        raise ConfigError(f"{name}.forward returned a tensor, expected a tuple (action, log_prob)")
    if not isinstance(output, tuple | list) or len(output) != 2:
        got = (f"a {type(output).__name__} of {len(output)}" if isinstance(output, tuple | list)
               else f"a {type(output).__name__}")
        raise ConfigError(f"{name}.forward returned {got}, expected a tuple (action, log_prob)")
    actions, log_probs = output
    check_tensor(name, actions, "action ", expected, device)
    check_tensor(name, log_probs, "log_prob ", (batch_size,), device,
                  hint=" (sum the log-probabilities over the action dimension, no keepdim)")
    _check_action_range(name, actions)
    _check_deterministic_action(actor, kind, observations, expected, device)


def _check_deterministic_action(actor: nn.Module, kind: ActorKind, observations: Tensor,
                                expected: tuple[int, ...], device: torch.device) -> None:
    """Check ``actor.deterministic_action`` on the example batch as ``forward`` is checked; a
    SAC actor without one trains, but evaluation then takes its sampled action: warn (evaluate
    builds the actor through the same check, so it repeats the warning). A deterministic
    (TD3, DDPG) actor's forward is its deterministic action, so it needs none."""
    name = type(actor).__name__
    if not callable(getattr(actor, "deterministic_action", None)):
        if kind == "stochastic":
            warnings.warn(f"actor {name} has no deterministic_action: evaluation uses its "
                          "stochastic forward action", stacklevel=4)
        return
    with forked_rng(device):
        # Evaluation runs it eagerly, never in a graph: a host sync there is allowed.
        action = run_checked(actor, (observations,), name, device,
                              method="deterministic_action", in_graph=False)
    check_tensor(name, action, "", expected, device, method="deterministic_action")
    _check_action_range(name, action, method="deterministic_action")


def evaluation_action(actor: nn.Module, kind: ActorKind, observations: Tensor) -> Tensor:
    """The action to evaluate with, in [-1, 1]: the actor's ``deterministic_action`` where it
    has one, else a deterministic actor's forward, else a stochastic actor's sampled action
    (:func:`check_actor` warns about that case)."""
    if callable(getattr(actor, "deterministic_action", None)):
        return actor.deterministic_action(observations)
    if kind == "deterministic":
        return actor(observations)
    return actor(observations)[0]


def check_critic(
    critic: nn.Module,
    *,
    observation_size: int,
    action_size: int,
    device: torch.device,
    min_members: int,
    atoms: int = 0,
    batch_size: int = 256,
) -> None:
    """Run `critic(observations, actions)` once on a random batch and check its Q values.

    They must be (B, E) float32 and finite with E >= `min_members` (2 for the clipped double
    Q of SAC and TD3, 1 for DDPG), and E must equal `critic.num_critics` where the critic has
    that attribute. A distributional critic (`atoms` = A > 0, ``--critic-atoms``) returns
    logits (B, E, A) instead. Devices, host syncs and random numbers are handled as in
    :func:`check_actor`.

    Raises:
        ConfigError: one line naming the class and what is wrong.
    """
    name = type(critic).__name__
    check_devices(critic, name, device)
    with forked_rng(device):
        observations = torch.randn(batch_size, observation_size, device=device)
        actions = torch.rand(batch_size, action_size, device=device) * 2 - 1
        q_values = run_checked(critic, (observations, actions), name, device)

    expected = (f"({batch_size}, E) with E >= {min_members} Q values per row" if not atoms else
                f"({batch_size}, E, {atoms}) with E >= {min_members} members of {atoms} logits "
                f"each (--critic-atoms {atoms}: the logits over each member's atoms)")
    if not isinstance(q_values, Tensor):
        raise ConfigError(
            f"{name}.forward returned a {type(q_values).__name__}, expected a tensor {expected}"
        )
    shape = tuple(q_values.shape)
    fits = (len(shape) == (3 if atoms else 2) and shape[0] == batch_size
            and shape[1] >= min_members and (not atoms or shape[2] == atoms))
    if not fits:
        raise ConfigError(f"{name}.forward returned shape {shape}, expected {expected}")
    check_tensor(name, q_values, "", shape, device, label="logit" if atoms else "Q")
    members = getattr(critic, "num_critics", None)
    if isinstance(members, int) and members != shape[1]:
        raise ConfigError(
            f"{name}.forward returned {shape[1]} {'members' if atoms else 'Q values'} per "
            f"row, but its num_critics is {members}"
        )


def _same_device(actual: torch.device, expected: torch.device) -> bool:
    # torch.device("cuda") names the current device; a tensor's device always has its index.
    if expected.type == "cuda" and expected.index is None and torch.cuda.is_available():
        expected = torch.device("cuda", torch.cuda.current_device())
    return actual == expected


def check_devices(module: nn.Module, name: str, device: torch.device) -> None:
    """Every parameter and buffer of ``module`` (class ``name``) on ``device``."""
    for tensor_name, tensor in itertools.chain(module.named_parameters(),
                                               module.named_buffers()):
        if not _same_device(tensor.device, device):
            raise ConfigError(
                f"{name} {tensor_name} is on {tensor.device}, expected {device} (register "
                "tensors as parameters or buffers so .to(device) moves them)"
            )


@contextmanager
def forked_rng(device: torch.device) -> Iterator[None]:
    """No gradients, and the random state of the CPU (and ``device``) put back on exit."""
    # The example batch and any noise the network draws must not shift the run's random
    # stream: a check that consumed numbers would make seeded runs differ from unchecked ones.
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        yield


def run_checked(module: nn.Module, inputs: tuple[Tensor, ...], name: str,
                device: torch.device, method: str = "forward", in_graph: bool = True) -> Any:
    """`module(*inputs)` (or `module.<method>(*inputs)`), on CUDA with host syncs turned into
    errors where it will run inside a graph (`in_graph`); any error becomes one ConfigError
    line naming the class and the user's line."""
    on_cuda = device.type == "cuda" and in_graph
    previous = torch.cuda.get_sync_debug_mode() if on_cuda else 0
    try:
        if on_cuda:
            with warnings.catch_warnings():
                # Its notice that the mode is a prototype: this check knows, and says so in
                # the protocol (a sync it misses is still caught when the step is captured).
                warnings.filterwarnings("ignore", message=_SYNC_MODE_NOTICE)
                torch.cuda.set_sync_debug_mode("error")
        return module(*inputs) if method == "forward" else getattr(module, method)(*inputs)
    except ConfigError:
        raise
    except Exception as error:
        if _SYNC_ERROR_TEXT in str(error):
            raise ConfigError(describe_host_sync(error, name, method)) from error
        shapes = ", ".join(str(tuple(t.shape)) for t in inputs)
        where = user_location(error)
        raise ConfigError(
            f"{name}.{method} raised {type(error).__name__}: {_first_line(error)}"
            f"{f' at {where}' if where else ''} (on a random batch of shape {shapes})"
        ) from error
    finally:
        if on_cuda:
            torch.cuda.set_sync_debug_mode(previous)


def check_tensor(name: str, value: Any, what: str, shape: tuple[int, ...],
                 device: torch.device, hint: str = "", label: str = "",
                 method: str = "forward") -> None:
    """`value` is a finite float32 tensor of `shape` on `device`; `what` names it ("action ")
    in messages, `label` in the non-finite one (default: `what`); `method` returned it."""
    named = f"{name}.{method}"
    if not isinstance(value, Tensor):
        raise ConfigError(f"{named} returned {what}of type {type(value).__name__}, "
                          "expected a tensor")
    if tuple(value.shape) != shape:
        raise ConfigError(f"{named} returned {what}shape {tuple(value.shape)}, "
                          f"expected {shape}{hint}")
    if value.dtype != torch.float32:
        raise ConfigError(f"{named} returned {what}dtype {value.dtype}, "
                          "expected torch.float32")
    if not _same_device(value.device, device):
        raise ConfigError(f"{named} returned {what}on {value.device}, expected {device}")
    bad = int((~torch.isfinite(value)).sum())
    if bad:
        label = label or what.strip() or "output"
        raise ConfigError(f"{named} returned {bad} non-finite {label} values "
                          f"(NaN or inf) of {value.numel()} on a random batch")


def _check_action_range(name: str, actions: Tensor, method: str = "forward") -> None:
    low, high = float(actions.min()), float(actions.max())
    if low < -1.0 or high > 1.0:
        raise ConfigError(
            f"{name}.{method} returned actions in [{low:.6g}, {high:.6g}], expected [-1, 1] "
            "(squash with tanh)"
        )


# --------------------------------------------------------------------------------------------
# Naming the user's line in an error
# --------------------------------------------------------------------------------------------

# What a source line does that waits for the GPU, most specific first.
_SYNC_PATTERNS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"\.(item|tolist|cpu|numpy|nonzero)\("), lambda m: f".{m[1]}()"),
    (re.compile(r"\.to\(\s*['\"]cpu['\"]"), lambda m: ".to('cpu')"),
    (re.compile(r"\btorch\.(nonzero|unique|masked_select|argwhere)\("),
     lambda m: f"torch.{m[1]}()"),
    (re.compile(r"^\s*(if|elif|while|assert)\b"), lambda m: f"a Python `{m[1]}` on a tensor"),
    (re.compile(r"\b(bool|float|int|print)\("), lambda m: f"{m[1]}() on a tensor"),
)


def describe_host_sync(error: BaseException, cls_name: str, method: str = "forward") -> str:
    """One line saying where `cls_name.method` waited for the GPU, from `error`'s traceback.

    It names the innermost frame outside torch and rl_graphstep (the user's own line) and
    what that line does, e.g. `MyActor.forward calls .item() at my_actor.py:12
    (`x = q.item()`), which cannot run inside a CUDA graph: ...`. Any exception works, so
    this can be tested without a GPU.
    """
    frame = user_frame(error)
    what = "a synchronizing CUDA operation"
    where = ""
    if frame is not None:
        source = (frame.line or "").strip()
        for pattern, describe in _SYNC_PATTERNS:
            match = pattern.search(source)
            if match:
                what = describe(match)
                break
        where = f" at {display_path(frame.filename)}:{frame.lineno}"
        if source:
            where += f" (`{source}`)"
    return f"{cls_name}.{method} calls {what}{where}, {_GRAPH_HINT}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
