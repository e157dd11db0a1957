"""Custom networks that plug in: load a class by name or file, build it, and check it once.

The checks run one forward pass on a random batch before anything is captured, so a wrong
shape, range or a host sync is reported as one line naming the class, not as a failed capture.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.errors import ConfigError, display_path, user_frame, user_location

__all__ = [
    "ActorKind",
    "NetworkSpec",
    "build_network",
    "check_actor",
    "check_critic",
    "describe_host_sync",
    "evaluation_action",
    "load_class",
]

NetworkSpec = str | type | nn.Module
"""A `package.module:Class` / `path/file.py:Class` string, an `nn.Module` class, or a module."""

ActorKind = str
""""stochastic" (SAC: forward returns (action, log_prob)) or "deterministic" (TD3, DDPG)."""

ACTOR_KINDS = ("stochastic", "deterministic")

_SPEC_FORMS = "'package.module:ClassName' or 'path/to/file.py:ClassName'"
_GRAPH_HINT = (
    "which cannot run inside a CUDA graph: keep tensors on the device "
    "(torch.where instead of if) or use --graph off"
)
# PyTorch's sync debug mode raises a RuntimeError with this text (c10/cuda/CUDAFunctions.h).
_SYNC_ERROR_TEXT = "synchronizing CUDA operation"
_SYNC_MODE_NOTICE = "Synchronization debug mode is a prototype feature"
# Module names for files loaded by path: a fresh one per load, so two files with one stem
# (or one file loaded twice) never share a sys.modules entry.
_file_module_ids = itertools.count()


# --------------------------------------------------------------------------------------------
# Loading and building
# --------------------------------------------------------------------------------------------


def load_class(spec: str) -> type:
    """The `nn.Module` subclass named by `spec`: `package.module:ClassName` (imported) or
    `path/to/file.py:ClassName` (executed from the file; a relative path is taken from the
    current directory).

    Raises:
        ConfigError: one line saying what is wrong with the spec, the module or the class.
    """
    location, sep, class_name = spec.rpartition(":")
    if not sep or not location or not class_name:
        raise ConfigError(f"network spec {spec!r} must be {_SPEC_FORMS}")
    _refuse_unfindable(spec, location, class_name)
    if _is_file_path(location):
        module = _module_from_file(spec, location)
    else:
        module = _import_module(spec, location)

    # A dotted name is a nested class (Outer.Inner), as a class's __qualname__ spells it.
    cls = module
    for part in class_name.split("."):
        cls = getattr(cls, part, None)
    if cls is None:
        raise ConfigError(
            f"{location} has no class {class_name!r}; it defines {_classes_defined(module)}"
        )
    if not isinstance(cls, type):
        raise ConfigError(f"{spec} is a {type(cls).__name__}, not a class")
    if not issubclass(cls, nn.Module):
        raise ConfigError(f"{spec} is not a torch.nn.Module subclass")
    return cls


def _refuse_unfindable(spec: str, location: str, class_name: str) -> None:
    """The specs a run records for a class passed from Python that nothing can import again
    (see ``rl_graphstep.netspec``): one line saying why, instead of a failed lookup."""
    again = ("pass the class itself again (to train with cfg.resume, or to evaluate), or "
             "move it into a module or file and give that spec")
    if "<locals>" in class_name:
        raise ConfigError(f"{spec!r} is a class defined inside a function, which cannot be "
                          f"imported again; {again}")
    if location == "__main__":
        raise ConfigError(f"{spec!r} is a class of an interactive session or `python -c` (a "
                          f"__main__ without a file), which cannot be imported again; {again}")


def _is_file_path(location: str) -> bool:
    # Module names have no slashes; a file path either has one or ends in .py.
    return location.endswith(".py") or "/" in location or os.sep in location


def _import_module(spec: str, module_name: str) -> Any:
    try:
        return _import_from_here(module_name)
    except ImportError as error:
        hint = ""
        if error.name == module_name.split(".")[0]:
            hint = (
                "; run from the folder that holds it or give the file form "
                "path/to/file.py:ClassName"
            )
        raise ConfigError(
            f"cannot import module {module_name!r} for {spec!r}: {error}{hint}"
        ) from error
    except Exception as error:  # the module's own code failed (a SyntaxError, say)
        raise ConfigError(
            f"cannot import module {module_name!r} for {spec!r}: {_raised(error)}"
        ) from error


def _raised(error: BaseException) -> str:
    """``RuntimeError: boom (at nets.py:3)``: the error's first line and the user's line."""
    where = user_location(error)
    return f"{type(error).__name__}: {_first_line(error)}" + (f" (at {where})" if where else "")


def _import_from_here(module_name: str) -> Any:
    """Import ``module_name``, also from the current directory: ``python -m`` puts it on
    ``sys.path`` but a console script (``rl-graphstep-train``) does not, and a spec such as
    ``examples.residual_actor:ResidualActor`` should work from either."""
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        here = os.getcwd()
        if error.name != module_name.split(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)  # last: never shadows an installed module
        return importlib.import_module(module_name)


def _module_from_file(spec: str, location: str) -> Any:
    path = Path(location).expanduser()
    if not path.is_file():
        relative = "" if path.is_absolute() else f" (relative paths are taken from {os.getcwd()})"
        raise ConfigError(f"file {location!r} for {spec!r} does not exist{relative}")
    # Absolute, so tracebacks and inspect still find the source after a chdir.
    path = path.resolve()
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_rl_graphstep_plugin_{next(_file_module_ids)}_{stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"cannot load {location!r} for {spec!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    # Registered before running it, as `import` does: dataclasses and pickling look it up there.
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except ImportError as error:
        del sys.modules[name]
        raise ConfigError(f"cannot import {location!r} for {spec!r}: {error}") from error
    except Exception as error:  # the file's own code failed (a SyntaxError, say)
        del sys.modules[name]
        raise ConfigError(f"cannot import {location!r} for {spec!r}: "
                          f"{_raised(error)}") from error
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _classes_defined(module: Any, limit: int = 5) -> str:
    names = [
        name
        for name, value in vars(module).items()
        if isinstance(value, type) and value.__module__ == module.__name__
    ]
    if not names:
        return "no classes"
    more = ", ..." if len(names) > limit else ""
    return "the classes " + ", ".join(names[:limit]) + more


def build_network(
    spec_or_obj: NetworkSpec,
    observation_space: gym.Space,
    action_space: gym.Space,
    kwargs: dict[str, Any] | None,
    *,
    role: str,
) -> nn.Module:
    """The network `spec_or_obj` names: a spec string or class is built as
    `cls(observation_space, action_space, **kwargs)`; a built `nn.Module` is returned as is.

    Args:
        spec_or_obj: a spec for :func:`load_class`, an `nn.Module` subclass, or a module.
        observation_space / action_space: the environment's single (not vectorised) spaces.
        kwargs: extra constructor arguments (`actor_kwargs` / `critic_kwargs`); must be empty
            for a built module, which has no constructor left to take them.
        role: "actor" or "critic"; it starts every message.

    Raises:
        ConfigError: the spec cannot be loaded, the class is not an `nn.Module`, the
            constructor does not take `(observation_space, action_space, **kwargs)`, or kwargs
            were given with a built module.
    """
    kwargs = dict(kwargs or {})
    if isinstance(spec_or_obj, nn.Module):
        if kwargs:
            raise ConfigError(
                f"{role}: {role}_kwargs {sorted(kwargs)} were given, but the {role} is an "
                f"already built {type(spec_or_obj).__name__}; pass kwargs with a class or spec"
            )
        return spec_or_obj

    if isinstance(spec_or_obj, str):
        try:
            cls = load_class(spec_or_obj)
        except ConfigError as error:
            raise ConfigError(f"{role}: {error}") from error
    elif isinstance(spec_or_obj, type):
        cls = spec_or_obj
        if not issubclass(cls, nn.Module):
            raise ConfigError(f"{role}: {cls.__qualname__} is not a torch.nn.Module subclass")
    else:
        raise ConfigError(
            f"{role} must be a {_SPEC_FORMS} string, an nn.Module class or an nn.Module, "
            f"got {type(spec_or_obj).__name__}"
        )

    try:
        network = cls(observation_space, action_space, **kwargs)
    except TypeError as error:
        given = f" (given {role}_kwargs {sorted(kwargs)})" if kwargs else ""
        raise ConfigError(
            f"{role}: cannot build {cls.__qualname__}: its constructor must take "
            f"(observation_space, action_space, **kwargs){given}; "
            f"TypeError: {_first_line(error)}"
        ) from error
    except Exception as error:  # the constructor's own code failed
        raise ConfigError(f"{role}: cannot build {cls.__qualname__}: {_raised(error)}"
                          ) from error
    return network


# --------------------------------------------------------------------------------------------
# Checking on an example batch
# --------------------------------------------------------------------------------------------


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
    _check_devices(actor, name, device)
    with _forked_rng(device):
        observations = torch.randn(batch_size, observation_size, device=device)
        output = _run_forward(actor, (observations,), name, device)

    expected = (batch_size, action_size)
    if kind == "deterministic":
        if isinstance(output, tuple | list):
            raise ConfigError(
                f"{name}.forward returned a {type(output).__name__}, expected a tensor action "
                f"{expected} (a deterministic actor returns only the action)"
            )
        _check_tensor(name, output, "", expected, device)
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
    _check_tensor(name, actions, "action ", expected, device)
    _check_tensor(name, log_probs, "log_prob ", (batch_size,), device,
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
    with _forked_rng(device):
        # Evaluation runs it eagerly, never in a graph: a host sync there is allowed.
        action = _run_forward(actor, (observations,), name, device,
                              method="deterministic_action", in_graph=False)
    _check_tensor(name, action, "", expected, device, method="deterministic_action")
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
    batch_size: int = 256,
) -> None:
    """Run `critic(observations, actions)` once on a random batch and check its Q values.

    They must be (B, E) float32 and finite with E >= `min_members` (2 for the clipped double
    Q of SAC and TD3, 1 for DDPG), and E must equal `critic.num_critics` where the critic has
    that attribute. Devices, host syncs and random numbers are handled as in
    :func:`check_actor`.

    Raises:
        ConfigError: one line naming the class and what is wrong.
    """
    name = type(critic).__name__
    _check_devices(critic, name, device)
    with _forked_rng(device):
        observations = torch.randn(batch_size, observation_size, device=device)
        actions = torch.rand(batch_size, action_size, device=device) * 2 - 1
        q_values = _run_forward(critic, (observations, actions), name, device)

    if not isinstance(q_values, Tensor):
        raise ConfigError(
            f"{name}.forward returned a {type(q_values).__name__}, expected a tensor "
            f"({batch_size}, E) with E >= {min_members} Q values per row"
        )
    shape = tuple(q_values.shape)
    if len(shape) != 2 or shape[0] != batch_size or shape[1] < min_members:
        raise ConfigError(
            f"{name}.forward returned shape {shape}, expected ({batch_size}, E) with "
            f"E >= {min_members} Q values per row"
        )
    _check_tensor(name, q_values, "", shape, device, label="Q")
    members = getattr(critic, "num_critics", None)
    if isinstance(members, int) and members != shape[1]:
        raise ConfigError(
            f"{name}.forward returned {shape[1]} Q values per row, but its num_critics is "
            f"{members}"
        )


def _same_device(actual: torch.device, expected: torch.device) -> bool:
    # torch.device("cuda") names the current device; a tensor's device always has its index.
    if expected.type == "cuda" and expected.index is None and torch.cuda.is_available():
        expected = torch.device("cuda", torch.cuda.current_device())
    return actual == expected


def _check_devices(module: nn.Module, name: str, device: torch.device) -> None:
    for tensor_name, tensor in itertools.chain(module.named_parameters(),
                                               module.named_buffers()):
        if not _same_device(tensor.device, device):
            raise ConfigError(
                f"{name} {tensor_name} is on {tensor.device}, expected {device} (register "
                "tensors as parameters or buffers so .to(device) moves them)"
            )


@contextmanager
def _forked_rng(device: torch.device) -> Iterator[None]:
    # The example batch and any noise the network draws must not shift the run's random
    # stream: a check that consumed numbers would make seeded runs differ from unchecked ones.
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        yield


def _run_forward(module: nn.Module, inputs: tuple[Tensor, ...], name: str,
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


def _check_tensor(name: str, value: Any, what: str, shape: tuple[int, ...],
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

