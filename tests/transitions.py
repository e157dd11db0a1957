"""Host transitions whose values encode their index, for the replay data's tests (rows,
sampler, buffers of K seeds)."""

from __future__ import annotations

import numpy as np

OBS, ACT = 3, 2
ROW = 2 * OBS + ACT + 2


def batch(start: int, n: int):
    """n transitions whose values encode their index i = start .. start+n-1."""
    i = np.arange(start, start + n, dtype=np.float32)[:, None]
    observations = i + np.array([0.0, 0.1, 0.2], dtype=np.float32)
    actions = -i + np.array([0.0, -0.5], dtype=np.float32)
    rewards = 10 * i[:, 0]
    terminations = np.array([bool(k % 2) for k in range(start, start + n)])
    return observations, actions, rewards, observations + 1000, terminations


def seeds_batch(seeds: int, step: int, n: int):
    """One add of K seeds x n envs, seed k's indices starting at 1000 * k + step * n."""
    parts = [batch(1000 * seed + step * n, n) for seed in range(seeds)]
    return tuple(np.concatenate(columns) for columns in zip(*parts, strict=True))
