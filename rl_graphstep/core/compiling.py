"""``torch.compile`` plumbing: when compiling pays for a run, compiling a method now or part by
part with a fallback to the uncompiled code, and quiet compiling (the compiler's notices about
choices this project makes on purpose are silenced, exactly those and only while building)."""

from __future__ import annotations

import contextlib
import logging
import math
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rl_graphstep.core.capture import describe_error, root_cause

# Measured on an H200 (benchmarks/LOG.md): compiling SAC's two steps and its target update
# took 26-36 s in a fresh process (10-16 s with the compiler's on-disk cache warm), and saved
# about 440 µs per update (783 -> 342 µs). The estimate below takes a cold compile and a
# rounded-down saving, so "auto" compiles only where it surely pays.
COMPILE_SECONDS = 30.0
SAVED_SECONDS_PER_UPDATE = 4.0e-4


def updates_ahead(total_timesteps: int, global_step: int, learning_starts: int, num_envs: int,
                  updates_per_step: int) -> int:
    """How many updates a run still makes: one round per iteration of ``num_envs`` env steps
    from ``learning_starts`` (or where it resumes) to ``total_timesteps``."""
    first = max(global_step, learning_starts)
    return max(math.ceil((total_timesteps - first) / num_envs), 0) * updates_per_step


def compile_pays(updates: int) -> tuple[bool, str]:
    """Whether compiling before ``updates`` captured updates is estimated to save more time
    than it costs, and the reason in a few words for the run's mode line."""
    saved = updates * SAVED_SECONDS_PER_UPDATE
    pays = saved > COMPILE_SECONDS
    relation = "more" if pays else "less"
    return pays, (f"{updates:,} updates would save about {saved:.0f} s, {relation} than the "
                  f"~{COMPILE_SECONDS:.0f} s compilation takes")


# Compiled versions allowed per code object while a step compiles (torch's default is 8).
_RECOMPILE_LIMIT = 1024


def _own_code(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` rebuilt on a copy of its code object.

    ``torch.compile`` keeps compiled versions per code object, guarded on the objects they
    read (this body's module and optimizer), and stops compiling a code object after
    ``recompile_limit`` (8) versions. All bodies share their methods' code, so without a copy
    the ninth step built in a process would silently run uncompiled."""
    function = method.__func__
    code = function.__code__.replace()
    fresh = types.FunctionType(code, function.__globals__, function.__name__,
                               function.__defaults__, function.__closure__)
    return types.MethodType(fresh, method.__self__)


class outside_compiler:  # a decorator, named as one
    """Method decorator: ``torch.compiler.disable`` on the method, applied just before this
    process first compiles (:func:`compile_static`), a plain method until then. Applied at
    import, it would import the compiler (1-2 s) into every process, those that never build
    an optimizer (a bad flag's line, ``--help``, ``evaluate``) too."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self.method = method

    def __set_name__(self, owner: type, name: str) -> None:
        setattr(owner, name, self.method)
        _OUTSIDE_COMPILER.append((owner, name))


_OUTSIDE_COMPILER: list[tuple[type, str]] = []  # (class, method name), not yet disabled


def _keep_outside_compiler() -> None:
    """Disable the compiler on the methods marked :class:`outside_compiler` (once each)."""
    while _OUTSIDE_COMPILER:
        owner, name = _OUTSIDE_COMPILER.pop()
        setattr(owner, name, torch.compiler.disable(owner.__dict__[name]))


def compile_static(function: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(function, dynamic=False)``: every shape specialised, never symbolic.

    A step's shapes never change (a CUDA graph replays fixed shapes), but by default the
    compiler turns a dimension symbolic once it sees it change: between the critic's and
    the actor's optimizer in the code they share (``Adam.step``), or, through its profile
    kept on disk between processes, because an earlier run in another process had other
    shapes at the same line. The kernels of a step then depended on what ran before it."""
    _keep_outside_compiler()
    return torch.compile(function, dynamic=False)


def compile_now(method: Callable[..., Any], *args: Any, what: str
                ) -> Callable[..., Any] | None:
    """``torch.compile(method)`` (a bound method, on a code object of its own), compiled now
    by one call on ``args`` (make it a call without effect), so that a capture later records
    the compiled kernels instead of compiling inside the capture. None, with a one-line
    warning, where the compiler fails."""
    compiled = compile_static(_own_code(method))
    try:
        compiled(*args)
    except Exception as error:  # the compiler's own failures have no common base class
        warnings.warn(f"torch.compile failed on {what} ({describe_error(root_cause(error))}); "
                      f"it runs uncompiled", stacklevel=3)
        return None
    return compiled


class CompiledParts:
    """Named parts of one update (bound methods), each ``torch.compile``d on request.

    A part is compiled on its first call through :meth:`run`; one the compiler fails on
    (then, before it runs) stays uncompiled for good, with a one-line warning naming it and
    ``owner``, and :attr:`uncompiled` lists it.
    """

    def __init__(self, parts: dict[str, Callable[..., Any]], *, compile: bool,
                 owner: str) -> None:
        self.owner = owner
        self.uncompiled: list[str] = []
        # Each part: [what runs now, its uncompiled form, compiled calls so far].
        self._parts: dict[str, list[Any]] = {
            name: [compile_static(_own_code(part)) if compile else part, part, 0]
            for name, part in parts.items()
        }

    def run(self, name: str, *args: Any) -> Any:
        """Run a part, compiled where possible; on the compiler's failure at the first
        compiled call, fall back to the uncompiled part for good."""
        part = self._parts[name]
        if part[0] is part[1]:
            return part[1](*args)
        if part[2]:
            return part[0](*args)
        try:
            # Compiling happens here. Code the compiler reaches through a graph break (the
            # optimizer's own step wrapper, say) is shared by all steps and guarded on each
            # one's optimizer: lift the per-code limit of compiled versions for this call, or
            # the ninth step built in a process would run that code uncompiled.
            with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
                result = part[0](*args)
        except Exception as error:
            warnings.warn(
                f"torch.compile failed on the {name} of {self.owner} "
                f"({describe_error(root_cause(error))}); that part runs uncompiled",
                stacklevel=4)
            part[0] = part[1]
            self.uncompiled.append(name)
            return part[1](*args)
        part[2] += 1
        return result


# The compiler's notices about what this project chooses on purpose:
# - inductor's hint to enable TF32 (float32 matmuls stay exact unless --tf32 says otherwise);
# - dynamo's note that the optimizer's profiler annotation (record_function) is not traced.
_TF32_HINT = "TensorFloat32 tensor cores for float32 matrix multiplication available"
_PROFILER_NOTES = ("Profiler function", "Profiler record function")
_DYNAMO_LOGGERS = ("torch._dynamo.variables.ctx_manager", "torch._dynamo.variables.torch")


class _DropProfilerNotes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_PROFILER_NOTES)


@contextlib.contextmanager
def quiet_compiler() -> Iterator[None]:
    """Inside, the compiler's TF32 hint and its profiler-annotation notes are not shown;
    every other warning and log record is."""
    note_filter = _DropProfilerNotes()
    loggers = [logging.getLogger(name) for name in _DYNAMO_LOGGERS]
    for logger in loggers:
        logger.addFilter(note_filter)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_TF32_HINT)
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(note_filter)
