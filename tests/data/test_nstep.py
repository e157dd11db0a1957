"""n-step rows built as transitions arrive: hand-computed returns and discounts, episode ends
(termination and truncation), dropped non-finite steps, envs and seeds kept apart, the fixed
size of every add, n = 1 as today's rows, and the checkpoint state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.nstep import NStepRows

F, T = False, True


def push_steps(rows: NStepRows, rewards: list[float], terminated: list[bool],
               truncated: list[bool], finite: list[bool] | None = None, first: int = 0) -> None:
    """One env's steps from step ``first``: observation t is [t], its next [t + 0.5], action
    [-t]."""
    for i, (r, term, trunc) in enumerate(zip(rewards, terminated, truncated, strict=True)):
        t = first + i
        ok = True if finite is None else finite[i]
        rows.push(np.array([[t]]), np.array([[-t]]), np.array([r]), np.array([[t + 0.5]]),
                  np.array([term]), np.array([trunc]), np.array([ok]))


def drain(rows: NStepRows) -> list[tuple[float, ...]]:
    """Every queued row as (observation, action, R, not_done, next observation)."""
    out = []
    while (ready := rows.take()) is not None:
        for i in np.flatnonzero(ready.keep if ready.keep is not None else [True] * len(ready[0])):
            out.append((ready.observations[i, 0], ready.actions[i, 0], ready.rewards[i],
                        ready.not_dones[i], ready.next_observations[i, 0]))
    return out


def test_the_hand_table_termination_then_truncation() -> None:
    """gamma 0.5, rewards 1 2 4 8 16, terminated at t1, truncated at t4, n = 3."""
    rows = NStepRows(3, 0.5, 1, 1, 1, 1)
    push_steps(rows, [1, 2], [F, T], [F, F])
    # t1 terminates: t0's window (1 + 0.5*2 = 2, k=2) and t1's (2, k=1) end there, c = 0.
    assert drain(rows) == [(0, 0, 2.0, 0.0, 1.5), (1, -1, 2.0, 0.0, 1.5)]
    push_steps(rows, [4, 8], [F, F], [F, F], first=2)
    assert rows.queued() == (0,)  # an episode's first n-1 steps complete no window
    push_steps(rows, [16], [F], [T], first=4)
    # t4 truncates: t2 gives 4 + 0.5*8 + 0.25*16 = 12 with c = 0.5^2 = 0.25, t3 gives
    # 8 + 0.5*16 = 16 with c = 0.5, t4 gives 16 with c = 1: all bootstrap from t4's next.
    assert drain(rows) == [(2, -2, 12.0, 0.25, 4.5), (3, -3, 16.0, 0.5, 4.5),
                           (4, -4, 16.0, 1.0, 4.5)]


def test_an_episode_under_way_emits_one_full_window_per_step() -> None:
    rows = NStepRows(3, 0.5, 1, 1, 1, 1)
    push_steps(rows, [1, 2, 4, 8, 16], [F] * 5, [F] * 5)
    # Each row: 3 rewards, c = gamma^2, next observation 2 steps after its own.
    assert drain(rows) == [(0, 0, 1 + 1 + 1.0, 0.25, 2.5), (1, -1, 2 + 2 + 2.0, 0.25, 3.5),
                           (2, -2, 4 + 4 + 4.0, 0.25, 4.5)]


def test_termination_gives_zero_and_truncation_keeps_the_discount() -> None:
    for terminated, discount in ((T, 0.0), (F, 0.5)):
        rows = NStepRows(4, 0.5, 1, 1, 1, 1)
        push_steps(rows, [2, 4], [F, terminated], [F, not terminated])
        assert [row[3] for row in drain(rows)] == [discount, 1.0 - terminated]


def test_a_dropped_step_ends_the_windows_before_it() -> None:
    """t2 is not finite: t0's and t1's windows end at t1 (next observation of t1,
    bootstrapping), t2 is in no row, t3 starts afresh."""
    rows = NStepRows(3, 0.5, 1, 1, 1, 1)
    push_steps(rows, [2, 4, np.nan, 8, 16, 32], [F] * 6, [F] * 6, finite=[T, T, F, T, T, T])
    assert drain(rows) == [(0, 0, 2 + 0.5 * 4, 0.5, 1.5), (1, -1, 4.0, 1.0, 1.5),
                           (3, -3, 8 + 8 + 8.0, 0.25, 5.5)]


def test_windows_never_mix_envs_or_episodes() -> None:
    """Two envs whose episodes end at other steps; observations encode (env, episode, t)."""
    rows = NStepRows(3, 0.9, 1, 2, 3, 1)
    rng = np.random.default_rng(0)
    ends = rng.random((40, 2)) < 0.3
    episode = np.zeros(2, dtype=int)
    for t in range(40):
        obs = np.array([[e, episode[e], t] for e in range(2)], dtype=float)
        nxt = obs + np.array([0, 0, 1])
        rows.push(obs, np.zeros((2, 1)), np.ones(2), nxt, ends[t] & [T, F], ends[t] & [F, T],
                  np.ones(2, bool))
        episode += ends[t]
    ready = drain_arrays(rows)
    same_env = ready["observations"][:, 0] == ready["next_observations"][:, 0]
    same_episode = ready["observations"][:, 1] == ready["next_observations"][:, 1]
    assert same_env.all() and same_episode.all() and len(ready["rewards"]) > 40
    k = ready["next_observations"][:, 2] - ready["observations"][:, 2]  # steps in the window
    assert set(k) <= {1, 2, 3}
    np.testing.assert_allclose(ready["rewards"], (1 - 0.9 ** k) / (1 - 0.9))


def drain_arrays(rows: NStepRows) -> dict[str, np.ndarray]:
    parts = []
    while (ready := rows.take()) is not None:
        parts.append(ready)
    return {name: np.concatenate([getattr(p, name) for p in parts])
            for name in ("observations", "rewards", "not_dones", "next_observations")}


def test_one_seed_adds_exactly_num_envs_rows() -> None:
    rows = NStepRows(3, 0.5, 1, 2, 1, 1)
    sizes = []
    for t in range(6):  # both envs end their episodes at t2: 6 rows at once
        rows.push(np.zeros((2, 1)), np.zeros((2, 1)), np.ones(2), np.zeros((2, 1)),
                  np.array([t == 2, F]), np.array([F, t == 2]), np.ones(2, bool))
        ready = rows.take()
        sizes.append(None if ready is None else len(ready.rewards))
        assert ready is None or ready.keep is None
    # Queued after each step's add: 0, 0, 6-2=4, 4-2=2, 2-2=0 (the new episodes complete
    # no window in their first 2 steps), 2-2=0 (t3's windows at t5).
    assert sizes == [None, None, 2, 2, 2, 2] and rows.queued() == (0,)


def test_seeds_are_independent_and_adds_keep_their_size() -> None:
    """Two seeds of one env each, fed together, give each seed the rows it gives alone."""
    rng = np.random.default_rng(1)
    together, alone = NStepRows(3, 0.8, 2, 1, 2, 1), [NStepRows(3, 0.8, 1, 1, 2, 1)
                                                     for _ in range(2)]
    buffer, buffers = ReplayBuffer(50, 2, 1, "cpu", seeds=2), [ReplayBuffer(50, 2, 1, "cpu")
                                                              for _ in range(2)]
    for _ in range(30):
        obs, act, nxt = rng.normal(size=(2, 2)), rng.normal(size=(2, 1)), rng.normal(size=(2, 2))
        rew, term, trunc = rng.normal(size=2), rng.random(2) < 0.2, rng.random(2) < 0.1
        together.push(obs, act, rew, nxt, term, trunc, np.ones(2, bool))
        ready = together.take()
        if ready is not None:
            assert len(ready.rewards) == 2 and ready.keep is not None
            buffer.add(*ready[:4], None, not_dones=ready.not_dones, keep=ready.keep)
        for k in range(2):
            alone[k].push(obs[k:k + 1], act[k:k + 1], rew[k:k + 1], nxt[k:k + 1],
                          term[k:k + 1], trunc[k:k + 1], np.ones(1, bool))
            mine = alone[k].take()
            if mine is not None:
                buffers[k].add(*mine[:4], None, not_dones=mine.not_dones)
    for k in range(2):
        assert buffer.sizes[k] == buffers[k].sizes[0] > 20
        assert torch.equal(buffer.storage[k, : buffer.sizes[k]],
                           buffers[k].storage[: buffers[k].sizes[0]])


def test_n_1_stores_todays_rows_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    today, nstep = ReplayBuffer(100, 3, 2, "cpu"), ReplayBuffer(100, 3, 2, "cpu")
    rows = NStepRows(1, 0.99, 1, 4, 3, 2)
    for _ in range(10):
        obs = rng.normal(size=(4, 3)).astype(np.float32)
        act, rew = rng.uniform(-1, 1, (4, 2)), rng.normal(size=4) * 1e3
        nxt, term = rng.normal(size=(4, 3)).astype(np.float32), rng.random(4) < 0.3
        today.add(obs, act, rew, nxt, term)
        rows.push(obs, act, rew, nxt, term, rng.random(4) < 0.3, np.ones(4, bool))
        ready = rows.take()
        assert ready is not None
        nstep.add(*ready[:4], None, not_dones=ready.not_dones)
    assert torch.equal(today.storage, nstep.storage) and len(today) == 40


def test_a_checkpoint_goes_on_as_if_never_stopped() -> None:
    rng = np.random.default_rng(3)
    steps = [(rng.normal(size=(2, 1)), rng.normal(size=(2, 1)), rng.normal(size=2),
              rng.normal(size=(2, 1)), rng.random(2) < 0.2, rng.random(2) < 0.1)
             for _ in range(20)]
    straight, first = NStepRows(3, 0.7, 1, 2, 1, 1), NStepRows(3, 0.7, 1, 2, 1, 1)
    for step in steps[:10]:
        straight.push(*step, np.ones(2, bool))
        first.push(*step, np.ones(2, bool))
    resumed = NStepRows(3, 0.7, 1, 2, 1, 1)
    resumed.load_state_dict(first.state_dict(), episodes_go_on=True)
    for step in steps[10:]:
        straight.push(*step, np.ones(2, bool))
        resumed.push(*step, np.ones(2, bool))
    a, b = drain_arrays(straight), drain_arrays(resumed)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("other_n", [False, True])
def test_a_resume_whose_episodes_restart_cuts_the_windows(other_n: bool) -> None:
    """Envs that restart (or windows of another n) end the saved windows at their last step:
    t0..t1 give (1 + 0.5*2, c = 0.5) and (2, c = 1), next observation of t1."""
    saved = NStepRows(3, 0.5, 1, 1, 1, 1)
    push_steps(saved, [1, 2], [F, F], [F, F])
    resumed = NStepRows(2 if other_n else 3, 0.5, 1, 1, 1, 1)
    resumed.load_state_dict(saved.state_dict(), episodes_go_on=other_n)
    assert drain(resumed) == [(0, 0, 2.0, 0.5, 1.5), (1, -1, 2.0, 1.0, 1.5)]
