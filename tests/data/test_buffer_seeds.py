"""Tests for the replay buffer of K seeds: one ring per seed in a (K, capacity, row) storage,
per-seed adds, fill levels and sampling, checkpoints, the memory check; one seed unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transitions import ACT, OBS, ROW, batch, seeds_batch

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.data import buffer as buffer_module
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.sampler import BatchSampler


def expected_row(i: int) -> list[float]:
    obs = [i, i + 0.1, i + 0.2]
    return [*obs, -i, -i - 0.5, 10 * i, 0.0 if i % 2 else 1.0, *(v + 1000 for v in obs)]


def seed_index(seed: int, step: int, env: int, n: int) -> int:
    """The index encoded in seed `seed`'s env `env` at add `step`: distinct for every row."""
    return 1000 * seed + step * n + env




def test_storage_counters_and_description() -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cpu", seeds=3)
    assert replay.seeds == 3
    assert replay.storage.shape == (3, 5, ROW) and replay.storage.is_contiguous()
    assert replay.size_tensor.shape == replay.position_tensor.shape == (3,)
    assert replay.nbytes == 3 * 5 * ROW * 4
    assert replay.sizes == replay.positions == (0, 0, 0) and len(replay) == 0
    assert replay.describe() == "replay buffer: 3 seeds x 5 rows x 10 float32 on cpu = 600 B"
    with pytest.raises(ValueError, match="a position per seed; read positions"):
        _ = replay.position
    with pytest.raises(ConfigError, match="seeds must be at least 1, got 0"):
        ReplayBuffer(5, OBS, ACT, "cpu", seeds=0)


def test_each_seeds_rows_land_in_its_own_ring() -> None:
    replay = ReplayBuffer(6, OBS, ACT, "cpu", seeds=3)
    for step in range(2):
        replay.add(*seeds_batch(3, step, 2))
    for seed in range(3):
        want = [expected_row(seed_index(seed, 0, j, 2)) for j in range(4)]
        torch.testing.assert_close(replay.storage[seed, :4], torch.tensor(want), rtol=0, atol=0)
        assert not replay.storage[seed, 4:].any()
    assert replay.sizes == replay.positions == (4, 4, 4) and len(replay) == 4
    assert replay.size_tensor.tolist() == replay.position_tensor.tolist() == [4, 4, 4]


def test_keep_stores_each_seeds_own_count_at_its_own_position() -> None:
    replay = ReplayBuffer(6, OBS, ACT, "cpu", seeds=3)
    # Seed 0 stores both rows, seed 1 none, seed 2 only its second.
    replay.add(*seeds_batch(3, 0, 2), keep=np.array([True, True, False, False, False, True]))
    assert replay.sizes == replay.positions == (2, 0, 1) and len(replay) == 0
    assert replay.size_tensor.tolist() == [2, 0, 1]
    assert replay.position_tensor.tolist() == [2, 0, 1]
    assert not replay.storage[1].any()
    assert replay.storage[2, 0].tolist() == torch.tensor(expected_row(seed_index(2, 0, 1, 2))
                                                         ).tolist()
    assert not replay.storage[2, 1:].any()
    # The next add continues each seed where it stopped.
    replay.add(*seeds_batch(3, 1, 2))
    assert replay.sizes == (4, 2, 3)
    torch.testing.assert_close(replay.storage[2, :3], torch.tensor(
        [expected_row(seed_index(2, 0, 1, 2)), expected_row(seed_index(2, 1, 0, 2)),
         expected_row(seed_index(2, 1, 1, 2))]), rtol=0, atol=0)


def keeps(seeds: int, n: int, steps: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.random(seeds * n) < 0.6 for _ in range(steps)]


def test_per_seed_wrap_around_equals_one_single_seed_ring_per_seed() -> None:
    """Each seed's ring ends as a single-seed buffer given just that seed's kept rows: each
    wraps at its own point."""
    seeds, n, capacity = 4, 3, 5
    replay = ReplayBuffer(capacity, OBS, ACT, "cpu", seeds=seeds)
    alone = [ReplayBuffer(capacity, OBS, ACT, "cpu") for _ in range(seeds)]
    for step, keep in enumerate(keeps(seeds, n, 9, np.random.default_rng(0))):
        transition = seeds_batch(seeds, step, n)
        replay.add(*transition, keep=keep)
        for seed, single in enumerate(alone):
            rows = slice(seed * n, seed * n + n)
            mine = keep[rows]
            if mine.any():
                single.add(*(np.asarray(c)[rows][mine] for c in transition))
        assert replay.sizes == tuple(len(single) for single in alone)
        assert replay.positions == tuple(single.position for single in alone)
        assert replay.size_tensor.tolist() == list(replay.sizes)
        assert replay.position_tensor.tolist() == list(replay.positions)
    assert len(replay) == capacity  # every seed wrapped
    for seed, single in enumerate(alone):
        assert torch.equal(replay.storage[seed], single.storage)


def test_isolation_other_seeds_storage_counters_and_samples_are_identical() -> None:
    """Seed 0's rows (values and how many are kept) changed: every other seed's storage, fill
    level, position and samples stay identical to the bit."""
    seeds, n = 3, 4
    replays = [ReplayBuffer(10, OBS, ACT, "cpu", seeds=seeds) for _ in range(2)]
    rng = np.random.default_rng(1)
    for step, keep in enumerate(keeps(seeds, n, 6, rng)):
        transition = seeds_batch(seeds, step, n)
        replays[0].add(*transition, keep=keep)
        changed = tuple(np.array(c, copy=True) for c in transition)
        for column in changed:
            column[:n] = rng.normal(size=column[:n].shape) if column.dtype != bool else True
        changed_keep = keep.copy()
        changed_keep[:n] = rng.random(n) < 0.3
        replays[1].add(*changed, keep=changed_keep)
    assert not torch.equal(replays[0].storage[0], replays[1].storage[0])
    assert torch.equal(replays[0].storage[1:], replays[1].storage[1:])
    assert replays[0].sizes[1:] == replays[1].sizes[1:]
    assert replays[0].positions[1:] == replays[1].positions[1:]
    assert torch.equal(replays[0].size_tensor[1:], replays[1].size_tensor[1:])
    samples = []
    for replay in replays:
        torch.manual_seed(3)
        samples.append(replay.sample(64))
    assert torch.equal(samples[0][1:], samples[1][1:])


def test_samples_come_from_each_seeds_filled_part_only() -> None:
    torch.manual_seed(0)
    replay = ReplayBuffer(10, OBS, ACT, "cpu", seeds=3)
    replay.add(*seeds_batch(3, 0, 4), keep=np.array([True, False, False, False] + [True] * 8))
    replay.add(*seeds_batch(3, 1, 4), keep=np.array([False] * 4 + [True] * 8))
    assert replay.sizes == (1, 8, 8)
    rows = replay.sample(512)
    assert rows.shape == (3, 512, ROW) and rows.dtype == torch.float32
    for seed in range(3):
        index = rows[seed, :, 0].long()
        assert ((index // 1000) == seed).all()  # its own seed's rows
        stored = {tuple(r) for r in replay.storage[seed, : replay.sizes[seed]].tolist()}
        assert {tuple(r) for r in rows[seed].tolist()} == stored  # 512 draws hit every row
    out = torch.empty(3, 16, ROW)
    assert replay.sample(16, out=out).data_ptr() == out.data_ptr()
    assert ((out[:, :, 0].long() // 1000) == torch.arange(3)[:, None]).all()


def test_sampling_with_an_empty_seed_fails_clearly() -> None:
    replay = ReplayBuffer(10, OBS, ACT, "cpu", seeds=2)
    replay.add(*seeds_batch(2, 0, 1), keep=np.array([True, False]))
    with pytest.raises(RuntimeError, match=r"empty replay buffer \(seed index 1 holds no rows\)"):
        replay.sample(4)
    with pytest.raises(RuntimeError, match="empty replay buffer"):
        BatchSampler(replay, 4, [(torch.zeros(2, 4, ROW), slice(0, ROW))])


def test_add_checks_the_seeds_rows() -> None:
    replay = ReplayBuffer(3, OBS, ACT, "cpu", seeds=2)
    with pytest.raises(ValueError, match="2 seeds x num_envs rows, got 3"):
        replay.add(*batch(0, 3))
    with pytest.raises(ValueError, match="4 rows per seed do not fit in a ring of 3"):
        replay.add(*batch(0, 8))
    with pytest.raises(ValueError, match=r"keep must have shape \(4,\) or \(4, 1\)"):
        replay.add(*batch(0, 4), keep=np.ones(3, bool))
    assert replay.sizes == (0, 0)
    with pytest.raises(ValueError, match="keep is for a replay buffer of several seeds"):
        ReplayBuffer(3, OBS, ACT, "cpu").add(*batch(0, 1), keep=np.ones(1, bool))


def test_one_seed_is_the_buffer_without_the_argument() -> None:
    """seeds=1 builds today's buffer: the same tensors and shapes, rows, samples and state."""
    plain, one = ReplayBuffer(7, OBS, ACT, "cpu"), ReplayBuffer(7, OBS, ACT, "cpu", seeds=1)
    for replay in (plain, one):
        assert replay.storage.shape == (7, ROW) and replay.size_tensor.shape == ()
        assert replay.position_tensor.shape == () and replay._seed_starts is None
        for start in range(0, 12, 3):
            replay.add(*batch(start, 3))
    assert torch.equal(plain.storage, one.storage)
    assert (plain.position, len(plain)) == (one.position, len(one)) == (5, 7)
    assert one.sizes == (7,) and one.positions == (5,)
    draws = []
    for replay in (plain, one):
        torch.manual_seed(2)
        out = torch.zeros(32, OBS)
        BatchSampler(replay, 32, [(out, slice(0, OBS))])()
        draws.append((replay.sample(32), out))
    assert torch.equal(draws[0][0], draws[1][0]) and torch.equal(draws[0][1], draws[1][1])
    states = [replay.state_dict() for replay in (plain, one)]
    assert states[0].keys() == states[1].keys() and "seeds" not in states[1]
    assert torch.equal(states[0]["storage"], states[1]["storage"])
    assert one.describe() == plain.describe()


def test_state_dict_round_trip_with_seeds() -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cpu", seeds=3)
    for step, keep in enumerate(keeps(3, 2, 5, np.random.default_rng(2))):
        replay.add(*seeds_batch(3, step, 2), keep=keep)
    state = replay.state_dict()
    assert state["seeds"] == 3 and state["sizes"] == list(replay.sizes)
    assert state["storage"].shape == (3, max(replay.sizes), ROW)
    restored = ReplayBuffer(5, OBS, ACT, "cpu", seeds=3)
    restored.load_state_dict(state)
    assert torch.equal(restored.storage, replay.storage)
    assert (restored.sizes, restored.positions) == (replay.sizes, replay.positions)
    assert torch.equal(restored.size_tensor, replay.size_tensor)
    assert torch.equal(restored.position_tensor, replay.position_tensor)
    # Adding after the restore continues every ring where it left off.
    for buffer in (replay, restored):
        buffer.add(*seeds_batch(3, 9, 2), keep=np.array([True, False, True, True, False, False]))
    assert torch.equal(restored.storage, replay.storage)
    assert restored.positions == replay.positions


def test_load_state_dict_of_other_seed_count_fails_in_one_line() -> None:
    three = ReplayBuffer(5, OBS, ACT, "cpu", seeds=3)
    with pytest.raises(ConfigError) as info:
        ReplayBuffer(5, OBS, ACT, "cpu", seeds=2).load_state_dict(three.state_dict())
    assert str(info.value) == ("the checkpoint's replay buffer holds 3 seeds, this run has 2; "
                               "resume with --num-seeds 3")
    with pytest.raises(ConfigError, match="holds 1 seed, this run has 2; resume with "
                                          "--num-seeds 1"):
        ReplayBuffer(5, OBS, ACT, "cpu", seeds=2).load_state_dict(
            ReplayBuffer(5, OBS, ACT, "cpu").state_dict())
    with pytest.raises(ConfigError, match="holds 3 seeds, this run has 1"):
        ReplayBuffer(5, OBS, ACT, "cpu").load_state_dict(three.state_dict())
    with pytest.raises(ConfigError, match="--buffer-size 5"):
        ReplayBuffer(6, OBS, ACT, "cpu", seeds=3).load_state_dict(three.state_dict())


def test_too_big_for_memory_names_the_largest_size_for_that_many_seeds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        buffer_module, "_available_memory", lambda device: (2**30, "cpu has 1.0 GiB free"))

    def allocates(self: ReplayBuffer, device: torch.device) -> torch.Tensor:
        raise AssertionError("allocated before the check")

    monkeypatch.setattr(ReplayBuffer, "_allocate", allocates)
    # 4 seeds x 10M rows x 10 float32 = 1.5 GiB; (2**30 // (10 * 4) - 1) // 4 rows fit (the
    # storage holds one spare row past the rings).
    with pytest.raises(ConfigError) as info:
        ReplayBuffer(10_000_000, OBS, ACT, "cpu", seeds=4)
    assert str(info.value) == (
        "replay buffers of 4 seeds x 10,000,000 rows x 10 need 1.5 GiB but cpu has 1.0 GiB "
        "free; use a smaller --buffer-size (at most 6,710,886 fit for 4 seeds)")
    # One seed of the same size fits, and keeps its message.
    with pytest.raises(ConfigError, match=r"^replay buffer of 100,000,000 rows x 10 needs 3.7 "
                                          r"GiB .* \(at most 26,843,544 fit\)$"):
        ReplayBuffer(100_000_000, OBS, ACT, "cpu")
