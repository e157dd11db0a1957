"""When ``torch.compile`` pays for a run, and quiet compiling: the notices the compiler prints
about choices this project makes on purpose are silenced, exactly those and only while building."""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator

# Measured on an H200 (benchmarks/README.md): compiling SAC's two steps and its target update
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
