"""What an environment's ``reset`` and ``step`` return, checked against the spaces it declares,
where it returns them: one line naming the env, the method and what came back, instead of a
traceback from the buffer or the vector env that met it later.

``SpaceCheck`` sits directly on what the env's entry point made (below gymnasium's own
wrappers), on every copy a run or an evaluation steps, in this process or in a worker.
"""

from __future__ import annotations

import contextlib
import reprlib
import signal
import threading
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any

import gymnasium as gym
import numpy as np

from rl_graphstep.core.errors import EnvError, first_line, user_frame, user_location

__all__ = ["SpaceCheck", "raised_line"]

_NUMBERS = "biuf"  # numpy kinds a float32 buffer takes: bool, int, uint, float
_STEP_API = "(observation, reward, terminated, truncated, info)"


def raised_line(method: str, exc: BaseException) -> str:
    """``the environment's step raised ValueError: boom (at my_env.py:12)``."""
    where = user_location(exc)
    return (f"the environment's {method} raised {type(exc).__name__}: {first_line(exc)}"
            + (f" (at {where})" if where else ""))


class SpaceCheck(gym.Wrapper):
    """Raises ``EnvError`` when ``reset`` or ``step`` returns something its spaces cannot hold:
    an observation of another shape, or not numbers (or of a float dtype for an int space); a
    reward that is not one number; flags that are not bools; not gymnasium's tuples. An error
    the env itself raises becomes the same one line, with the user's line it came from.

    Each step checks at the cost of a few comparisons: the observation's shape, the types of
    what came back and the dtypes already found fit (a float64 observation for a float32
    space, say); anything else gets the full check, which raises or learns the new type.
    """

    def __init__(self, env: gym.Env, env_id: str) -> None:
        super().__init__(env)
        self.env_id = env_id
        space = env.observation_space
        self._shape = space.shape
        self._observation_dtypes = {space.dtype}
        self._reward_types: set[type] = {float, int}
        self._flag_types: set[type] = {bool, np.bool_}

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        try:
            result = self.env.reset(**kwargs)
        except EnvError:
            raise
        except Exception as exc:  # the env's own code: one line with the user's line
            raise EnvError(raised_line("reset", exc)) from exc
        if type(result) is not tuple or len(result) != 2:
            self._refuse("reset", f"{_returned(result)}, but gymnasium's reset returns 2: "
                                  "(observation, info)")
        observation, info = result
        self._check_observation("reset", observation)
        if not isinstance(info, dict):
            self._refuse("reset", f"info {_shown(info)}, but info must be a dict")
        return result

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict]:
        try:
            result = self.env.step(action)
        except EnvError:
            raise
        except Exception as exc:
            raise EnvError(raised_line("step", exc)) from exc
        if type(result) is not tuple or len(result) != 5:
            self._refuse("step", f"{_returned(result)}, but gymnasium's step returns 5: "
                                 f"{_STEP_API}")
        observation, reward, terminated, truncated, info = result
        # The common case in a few comparisons; anything else is checked in full.
        if not (type(observation) is np.ndarray and observation.shape == self._shape
                and observation.dtype in self._observation_dtypes
                and type(reward) in self._reward_types and type(terminated) in self._flag_types
                and type(truncated) in self._flag_types and type(info) is dict):
            self._check_step(observation, reward, terminated, truncated, info)
        return result

    def close(self) -> None:
        """Close the env; an error of its own is a warning, not a failed run: the run's
        work is saved by then (and an async env's start closes a first copy). So is a close
        that has not returned after ``CLOSE_SECONDS``, where a timer can stop it (see
        ``_time_limit``): it held a finished run, its signals only noted, until kill -9."""
        try:
            with _time_limit(CLOSE_SECONDS):
                self.env.close()
        except _TimedOut as exc:
            where = user_location(exc)
            _warn_at_user_line(f"the environment's close had not returned after "
                               f"{CLOSE_SECONDS:g} s" + (f" (at {where})" if where else "")
                               + "; left unclosed", exc)
        except Exception as exc:
            _warn_at_user_line(f"{raised_line('close', exc)}; ignored", exc)

    def _check_step(self, observation: Any, reward: Any, terminated: Any, truncated: Any,
                    info: Any) -> None:
        self._check_observation("step", observation)
        if not _is_number(reward, _NUMBERS):
            self._refuse("step", f"a reward {_described(reward)}, but a reward must be one "
                                 "number")
        self._reward_types.add(type(reward))
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            if not _is_number(flag, "biu"):
                self._refuse("step", f"{name} {_described(flag)}, but {name} must be a bool")
            self._flag_types.add(type(flag))
        if not isinstance(info, dict):
            self._refuse("step", f"info {_shown(info)}, but info must be a dict")

    def _check_observation(self, method: str, observation: Any) -> None:
        space = self.observation_space
        try:
            array = np.asarray(observation)
        except (TypeError, ValueError):  # a ragged list, say
            array = None
        if (array is None or array.dtype.kind not in _NUMBERS or array.shape != self._shape
                or not np.can_cast(array.dtype, space.dtype, "same_kind")):
            self._refuse(method, f"an observation {_described(observation)}, but its "
                                 f"observation space is {space}")
        if isinstance(observation, np.ndarray):
            self._observation_dtypes.add(observation.dtype)

    def _refuse(self, method: str, what: str) -> None:
        raise EnvError(f"environment {self.env_id!r}: {method} returned {what}")


def _warn_at_user_line(message: str, exc: BaseException) -> None:
    """A warning shown at the user's line ``exc`` came from, not at gymnasium's wrapper that
    called close."""
    frame = user_frame(exc)
    warnings.warn_explicit(message, UserWarning, frame.filename if frame else __file__,
                           (frame.lineno or 0) if frame else 0)


# How long an env's close may take before the run (or evaluation) goes on without it.
CLOSE_SECONDS = 10.0


class _TimedOut(BaseException):
    """Raised into a close that took too long: a BaseException, so that the env's own
    ``except Exception`` does not take it for an error of its own and carry on."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise ``_TimedOut`` into the block once ``seconds`` have passed, by SIGALRM: where the
    platform has it, on the main thread (where Python runs signal handlers) and when no other
    timer of the process is set; elsewhere the block runs unlimited."""
    if (not hasattr(signal, "setitimer") or threading.current_thread() is not
            threading.main_thread() or signal.getitimer(signal.ITIMER_REAL)[0] > 0):
        yield
        return
    running = True

    def expire(_signum: int, _frame: FrameType | None) -> None:
        if running:  # not once the block has ended, just before the timer is cleared
            raise _TimedOut

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        running = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def _is_number(value: Any, kinds: str) -> bool:
    """Whether ``value`` is one number (a scalar, or an array of no dimensions) of a numpy kind
    in ``kinds``."""
    if isinstance(value, bool | int | float | np.number | np.bool_ | np.ndarray):
        return np.ndim(value) == 0 and np.asarray(value).dtype.kind in kinds
    return False


def _returned(result: Any) -> str:
    """What a reset or step returned that is not the tuple it should be."""
    if type(result) is tuple:
        return f"{len(result)} value{'s' if len(result) != 1 else ''}"
    if isinstance(result, np.ndarray):
        return f"an array {_described(result)}"
    return _described(result)


def _described(value: Any) -> str:
    """``of shape (5,) and dtype float32`` for an array (or a list of numbers), the value and
    its type otherwise."""
    if isinstance(value, np.ndarray):
        return f"of shape {value.shape} and dtype {value.dtype}"
    if isinstance(value, list | tuple):
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):  # ragged
            array = None
        if array is not None and array.dtype.kind in _NUMBERS:
            return f"of shape {array.shape} and dtype {array.dtype} (a {type(value).__name__})"
    return _shown(value)


def _shown(value: Any) -> str:
    """``None``, or the value (shortened) and its type: ``'abc' (type str)``."""
    return "None" if value is None else f"{reprlib.repr(value)} (type {type(value).__name__})"
