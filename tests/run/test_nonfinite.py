"""Tests for the non-finite filter's stores: one seed as before, and K seeds each with a
tally of its own storing into its own ring of a buffer of K seeds."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.run.nonfinite import NonFiniteTally, store_seeds

OBS, ACT = 3, 1


def transition(rng: np.random.Generator, rows: int):
    return (rng.normal(size=(rows, OBS)), rng.uniform(-1, 1, (rows, ACT)), rng.normal(size=rows),
            rng.normal(size=(rows, OBS)), rng.random(rows) < 0.1)


def test_finite_seeds_store_every_row() -> None:
    replay = ReplayBuffer(8, OBS, ACT, "cpu", seeds=3)
    tallies = [NonFiniteTally("Env-v0", seed=seed) for seed in (1, 2, 3)]
    store_seeds(tallies, replay, 0, *transition(np.random.default_rng(0), 6))
    assert replay.sizes == (2, 2, 2)
    assert [tally.transitions for tally in tallies] == [0, 0, 0]


def test_a_seeds_nonfinite_rows_are_its_own() -> None:
    """Seed index 1's first env returns a NaN reward: that seed stores its other row and
    counts one, warned naming the seed; the other seeds store both rows and count nothing."""
    replay = ReplayBuffer(8, OBS, ACT, "cpu", seeds=3)
    tallies = [NonFiniteTally("Env-v0", seed=seed) for seed in (1, 2, 3)]
    columns = transition(np.random.default_rng(0), 6)
    columns[2][2] = np.nan
    with pytest.warns(UserWarning, match=r"Env-v0 returned a non-finite reward \(seed 2, env 0, "
                                         r"step 7\)") as caught:
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        store_seeds(tallies, replay, 7, *columns)
    assert caught[0].filename == __file__ and caught[0].lineno == line  # the caller's line
    assert replay.sizes == (2, 1, 2)
    assert [tally.transitions for tally in tallies] == [0, 1, 0]
    assert [tally.warned for tally in tallies] == [False, True, False]
    assert torch.equal(replay.storage[1, 0, 0], torch.tensor(columns[0][3, 0], dtype=torch.float32))
    # A second bad row in another seed is warned about too: each seed warns once.
    columns = transition(np.random.default_rng(1), 6)
    columns[0][5, 1] = np.inf
    with pytest.warns(UserWarning, match=r"non-finite observation \(seed 3, env 1, step 8\)"):
        store_seeds(tallies, replay, 8, *columns)
    assert replay.sizes == (4, 3, 3)
    assert [tally.transitions for tally in tallies] == [0, 1, 1]


def test_isolation_other_seeds_rows_and_counts_are_identical() -> None:
    """Seed 0's transitions changed, NaNs included: every other seed's ring, fill level and
    tally end identical to the bit."""
    seeds, n = 3, 2
    replays = [ReplayBuffer(20, OBS, ACT, "cpu", seeds=seeds) for _ in range(2)]
    tallies = [[NonFiniteTally("Env-v0", seed=s) for s in range(seeds)] for _ in range(2)]
    rng = np.random.default_rng(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(7):
            columns = transition(rng, seeds * n)
            store_seeds(tallies[0], replays[0], step, *columns)
            changed = tuple(np.array(c, copy=True) for c in columns)
            changed[0][:n] = rng.normal(size=(n, OBS))
            changed[2][: step % 3] = np.nan
            store_seeds(tallies[1], replays[1], step, *changed)
    assert replays[1].sizes[0] < replays[0].sizes[0] and tallies[1][0].transitions > 0
    assert torch.equal(replays[0].storage[1:], replays[1].storage[1:])
    assert replays[0].sizes[1:] == replays[1].sizes[1:]
    assert replays[0].positions[1:] == replays[1].positions[1:]
    assert [t.transitions for t in tallies[0][1:]] == [t.transitions for t in tallies[1][1:]]


def store_through(tally: NonFiniteTally, replay: ReplayBuffer, columns: tuple) -> None:
    tally.store(replay, 3, *columns)


def test_single_seed_store_warns_at_its_callers_caller_and_holds_rows() -> None:
    """One seed's store is as before: the warning points at the line above the store's
    caller (the loop's), and finite rows are held until a full batch is stored."""
    replay, tally = ReplayBuffer(8, OBS, ACT, "cpu"), NonFiniteTally("Env-v0")
    columns = transition(np.random.default_rng(3), 2)
    columns[2][0] = np.nan
    with pytest.warns(UserWarning, match=r"non-finite reward \(env 0, step 3\)") as caught:
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        store_through(tally, replay, columns)
    assert caught[0].filename == __file__ and caught[0].lineno == line
    assert len(replay) == 0 and tally.transitions == 1  # one finite row held
    store_through(tally, replay, transition(np.random.default_rng(4), 2))
    assert len(replay) == 2
