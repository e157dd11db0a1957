"""A vector env whose copies step in worker processes that wait on shared memory, not pipes.

gymnasium's ``AsyncVectorEnv`` hands every step to each worker through a pipe, so each step
costs a process wake-up on both sides of every pipe. With K seeds of one env each, that is
most of an iteration. Here each worker owns a contiguous slice of the envs and polls its
command counter in shared memory. The results (observations, rewards, flags, final
observations) go straight into shared arrays, which the main process polls in turn.

A worker polls without sleeping for a while after each step (``SPIN_SECONDS``), then backs
off to short sleeps, so an idle run does not hold its CPUs. The polling takes no lock (a lock
taken on every poll costs a process wake-up whenever the two sides meet on it: 140 µs per
Pendulum step against 45 without, on 2 CPUs): each side writes its data first and its counter
last, and reads the counter first and the data after. x86-64 keeps stores in order and loads
in order, which makes that safe; other CPUs may reorder them, so this env is refused there.
Autoreset is SAME_STEP, as in ``rl_graphstep.envs.vector``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import platform
import signal
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rl_graphstep.core.errors import STOP_SIGNALS, ConfigError, EnvError
from rl_graphstep.envs.check import raised_line
from rl_graphstep.envs.make import make_env

__all__ = ["SharedMemoryVectorEnv", "ordered_stores"]

SPIN_SECONDS = 0.005  # a worker polls without sleeping this long after its last command
IDLE_SLEEP = 1e-4  # then sleeps this long between polls
LIVENESS_SECONDS = 0.05  # how often a waiting side checks that the other is still there
_STEP, _RESET, _CLOSE = 1, 2, 3


class _Shared:
    """The arrays both sides see, as numpy views of raw shared memory."""

    def __init__(self, num_envs: int, observation_space: gym.spaces.Box,
                 action_space: gym.spaces.Box, workers: int, raw: dict[str, Any] | None = None,
                 context: Any = mp) -> None:
        obs_shape, obs_dtype = observation_space.shape, observation_space.dtype
        act_shape, act_dtype = action_space.shape, action_space.dtype
        layout = {
            "actions": ((num_envs, *act_shape), act_dtype),
            "observations": ((num_envs, *obs_shape), obs_dtype),
            "final_observations": ((num_envs, *obs_shape), obs_dtype),
            "rewards": ((num_envs,), np.float64),
            "terminations": ((num_envs,), np.bool_),
            "truncations": ((num_envs,), np.bool_),
            "commands": ((workers, 2), np.int64),  # (sequence number, kind) per worker
            "done": ((workers,), np.int64),  # the sequence number done; its negative on error
        }
        if raw is None:
            raw = {name: context.RawArray("b", max(1, int(np.prod(shape))
                                                   * np.dtype(dtype).itemsize))
                   for name, (shape, dtype) in layout.items()}
        self.raw = raw
        for name, (shape, dtype) in layout.items():
            view = np.frombuffer(raw[name], dtype=dtype, count=int(np.prod(shape)))
            setattr(self, name, view.reshape(shape))


def _work(worker: int, env_id: str, envs: range, spaces: tuple[gym.Space, gym.Space],
          workers: int, raw: dict[str, Any], pipe: Any, parent: int) -> None:
    """A worker's loop: step (or reset, or close) its envs whenever its command counter moves."""
    # A Ctrl-C, SIGHUP or SIGTERM to the process group (a terminal, a batch system) is the
    # training loop's to handle: it finishes its step, saves and closes us. We end with it
    # regardless, by the parent check below.
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    num_envs = len(raw["rewards"]) // np.dtype(np.float64).itemsize
    shared = _Shared(num_envs, *spaces, workers, raw)
    try:
        copies = [make_env(env_id) for _ in envs]
    except Exception as exc:  # the main process made one, so this is rare: say why, and stop
        pipe.send(_failure("make", exc))
        return
    seen, last_command = 0, time.perf_counter()
    while True:
        sequence = int(shared.commands[worker, 0])  # the counter first, then what it says
        kind = int(shared.commands[worker, 1])
        if sequence == seen:
            idle = time.perf_counter() - last_command
            if idle > SPIN_SECONDS:
                time.sleep(IDLE_SLEEP)
                if os.getppid() != parent:  # the training process is gone: so are we
                    return
            continue
        seen, last_command = sequence, time.perf_counter()
        try:
            if kind == _CLOSE:
                for env in copies:
                    env.close()
                return
            if kind == _RESET:
                _reset(shared, copies, envs, pipe.recv())
            else:
                _step(shared, copies, envs)
            outcome = sequence
        except Exception as exc:  # the env's own code failed: one line back to the loop
            pipe.send(_failure("reset" if kind == _RESET else "step", exc))
            outcome = -sequence
        shared.done[worker] = outcome  # after the results: see the module's docstring


def _failure(what: str, exc: Exception) -> str:
    """The line the training loop shows for an env that raised in ``what`` (a ``SpaceCheck``
    error, or make_env's, is one already)."""
    return str(exc) if isinstance(exc, EnvError) else raised_line(what, exc)


def _reset(shared: _Shared, copies: list[gym.Env], envs: range, seeds: list[int | None]) -> None:
    for env, index, seed in zip(copies, envs, seeds, strict=True):
        shared.observations[index], _ = env.reset(seed=seed)


def _step(shared: _Shared, copies: list[gym.Env], envs: range) -> None:
    for env, index in zip(copies, envs, strict=True):
        observation, reward, terminated, truncated, _ = env.step(shared.actions[index])
        shared.rewards[index] = reward
        shared.terminations[index], shared.truncations[index] = terminated, truncated
        if terminated or truncated:
            shared.final_observations[index] = observation
            observation, _ = env.reset()
        shared.observations[index] = observation


def ordered_stores() -> bool:
    """Whether this host is x86-64, whose ordered stores the workers' lock-free polling needs."""
    return platform.machine().lower() in ("x86_64", "amd64")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_workers(cpus: int) -> int:
    """Worker processes for a run that may use ``cpus`` CPUs: one per CPU but the one the
    training loop runs on."""
    return max(1, cpus - 1)


class SharedMemoryVectorEnv(VectorEnv):
    """``num_envs`` copies of ``env_id`` stepped by ``workers`` processes (at most one per env,
    by default one per CPU but one), each owning a contiguous slice of the envs.

    Steps in two halves as ``AsyncVectorEnv`` does (``step_async`` hands the actions over,
    ``step_wait`` returns the results), so the caller can launch GPU work in between; ``step``
    is both. SAME_STEP autoreset: an ended episode's last observation is in
    ``infos["final_obs"]`` (mask ``infos["_final_obs"]``). ``check(observation_space,
    action_space)``, where given, vets the spaces before the shared memory is laid out for them.
    """

    def __init__(self, env_id: str, num_envs: int, *, workers: int | None = None,
                 context: str | None = None,
                 check: Callable[[gym.Space, gym.Space], None] | None = None) -> None:
        if not ordered_stores():
            raise ConfigError(f"--vec-env shared needs an x86-64 host (its lock-free polling "
                              f"relies on x86's ordered stores), this one is "
                              f"{platform.machine()}: use --vec-env async or sync")
        probe = make_env(env_id)
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        probe.close()
        if check is not None:  # before the shared memory is laid out for the spaces
            check(self.single_observation_space, self.single_action_space)
        self.num_envs = num_envs
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.render_mode = None
        self.env_id = env_id
        count = workers or default_workers(usable_cpus())
        slices = [s for s in np.array_split(np.arange(num_envs), min(count, num_envs)) if len(s)]
        self._slices = [range(int(s[0]), int(s[-1]) + 1) for s in slices]
        ctx = mp.get_context(context)
        spaces = (self.single_observation_space, self.single_action_space)
        self._shared = _Shared(num_envs, *spaces, len(self._slices), context=ctx)
        pipes = [ctx.Pipe() for _ in self._slices]
        self._pipes = [mine for mine, _ in pipes]
        self._processes = [
            ctx.Process(target=_work, name=f"env worker {w}", daemon=True,
                        args=(w, env_id, envs, spaces, len(self._slices), self._shared.raw,
                              theirs, os.getpid()))
            for w, (envs, (_, theirs)) in enumerate(zip(self._slices, pipes, strict=True))
        ]
        for process in self._processes:
            process.start()
        self._sequence = 0
        self._closed = False

    def _check_alive(self, worker: int, what: str) -> None:
        """One clear line if ``worker`` has stopped: its own reason where it gave one."""
        process, envs = self._processes[worker], self._slices[worker]
        if process.is_alive():
            return
        reason = None
        with contextlib.suppress(EOFError, OSError):  # no reason left: the pipe is closed
            if self._pipes[worker].poll():
                reason = self._pipes[worker].recv()
        if reason is not None:
            raise EnvError(reason)
        raise EnvError(f"{process.name} (envs {envs.start}-{envs.stop - 1}) stopped with "
                       f"exit code {process.exitcode} during the envs' {what}")

    def _command(self, kind: int, what: str) -> None:
        self._sequence += 1
        for worker in range(len(self._processes)):
            self._check_alive(worker, what)
            self._shared.commands[worker, 1] = kind  # what to do first, the counter last
            self._shared.commands[worker, 0] = self._sequence

    def _wait(self, what: str) -> None:
        """Until every worker has done the current command; one clear line if one failed or
        died."""
        pending = list(range(len(self._processes)))
        checked = time.perf_counter()
        errors = []
        while pending:
            still = []
            for worker in pending:
                done = int(self._shared.done[worker])
                if done == -self._sequence:
                    errors.append(self._pipes[worker].recv())
                elif done != self._sequence:
                    still.append(worker)
            pending = still
            if pending and time.perf_counter() - checked > LIVENESS_SECONDS:
                checked = time.perf_counter()
                for worker in pending:
                    self._check_alive(worker, what)
        if errors:
            raise EnvError(errors[0])

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Reset every copy: copy i with ``seed + i`` (an int), ``seed[i]`` (a list) or unseeded."""
        del options
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        self._command(_RESET, "reset")
        for pipe, envs in zip(self._pipes, self._slices, strict=True):
            pipe.send(seeds[envs.start:envs.stop])
        self._wait("reset")
        return self._shared.observations.copy(), {}

    def step_async(self, actions: np.ndarray) -> None:
        """Hand the actions over; the workers start stepping at once."""
        self._shared.actions[:] = actions
        self._command(_STEP, "step")

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """The results of the step ``step_async`` started (copies: the next step rewrites the
        shared arrays)."""
        self._wait("step")
        shared = self._shared
        terminations, truncations = shared.terminations.copy(), shared.truncations.copy()
        infos: dict[str, Any] = {}
        ended = terminations | truncations
        if ended.any():
            final = np.empty(self.num_envs, dtype=object)
            for index in np.flatnonzero(ended):
                final[index] = shared.final_observations[index].copy()
            infos = {"final_obs": final, "_final_obs": ended}
        return (shared.observations.copy(), shared.rewards.copy(), terminations, truncations,
                infos)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                 np.ndarray, dict]:
        self.step_async(actions)
        return self.step_wait()

    def close(self, **kwargs: Any) -> None:
        """Stop the workers (those that do not stop within a second are terminated)."""
        del kwargs
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(EnvError):  # a dead worker is terminated below anyway
            self._command(_CLOSE, "close")
        for process in self._processes:
            process.join(timeout=1.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=1.0)
        for pipe in self._pipes:
            pipe.close()

    def __getstate__(self) -> dict:
        raise TypeError("a SharedMemoryVectorEnv's envs live in its worker processes and "
                        "do not pickle")

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()
