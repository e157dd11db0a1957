"""What the command lines share: an argument parser whose errors are one line, and a quiet
Ctrl-C while the entry module is still importing torch. Standard library only, so the guard
can be installed before the heavy imports."""

from __future__ import annotations

import argparse
import atexit
import difflib
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import NoReturn

from rl_graphstep.core.errors import type_name

__all__ = [
    "OneLineParser",
    "argument_list",
    "end_startup_guard",
    "exit_quietly",
    "launch_time",
    "mark_launch",
    "open_closed_streams",
    "startup_guard",
    "suggested_command",
]

STARTUP_INTERRUPTED = "stopped: interrupted during start-up"

# The Unix time the command's process started (see mark_launch), until a run takes it.
_launched: float | None = None

# argparse's wordings (Lib/argparse.py) that read better as "--flag must be ..." lines.
_INVALID_VALUE = re.compile(r"argument (?P<flag>\S+?)(?:/\S+)?: invalid (?P<kind>\w+) value: "
                            r"(?P<value>.*)")
_KINDS = {"int": "an int", "float": "a number", "str": "a string"}


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that takes no abbreviations (``--learning 0`` is not
    ``--learning-starts 0``) and reports every mistake as one ``ConfigError`` line (a
    mistyped flag with the nearest real one) instead of a usage block and ``SystemExit``.
    ``--help`` still prints the help and exits 0.

    ``removed``: flags that no longer exist -> the line that names what replaced them. They
    are not arguments of the parser, so they are never offered as the nearest flag."""

    def __init__(self, *args: object, removed: Mapping[str, str] | None = None,
                 **kwargs: object) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.removed: Mapping[str, str] = dict(removed or {})

    def flags(self) -> list[str]:
        """Every ``--flag`` this parser knows but ``--help`` (no setting to suggest)."""
        return [flag for action in self._actions for flag in action.option_strings
                if flag.startswith("--") and not isinstance(action, argparse._HelpAction)]

    def error(self, message: str) -> NoReturn:
        # Imported here: this module must not import torch (see startup_guard).
        from rl_graphstep.core.errors import ConfigError

        raise ConfigError(self._one_line(message))

    def _one_line(self, message: str) -> str:
        if message.startswith("unrecognized arguments: "):
            return self._unknown(message.removeprefix("unrecognized arguments: ").split())
        invalid = _INVALID_VALUE.fullmatch(message)
        if invalid:
            kind = _KINDS.get(invalid["kind"], f"a valid {invalid['kind']}")
            return f"{invalid['flag']} must be {kind}, got {invalid['value']}"
        message = message.replace(": expected one argument", " needs a value")
        message = message.replace(": expected at least one argument", " needs one or more values")
        return " ".join(message.removeprefix("argument ").split())

    def _unknown(self, extras: list[str]) -> str:
        flag = next((word for word in extras if word.startswith("-")), None)
        if flag is None:
            return (f"unexpected argument {extras[0]!r}; every setting is a --flag "
                    f"(see {self.prog} --help)")
        name = flag.split("=", 1)[0]
        if name in self.removed:
            return self.removed[name]
        close = difflib.get_close_matches(name, self.flags(), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"see {self.prog} --help"
        return f"unknown flag {name} ({hint})"


def argument_list(argv: object, entry: str, example: str = "['--env', 'Pendulum-v1']"
                  ) -> list[str] | None:
    """``argv`` as a list of str (None stays None: ``sys.argv[1:]``). A Python caller's
    string would be parsed character by character, and anything else fail deep in
    argparse: ``TypeError`` naming the ``entry`` (``load_config()``) and what it takes."""
    if argv is None:
        return None
    takes = f"{entry} takes a list of arguments such as {example}"
    if isinstance(argv, str):
        raise TypeError(f"{takes}, got a str (split it into a list, as shlex.split does)")
    if isinstance(argv, bytes) or not isinstance(argv, Sequence):
        raise TypeError(f"{takes}, got {type_name(argv)}")
    for position, item in enumerate(argv):
        if not isinstance(item, str):
            raise TypeError(f"{takes}, each a str, got {item!r} ({type_name(item)}) at "
                            f"position {position}")
    return list(argv)


def suggested_command(command: str, *args: str) -> str:
    """``python -m rl_graphstep.<command> <args>`` (command: train, evaluate or sweep) as a
    line to paste into a shell and run as printed: each argument quoted where a POSIX shell
    needs it (a path with a space), and the interpreter running now named by its path where
    the ``python`` a shell finds is another one (a virtual environment run by its path, not
    activated)."""
    return " ".join([_python(), "-m", f"rl_graphstep.{command}", *map(shlex.quote, args)])


def _python() -> str:
    found = shutil.which("python")
    here = sys.executable
    try:
        # The same folder too: a venv's python is a link to the system's, which lacks the venv.
        if found and here and os.path.dirname(os.path.abspath(found)) == os.path.dirname(
                here) and os.path.samefile(found, here):
            return "python"
    except OSError:
        pass
    return shlex.quote(here) if here else "python"


def _interrupted_during_startup(_signum: int, _frame: FrameType | None) -> None:
    print(STARTUP_INTERRUPTED, file=sys.stderr, flush=True)
    # Out at once with 130, as a shell reports a Ctrl-C: nothing is written yet, and an
    # exception raised here would surface inside whatever import is under way (an extension
    # module's initialisation turns it into an unrelated error with a traceback).
    os._exit(128 + signal.SIGINT)


def _ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def startup_guard() -> None:
    """Turn a Ctrl-C into one line and exit 130 until :func:`end_startup_guard`. Only for
    the ``__main__`` path of an entry module, before its heavy imports: a library user's
    handler is never replaced. Standard streams closed at the start are opened on the null
    device first (see :func:`open_closed_streams`), and a side thread's file-system error is
    left to the main thread to report (see :func:`_side_thread_error`).

    Also ignores Ctrl-C once the last exit handler has run (registered first, it runs last):
    after that the interpreter gives SIGINT back its default action, and in the half second
    of torch's teardown that follows a Ctrl-C would kill the process by signal, losing the
    exit code that :func:`exit_quietly` was handed."""
    open_closed_streams()
    threading.excepthook = _side_thread_error
    signal.signal(signal.SIGINT, _interrupted_during_startup)
    atexit.register(_ignore_ctrl_c)


def _side_thread_error(args: threading.ExceptHookArgs) -> None:
    """An OSError ends a side thread quietly (tensorboard's event writer, when the run
    folder is deleted or the disk is full): the main thread meets the same failure at its
    next write and says it in one line. Anything else is printed as threads print it."""
    if not isinstance(args.exc_value, OSError):
        threading.__excepthook__(args)


def open_closed_streams() -> None:
    """Open each standard stream that the command was started without (``train >&-``) on
    the null device, as if its output had been sent there. Python leaves such a stream
    ``None``, so the first line printed would end the run with a traceback, and the first
    file the run opened would take the free descriptor: the env workers' and the libraries'
    output to it would then land in an event file or a checkpoint."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            # Takes descriptor fd: the lowest free one, as those below it are open by now.
            os.open(os.devnull, os.O_RDWR)
            if getattr(sys, name) is None:  # a stream for the process's lifetime
                setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115


def end_startup_guard() -> bool:
    """Give Ctrl-C back its usual ``KeyboardInterrupt`` (the entry's ``main`` handles that);
    does nothing when :func:`startup_guard` was not installed. Returns whether it was: the
    process runs as a command, not as a library."""
    if signal.getsignal(signal.SIGINT) is _interrupted_during_startup:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return True
    return False


def exit_quietly(code: int) -> NoReturn:
    """``sys.exit(code)`` for an entry's ``__main__`` path, where a Ctrl-C during the
    interpreter's shutdown (thread joins, atexit handlers) ends the process at once with
    ``code`` instead of printing a KeyboardInterrupt traceback, and one during torch's
    teardown after them is ignored (see :func:`startup_guard`): ``main`` has already said in
    one line how the run ended."""
    signal.signal(signal.SIGINT, lambda _signum, _frame: os._exit(code))
    sys.exit(code)


def process_start_time(proc: str = "/proc") -> float | None:
    """The Unix time this process started, from ``/proc/self/stat`` (its start in clock
    ticks after boot) and ``/proc/uptime``, to about 10 ms; None where there is no /proc
    (macOS, Windows) or it cannot be read. It counts the interpreter's own start-up."""
    try:
        with open(f"{proc}/self/stat") as file:
            stat = file.read()
        with open(f"{proc}/uptime") as file:
            uptime = float(file.read().split()[0])
        # The command name (field 2) may hold spaces and parentheses: count from its end.
        # Field 22, starttime, is the 20th after it.
        started_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - started_ticks / ticks)


def mark_launch() -> None:
    """Note when the command was launched, for the run to record (see :func:`launch_time`):
    the process's start where /proc tells it, else now. Called first thing by an entry's
    ``__main__`` path, before torch is imported."""
    global _launched
    _launched = process_start_time() or time.time()


def launch_time() -> float:
    """When the run that asks was launched, as a Unix time: the command's process start
    noted by :func:`mark_launch` (taken once: a second run in the process is launched when
    it asks), else now (a ``train()`` called from Python starts when it is called). A
    benchmark measures time to a result from it (start-up and compiling included)."""
    global _launched
    launched, _launched = _launched, None
    return time.time() if launched is None else launched
