"""Tests for the sampler that draws replay batches into fixed outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transitions import ACT, OBS, ROW, seeds_batch

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.sampler import BatchSampler


def counting_buffer(rows: int = 50) -> ReplayBuffer:
    replay = ReplayBuffer(100, 2, 1, "cpu")
    index = np.arange(rows, dtype=np.float32)
    replay.add(np.stack([index, -index], 1), index[:, None] / 100, index, np.stack(
        [index + 0.5, index - 0.5], 1), index % 7 == 0)
    return replay


def test_sampler_writes_column_slices_of_buffer_rows() -> None:
    replay = counting_buffer()
    head, tail = torch.zeros(64, 3), torch.zeros(64, 4)
    sampler = BatchSampler(replay, 64, [(head, slice(0, 3)), (tail, slice(3, None))])
    sampler()
    rows = torch.cat([head, tail], 1)
    # Every sampled row is a stored row, whole (the two outputs come from the same draw).
    index = rows[:, 0].long()
    assert index.min() >= 0 and index.max() < 50
    torch.testing.assert_close(rows, replay.storage[index])
    first = rows.clone()
    sampler()
    assert not torch.equal(torch.cat([head, tail], 1), first)  # a fresh draw each call
    assert sampler.graph is None


def test_sampler_draw_is_the_call_without_a_graph() -> None:
    replay = counting_buffer()
    outputs = [torch.zeros(16, 7), torch.zeros(16, 7)]
    samplers = [BatchSampler(replay, 16, [(out, slice(0, 7))]) for out in outputs]
    torch.manual_seed(4)
    samplers[0]()
    torch.manual_seed(4)
    samplers[1].draw()
    assert torch.equal(outputs[0], outputs[1])


def test_sampler_reads_the_current_fill_level() -> None:
    replay = counting_buffer(rows=10)
    out = torch.zeros(512, 1)
    sampler = BatchSampler(replay, 512, [(out, slice(0, 1))])
    sampler()
    assert out.max() <= 9
    index = np.arange(10, 60, dtype=np.float32)
    replay.add(np.stack([index, -index], 1), np.zeros((50, 1)), index, np.zeros((50, 2)),
               np.zeros(50, bool))
    sampler()
    assert out.max() > 9 and out.max() < 60  # rows added after the sampler was built


def test_sampler_refuses_mismatched_outputs_and_empty_buffers() -> None:
    with pytest.raises(ValueError, match=r"shape \(8, 2\) on cpu does not match its columns, "
                                         r"\(8, 3\)"):
        BatchSampler(counting_buffer(), 8, [(torch.zeros(8, 2), slice(0, 3))])
    with pytest.raises(RuntimeError, match="empty replay buffer"):
        BatchSampler(ReplayBuffer(10, 2, 1, "cpu"), 8, [(torch.zeros(8, 3), slice(0, 3))])


def test_sampler_writes_each_seeds_columns_into_its_row_of_the_outputs() -> None:
    replay = ReplayBuffer(10, OBS, ACT, "cpu", seeds=3)
    for step in range(3):
        replay.add(*seeds_batch(3, step, 2))
    head, tail = torch.zeros(3, 32, 5), torch.zeros(3, 32, ROW - 5)
    sampler = BatchSampler(replay, 32, [(head, slice(0, 5)), (tail, slice(5, None))])
    assert sampler.rows.shape == (3, 32, ROW)
    sampler()
    rows = torch.cat([head, tail], 2)
    for seed in range(3):
        index = rows[seed, :, 0].long() - 1000 * seed
        assert index.min() >= 0 and index.max() < 6
        assert torch.equal(rows[seed], replay.storage[seed, index])
    with pytest.raises(ValueError, match=r"shape \(32, 5\) on cpu does not match its columns, "
                                         r"\(3, 32, 5\)"):
        BatchSampler(replay, 32, [(torch.zeros(32, 5), slice(0, 5))])
