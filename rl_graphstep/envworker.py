"""A vector env stepped in a worker process, so the environment runs while the host launches
the updates.

gymnasium's ``AsyncVectorEnv`` puts each env in its own process and pickles every step's
results through a pipe; here one worker runs the whole (sync) vector env, the step's arrays
cross through shared memory, and only a byte goes each way per step. Stepping is the same
code as in-process, so a run is the same run either way, checkpoints included. While
training, the worker keeps one CPU core busy polling for the next step.

Only what the training loop reads crosses back: observations, rewards, terminations,
truncations, and the final observations of the episodes that ended (``infos["final_obs"]``
and its mask ``infos["_final_obs"]``); other ``infos`` keys stay in the worker.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import numpy as np
from gymnasium.vector import VectorEnv

from rl_graphstep.errors import EnvError

__all__ = ["EnvWorker"]

# One-byte commands and replies.
_STEP, _RESET, _STATE, _CLOSE = b"s", b"r", b"p", b"c"
_DONE, _FAILED = b"d", b"e"


def _layout(num_envs: int, observation: np.dtype, observation_size: int,
            action_size: int) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The shared arrays, by name: dtype and shape."""
    return {
        "actions": (np.dtype(np.float64), (num_envs, action_size)),
        "observations": (observation, (num_envs, observation_size)),
        "rewards": (np.dtype(np.float64), (num_envs,)),
        "terminations": (np.dtype(np.bool_), (num_envs,)),
        "truncations": (np.dtype(np.bool_), (num_envs,)),
        "final_observations": (observation, (num_envs, observation_size)),
        "ended": (np.dtype(np.bool_), (num_envs,)),
    }


def _views(memory: Any, layout: dict[str, tuple[np.dtype, tuple[int, ...]]]
           ) -> dict[str, np.ndarray]:
    """numpy views of each array of ``layout`` inside the shared ``memory``."""
    views, offset = {}, 0
    for name, (dtype, shape) in layout.items():
        count = int(np.prod(shape))
        views[name] = np.frombuffer(memory, dtype=dtype, count=count, offset=offset
                                    ).reshape(shape)
        offset += _aligned_bytes(dtype, shape)
    return views


def _aligned_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    """An array's bytes rounded up to 8, so the next one starts aligned."""
    return -(-int(np.prod(shape)) * dtype.itemsize // 8) * 8


def _size(layout: dict[str, tuple[np.dtype, tuple[int, ...]]]) -> int:
    return sum(_aligned_bytes(dtype, shape) for dtype, shape in layout.values())


# How long a side polls the pipe before it blocks on it. Training hands a step over every few
# hundred microseconds; waking a blocked process takes tens of them, so both sides spin
# through that and block only when idle (a checkpoint, the end).
_SPIN_SECONDS = 0.005


def _receive(connection: Connection, parent: int | None = None) -> bytes:
    """The next message, polled for up to ``_SPIN_SECONDS`` before blocking. Given the
    ``parent``'s pid, a blocked wait checks every second that the parent still lives: one
    killed outright may leave its end of the pipe open in other processes it forked."""
    deadline = time.perf_counter() + _SPIN_SECONDS
    while not connection.poll():
        if time.perf_counter() >= deadline:
            while not connection.poll(1.0):
                if parent is not None and os.getppid() != parent:
                    raise EOFError("the parent process is gone")
            break
    return connection.recv_bytes()


def _serve(connection: Connection, pickled_envs: bytes, memory: Any,
           layout: dict[str, tuple[np.dtype, tuple[int, ...]]]) -> None:
    """The worker: runs commands until told to close or the parent goes away."""
    # Ctrl-C and SIGTERM reach the whole process group: the parent handles them (it saves a
    # checkpoint, which asks this worker for the envs' state), so the worker must live on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()
    envs: VectorEnv = pickle.loads(pickled_envs)
    shared = _views(memory, layout)
    while True:
        try:
            command = _receive(connection, parent)
        except (EOFError, OSError):  # the parent is gone
            envs.close()
            return
        try:
            if command[:1] == _STEP:
                # Back in the dtype they were given in (float64 holds them exactly): an env's
                # arithmetic may depend on it (NumPy keeps float32 * float in float32).
                actions = shared["actions"].astype(np.dtype(command[1:].decode()))
                observations, rewards, terminations, truncations, infos = envs.step(actions)
                shared["rewards"][:] = rewards
                shared["terminations"][:] = terminations
                shared["truncations"][:] = truncations
                _write_final(shared, infos)
            elif command == _RESET:
                observations, _ = envs.reset(seed=connection.recv())
                shared["ended"][:] = False
            elif command == _STATE:
                try:
                    state = cloudpickle.dumps(envs)
                except Exception:  # envs with native handles that do not pickle
                    state = None
                connection.send(state)
                continue
            elif command == _CLOSE:
                envs.close()
                connection.send_bytes(_DONE)
                return
            else:
                raise RuntimeError(f"unknown command {command!r}")
            shared["observations"][:] = observations
            connection.send_bytes(_DONE)
        except Exception as error:  # report it: the parent raises it as its own error
            connection.send_bytes(_FAILED + f"{type(error).__name__}: {error}".encode())


def _write_final(shared: dict[str, np.ndarray], infos: dict) -> None:
    mask = infos.get("_final_obs")
    if mask is None or not np.any(mask):
        shared["ended"][:] = False
        return
    shared["ended"][:] = mask
    for i in np.flatnonzero(mask):
        shared["final_observations"][i] = infos["final_obs"][i]


class EnvWorker:
    """``envs`` (a sync vector env, not yet reset) stepped in a worker process.

    ``start(actions)`` hands the actions over and returns at once; ``finish()`` waits for the
    step and returns what ``envs.step`` would (with the ``infos`` the module docstring names).
    ``step`` does both; the envs get the actions in the dtype they were given in. The
    returned arrays are fresh copies. ``state()`` is the envs pickled
    in the worker (for checkpoints; ``None`` if they do not pickle), and ``close()`` ends the
    worker. An env that raises in the worker raises :class:`EnvError` here.
    """

    def __init__(self, envs: VectorEnv) -> None:
        self.num_envs = envs.num_envs
        self.single_observation_space = envs.single_observation_space
        self.single_action_space = envs.single_action_space
        self.observation_space = envs.observation_space
        self.action_space = envs.action_space
        observation_size = int(np.prod(self.single_observation_space.shape))
        layout = _layout(self.num_envs, np.dtype(self.single_observation_space.dtype),
                         observation_size, int(np.prod(self.single_action_space.shape)))
        # fork where there is one: the worker starts at once and imports nothing; it never
        # touches CUDA, so a parent that did is safe to fork.
        methods = mp.get_all_start_methods()
        context = mp.get_context("fork" if "fork" in methods else None)
        memory = context.RawArray(ctypes.c_uint8, _size(layout))
        self._shared = _views(memory, layout)
        self._connection, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, cloudpickle.dumps(envs), memory, layout),
            name="rl_graphstep env worker", daemon=True)
        self._process.start()
        child.close()
        envs.close()
        self._stepping = False

    def reset(self, *, seed: int | list[int] | None = None) -> tuple[np.ndarray, dict]:
        self._send(_RESET, "reset", seed)
        self._reply("reset")
        return self._shared["observations"].copy(), {}

    def start(self, actions: np.ndarray) -> None:
        """Hand ``actions`` (num_envs, action_size) over; the worker starts stepping."""
        if self._stepping:
            raise RuntimeError("start() twice without finish(): collect the step first")
        actions = np.asarray(actions)
        self._shared["actions"][:] = actions
        self._send(_STEP + actions.dtype.str.encode(), "step")
        self._stepping = True

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Wait for the step :meth:`start` began; its results, as ``VectorEnv.step``'s."""
        if not self._stepping:
            raise RuntimeError("finish() without start(): hand the actions over first")
        self._stepping = False
        self._reply("step")
        shared = self._shared
        infos: dict = {}
        if shared["ended"].any():
            mask = shared["ended"].copy()
            final = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(mask):
                final[i] = shared["final_observations"][i].copy()
            infos = {"final_obs": final, "_final_obs": mask}
        return (shared["observations"].copy(), shared["rewards"].copy(),
                shared["terminations"].copy(), shared["truncations"].copy(), infos)

    def step(self, actions: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        self.start(actions)
        return self.finish()

    def state(self) -> bytes | None:
        """The envs as the worker holds them, cloudpickled (``None`` if they do not pickle)."""
        self._send(_STATE, "state")
        try:
            return self._connection.recv()
        except (EOFError, OSError):
            raise self._died("state") from None

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._connection.send_bytes(_CLOSE)
                self._connection.recv_bytes()
            except (EOFError, OSError):
                pass
            self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
        self._connection.close()

    def _send(self, command: bytes, what: str, *payload: Any) -> None:
        try:
            self._connection.send_bytes(command)
            for item in payload:
                self._connection.send(item)
        except OSError:  # a broken pipe: the worker is gone
            raise self._died(what) from None

    def _reply(self, what: str) -> None:
        try:
            reply = _receive(self._connection)
        except (EOFError, OSError):
            raise self._died(what) from None
        if reply != _DONE:
            raise EnvError(f"the environment failed in its worker process during {what}: "
                           f"{reply[1:].decode()}")

    def _died(self, what: str) -> EnvError:
        self._process.join(timeout=1)
        return EnvError(f"the environment worker process died during {what} (exit code "
                        f"{self._process.exitcode}); see its output above")
