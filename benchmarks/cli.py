"""What every benchmark's command line shares: bad input is one line that says what was wrong
and what would be right, and exit 2, never a traceback, and a job of many runs checks each
run's training flags before the first one starts, not after an hour.

    @cli_main
    def main(argv: Sequence[str] | None = None) -> int:
        ...

    if __name__ == "__main__":
        raise SystemExit(main())
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rl_graphstep.core.errors import RLGraphstepError, TrainingInterrupted


class BenchmarkError(Exception):
    """Bad input or unusable results a benchmark found: its message is the one line shown."""


def positive_int(text: str) -> int:
    """An argparse type: a positive int (updates, steps, rounds, envs)."""
    return _number(text, int, "a positive int", lambda v: v > 0)


def nonnegative_int(text: str) -> int:
    """An argparse type: an int of 0 or more (steps skipped, random steps before learning)."""
    return _number(text, int, "an int of 0 or more", lambda v: v >= 0)


def positive_float(text: str) -> float:
    """An argparse type: a positive, finite float (minutes, seconds, resources)."""
    return _number(text, float, "a positive number", lambda v: 0 < v < float("inf"))


def _number(text: str, kind: type, wanted: str, ok: Callable[[float], bool]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"takes {wanted}, got {text!r}")
    return value


def split_flags(text: str, what: str) -> list[str]:
    """Training flags given as one string, split as a shell would; a one-line
    ``BenchmarkError`` naming ``what`` (the option) where they cannot be (an unclosed quote)."""
    try:
        return shlex.split(text)
    except ValueError as error:
        raise BenchmarkError(f"{what}: {error} in {text!r}") from None


def check_training(env_id: str, flags: Sequence[str], what: str) -> None:
    """Raise a one-line ``BenchmarkError`` naming ``what`` (an arm, a group) if
    ``python -m rl_graphstep.train --env env_id *flags`` would refuse its flags or its env."""
    from rl_graphstep.envs.make import env_spec
    from rl_graphstep.run.flags import load_config

    try:
        env_spec(env_id)
        load_config(["--env", env_id, *flags])
    except RLGraphstepError as error:
        raise BenchmarkError(f"{what}: {error}") from None


def cli_main(main: Callable[..., int | None]) -> Callable[..., int]:
    """Decorate a benchmark's ``main``: its exit code, where what the package or a benchmark
    refuses (``RLGraphstepError``, ``BenchmarkError``) is one line on stderr and exit 2, and a
    stop by Ctrl-C exit 130 (128 + the signal's number for a training run it stopped).
    Anything else is a bug of the benchmark and keeps its traceback."""

    @functools.wraps(main)
    def guarded(*args: Any, **kwargs: Any) -> int:
        prog = Path(getattr(sys.modules.get(main.__module__), "__file__", None)
                    or sys.argv[0]).name
        try:
            return main(*args, **kwargs) or 0
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130
        except TrainingInterrupted as error:  # a training run in this process, stopped, saved
            print(f"{prog}: {error}", file=sys.stderr)
            return error.exit_code
        except (RLGraphstepError, BenchmarkError) as error:
            print(f"{prog}: error: {error}", file=sys.stderr)
            return 2

    return guarded
