"""Tests for the device replay ring: layout, wrap-around, sampling and checkpointing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.data import buffer as buffer_module
from rl_graphstep.data.buffer import ReplayBuffer

OBS, ACT = 3, 2


def batch(start: int, n: int, terminated: tuple[bool, ...] | None = None):
    """n transitions whose values encode their index i = start .. start+n-1."""
    i = np.arange(start, start + n, dtype=np.float32)[:, None]
    observations = i + np.array([0.0, 0.1, 0.2], dtype=np.float32)
    actions = -i + np.array([0.0, -0.5], dtype=np.float32)
    rewards = 10 * i[:, 0]
    next_observations = observations + 1000
    if terminated is None:
        terminated = tuple(bool(k % 2) for k in range(start, start + n))
    terminations = np.array(terminated)
    return observations, actions, rewards, next_observations, terminations


def expected_row(i: int) -> list[float]:
    not_done = 0.0 if i % 2 else 1.0
    obs = [i, i + 0.1, i + 0.2]
    return [*obs, -i, -i - 0.5, 10 * i, not_done, *(v + 1000 for v in obs)]


def test_layout_and_sizes() -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cpu")
    assert replay.row_size == 2 * OBS + ACT + 2 == 10
    assert replay.layout.critic_inputs == slice(0, 5)
    assert replay.storage.shape == (5, 10)
    assert replay.nbytes == 5 * 10 * 4
    assert replay.device == torch.device("cpu")
    assert len(replay) == 0
    replay.add(*batch(0, 2))
    assert len(replay) == 2
    torch.testing.assert_close(replay.storage[:2], torch.tensor([expected_row(0), expected_row(1)]))


def test_describe() -> None:
    replay = ReplayBuffer(1_000, 11, 2, "cpu")
    assert replay.describe() == "replay buffer: 1,000 rows x 26 float32 on cpu = 101.6 KiB"


def test_overfill_wraps_around_and_keeps_the_newest() -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cpu")
    for start in range(7):
        replay.add(*batch(start, 1))
    # Rows 0 and 1 were overwritten by 5 and 6.
    assert len(replay) == 5
    assert replay.position == 2
    want = [expected_row(i) for i in (5, 6, 2, 3, 4)]
    torch.testing.assert_close(replay.storage, torch.tensor(want))


def test_batch_straddling_the_end() -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cpu")
    replay.add(*batch(0, 4))
    replay.add(*batch(4, 3))  # rows 4 -> slot 4, 5 -> slot 0, 6 -> slot 1
    assert replay.position == 2
    assert len(replay) == 5
    want = [expected_row(i) for i in (5, 6, 2, 3, 4)]
    torch.testing.assert_close(replay.storage, torch.tensor(want))


def test_batch_longer_than_the_ring_keeps_its_last_rows() -> None:
    replay = ReplayBuffer(4, OBS, ACT, "cpu")
    replay.add(*batch(0, 1))
    replay.add(*batch(1, 6))  # 7 rows in all; the ring holds 3, 4, 5, 6
    assert replay.position == 7 % 4
    want = {i % 4: expected_row(i) for i in (3, 4, 5, 6)}
    torch.testing.assert_close(replay.storage, torch.tensor([want[s] for s in range(4)]))


def test_not_done_is_one_minus_terminations() -> None:
    replay = ReplayBuffer(8, OBS, ACT, "cpu")
    replay.add(*batch(0, 4, terminated=(True, False, False, True)))
    # Float 0/1 terminations are accepted as well as booleans.
    obs, act, rew, next_obs, _ = batch(4, 2)
    replay.add(obs, act, rew, next_obs, np.array([1.0, 0.0]))
    not_dones = replay.storage[:6, replay.layout.not_dones]
    assert not_dones.flatten().tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 1.0]


def test_torch_inputs_are_accepted() -> None:
    replay = ReplayBuffer(4, OBS, ACT, "cpu")
    replay.add(*(torch.as_tensor(x) for x in batch(0, 2)))
    torch.testing.assert_close(replay.storage[:2], torch.tensor([expected_row(0), expected_row(1)]))


def test_add_rejects_wrong_shapes() -> None:
    replay = ReplayBuffer(4, OBS, ACT, "cpu")
    obs, act, rew, next_obs, term = batch(0, 2)
    with pytest.raises(ValueError, match=r"actions must have shape \(2, 2\), got \(2, 3\)"):
        replay.add(obs, np.zeros((2, 3)), rew, next_obs, term)
    with pytest.raises(ValueError, match=r"rewards must have shape \(2,\) or \(2, 1\)"):
        replay.add(obs, act, np.zeros(3), next_obs, term)
    with pytest.raises(ValueError, match="observations must be shaped"):
        replay.add(obs[0], act, rew, next_obs, term)
    assert len(replay) == 0


def test_sample_shape_dtype_device_and_rows_come_from_the_buffer() -> None:
    torch.manual_seed(0)
    replay = ReplayBuffer(10, OBS, ACT, "cpu")
    replay.add(*batch(0, 4))
    rows = replay.sample(64)
    assert rows.shape == (64, replay.row_size)
    assert rows.dtype == torch.float32
    assert rows.device == torch.device("cpu")
    added = {tuple(torch.tensor(expected_row(i)).tolist()) for i in range(4)}
    sampled = {tuple(row) for row in rows.tolist()}
    assert sampled <= added
    # 64 draws from 4 rows: every row shows up (the chance of missing one is ~4e-8).
    assert sampled == added
    # The unfilled (zero) rows are never drawn.
    assert not (rows == 0).all(dim=1).any()


def test_sample_into_out() -> None:
    replay = ReplayBuffer(10, OBS, ACT, "cpu")
    replay.add(*batch(0, 3))
    out = torch.empty(16, replay.row_size)
    result = replay.sample(16, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.isin(out[:, 0], torch.tensor([0.0, 1.0, 2.0])).all()


def test_sample_from_empty_buffer_fails_clearly() -> None:
    replay = ReplayBuffer(10, OBS, ACT, "cpu")
    with pytest.raises(RuntimeError, match="empty replay buffer"):
        replay.sample(4)


def test_too_big_for_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        buffer_module, "_available_memory", lambda device: (2**30, "cpu has 1.0 GiB free")
    )
    # 100M rows x 10 float32 = 3.7 GiB; 2**30 // (10 * 4) - 1 rows fit (with the spare row)
    with pytest.raises(ConfigError) as info:
        ReplayBuffer(100_000_000, OBS, ACT, "cpu")
    message = str(info.value)
    assert "3.7 GiB" in message
    assert "cpu has 1.0 GiB free" in message
    assert "--buffer-size (at most 26,843,544 fit)" in message
    assert "\n" not in message


def test_cpu_memory_query_is_physical_memory() -> None:
    total, where = buffer_module._available_memory(torch.device("cpu"))
    assert total > 2**20
    assert where.startswith("this machine has ")


def test_capacity_below_one() -> None:
    with pytest.raises(ConfigError, match="at least 1, got 0"):
        ReplayBuffer(0, OBS, ACT, "cpu")


def test_state_dict_round_trip() -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cpu")
    replay.add(*batch(0, 7))
    state = replay.state_dict()
    assert state["storage"].shape == (5, 10)
    restored = ReplayBuffer(5, OBS, ACT, "cpu")
    restored.load_state_dict(state)
    assert torch.equal(restored.storage, replay.storage)
    assert (restored.position, len(restored)) == (replay.position, len(replay))
    # Adding after the restore continues the ring where it left off.
    replay.add(*batch(7, 1))
    restored.add(*batch(7, 1))
    assert torch.equal(restored.storage, replay.storage)


def test_state_dict_of_partly_filled_buffer() -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cpu")
    replay.add(*batch(0, 2))
    restored = ReplayBuffer(5, OBS, ACT, "cpu")
    restored.load_state_dict(replay.state_dict())
    assert len(restored) == 2 and restored.position == 2
    assert torch.equal(restored.storage, replay.storage)


def test_load_state_dict_of_other_capacity_fails_clearly() -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cpu")
    with pytest.raises(ConfigError, match="--buffer-size 5"):
        ReplayBuffer(6, OBS, ACT, "cpu").load_state_dict(replay.state_dict())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_storage_add_and_sample() -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cuda")
    assert replay.device.type == "cuda" and replay.device.index is not None
    # Many adds in a row reuse the pinned staging buffers while earlier copies may be in
    # flight; several of them straddle the end of the ring.
    for start in range(0, 30, 3):
        replay.add(*batch(start, 3))
    assert replay.position == 0
    want = {i % 5: expected_row(i) for i in range(25, 30)}
    torch.testing.assert_close(replay.storage.cpu(), torch.tensor([want[s] for s in range(5)]))
    rows = replay.sample(32)
    assert rows.device == replay.device and rows.shape == (32, 10)


@pytest.mark.parametrize("n", [1, 3, 7])
def test_adds_keep_the_device_position_and_size_in_step(n: int) -> None:
    replay = ReplayBuffer(5, OBS, ACT, "cpu")
    for start in range(0, 4 * n, n):
        replay.add(*batch(start, n))
        assert replay.position_tensor.item() == replay.position
        assert replay.size_tensor.item() == len(replay)
    restored = ReplayBuffer(5, OBS, ACT, "cpu")
    restored.load_state_dict(replay.state_dict())
    assert restored.position_tensor.item() == replay.position


