"""n-step returns built on the host as transitions arrive: per env a window of its last n
steps, a row emitted once its n steps (or its episode's end) are known, and K seeds' rows
handed to the replay buffer in adds of a fixed size.

An emitted row is ``[s_t, a_t, R, c, s'_{t+k}]`` with ``R = sum_{j<k} gamma^j r_{t+j}`` and
the not_done column ``c = gamma^(k-1) (1 - terminated_{t+k-1})``, where k <= n stops at the
first step that terminated or truncated, or before a step the run dropped (non-finite). The
critic's target ``r + not_done * gamma * V(s')`` is then the n-step target with discount
gamma^k, and the ring, the row layout and the algorithms stay as they are; n = 1 gives the
one-step rows.

Rows per env per step vary (none in an episode's first n-1 steps, up to n at its end), so
ready rows wait in a per-seed queue, and each add takes at most ``num_envs`` rows per seed:
exactly ``num_envs`` with one seed (an add of one size keeps the captured ring write), with K
seeds a fixed K x num_envs staging whose unready rows are masked out (``keep``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["NStepRows", "ReadyRows"]

_COLUMNS = ("observations", "actions", "rewards", "next_observations", "not_dones")


class ReadyRows(NamedTuple):
    """One add's rows: K x num_envs of each column (float64), and ``keep`` (K x num_envs
    booleans, None for one seed: all of them) saying which are real."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_observations: np.ndarray
    not_dones: np.ndarray
    keep: np.ndarray | None


class NStepRows:
    """The n-step windows of ``seeds`` x ``num_envs`` envs (seed k's envs are k*num_envs ..
    k*num_envs+num_envs-1) and the rows ready for the buffer. `push` each vector step's
    transitions, then `take` one add's rows."""

    def __init__(self, n: int, gamma: float, seeds: int, num_envs: int, observation_size: int,
                 action_size: int) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        self.n, self.gamma, self.seeds, self.num_envs = int(n), float(gamma), seeds, num_envs
        envs = seeds * num_envs
        # The last n transitions of every env: step t sits at slot t % n. _pending[e] of them
        # (before the newest) start windows not emitted yet.
        self._observations = np.zeros((n, envs, observation_size))
        self._actions = np.zeros((n, envs, action_size))
        self._rewards = np.zeros((n, envs))
        self._next_observations = np.zeros((n, envs, observation_size))
        self._terminations = np.zeros((n, envs), dtype=bool)
        self._pending = np.zeros(envs, dtype=np.int64)
        self._step = 0  # pushes so far
        self._queues = [_empty(observation_size, action_size) for _ in range(seeds)]

    def push(self, observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
             next_observations: np.ndarray, terminations: np.ndarray, truncations: np.ndarray,
             finite: np.ndarray) -> None:
        """Add one vector step (one row per env; ``next_observations`` the real final ones at
        an episode's end) and queue the rows it completes. ``finite``: which envs' transitions
        the run stores; another one is left out and ends the windows before it."""
        t, slot = self._step, self._step % self.n
        self._observations[slot] = observations
        self._actions[slot] = np.asarray(actions).reshape(self._actions.shape[1:])
        self._rewards[slot] = np.asarray(rewards).reshape(-1)
        self._next_observations[slot] = next_observations
        self._terminations[slot] = np.asarray(terminations).reshape(-1)
        finite = np.asarray(finite, dtype=bool).reshape(-1)
        ended = finite & (np.asarray(terminations) | np.asarray(truncations)).reshape(-1)
        pending = self._pending
        # Window starting d steps back: ends now where the episode ended or it spans n steps;
        # ends at the step before where this one is dropped (d >= 1 there).
        envs, starts, ends = [], [], []
        for d in range(self.n):
            now = finite & (d <= pending) & (ended | (d == self.n - 1))
            cut = ~finite & (d >= 1) & (d <= pending)
            for mask, end in ((now, t), (cut, t - 1)):
                env = np.flatnonzero(mask)
                envs.append(env)
                starts.append(np.full(env.size, t - d))
                ends.append(np.full(env.size, end))
        self._queue(*(np.concatenate(part) for part in (envs, starts, ends)))
        self._pending = np.where(finite & ~ended, np.minimum(pending + 1, self.n - 1), 0)
        self._step += 1

    def cut(self) -> None:
        """End every pending window at the last step pushed (the episodes do not go on here:
        a resume whose envs restart, or of other windows) and queue its row."""
        env = np.repeat(np.arange(self._pending.size), self._pending)
        back = np.concatenate([np.arange(p, 0, -1) for p in self._pending]) if env.size else env
        self._queue(env, self._step - back, np.full(env.size, self._step - 1))
        self._pending[:] = 0

    def _queue(self, env: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """Queue the rows of the windows ``start``..``end`` (steps, both included) of ``env``,
        each seed's in env order, oldest first."""
        order = np.lexsort((start, env))
        env, start, end = env[order], start[order], end[order]
        n = self.n
        length = end - start + 1
        returns = self._rewards[start % n, env]  # j = 0: with n = 1, the reward itself
        with np.errstate(invalid="ignore", over="ignore"):  # slots past a window's end
            for j in range(1, n):  # R = r_t + gamma r_{t+1} + ..., summed in this order
                term = self.gamma ** j * self._rewards[(start + j) % n, env]
                returns = returns + np.where(j < length, term, 0.0)
        not_dones = (self.gamma ** (length - 1).astype(np.float64)
                     * (1.0 - self._terminations[end % n, env]))
        rows = (self._observations[start % n, env], self._actions[start % n, env], returns,
                self._next_observations[end % n, env], not_dones)
        seed = env // self.num_envs
        for k in np.unique(seed):
            mine = seed == k
            self._queues[k] = [np.concatenate((old, new[mine]))
                               for old, new in zip(self._queues[k], rows, strict=True)]

    def queued(self) -> tuple[int, ...]:
        """Each seed's rows ready for the buffer."""
        return tuple(len(queue[2]) for queue in self._queues)

    def take(self) -> ReadyRows | None:
        """The next add's rows, or None when there is nothing to add: with one seed exactly
        ``num_envs`` rows once that many are ready, with K seeds up to ``num_envs`` per seed."""
        size = self.num_envs
        counts = [min(size, ready) for ready in self.queued()]
        if (self.seeds == 1 and counts[0] < size) or not any(counts):
            return None
        columns = [np.zeros((self.seeds * size, *part.shape[1:])) for part in self._queues[0]]
        keep = np.zeros(self.seeds * size, dtype=bool)
        for k, count in enumerate(counts):
            for column, part in zip(columns, self._queues[k], strict=True):
                column[k * size: k * size + count] = part[:count]
            keep[k * size: k * size + count] = True
            self._queues[k] = [part[count:] for part in self._queues[k]]
        return ReadyRows(*columns, keep=None if self.seeds == 1 else keep)

    def state_dict(self) -> dict[str, Any]:
        """The windows and the queued rows, for a checkpoint."""
        return {"n": self.n, "step": self._step, "pending": self._pending.copy(),
                "observations": self._observations.copy(), "actions": self._actions.copy(),
                "rewards": self._rewards.copy(), "terminations": self._terminations.copy(),
                "next_observations": self._next_observations.copy(),
                "queues": [dict(zip(_COLUMNS, q, strict=True)) for q in self._queues]}

    def load_state_dict(self, state: dict[str, Any], *, episodes_go_on: bool) -> None:
        """Restore `state_dict`. Where the episodes do not go on (the envs restart), or the
        saved windows are not this run's (another n or env count), they are cut and queued."""
        same = (state["n"] == self.n and state["pending"].shape == self._pending.shape
                and state["observations"].shape == self._observations.shape
                and state["actions"].shape == self._actions.shape)
        saved = self if same else NStepRows(state["n"], self.gamma, self.seeds,
                                            state["pending"].size // self.seeds,
                                            *state["observations"].shape[2:],
                                            *state["actions"].shape[2:])
        saved._step, saved._pending = int(state["step"]), state["pending"].copy()
        for name in ("observations", "actions", "rewards", "terminations", "next_observations"):
            getattr(saved, f"_{name}")[:] = state[name]
        self._queues = [[np.asarray(q[name]) for name in _COLUMNS] for q in state["queues"]]
        if not same or not episodes_go_on:
            saved._queues = self._queues
            saved.cut()
            self._queues = saved._queues


def _empty(observation_size: int, action_size: int) -> list[np.ndarray]:
    """An empty queue: its columns with no rows."""
    return [np.zeros((0, observation_size)), np.zeros((0, action_size)), np.zeros(0),
            np.zeros((0, observation_size)), np.zeros(0)]
