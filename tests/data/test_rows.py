"""Tests for the packed row: its layout, packing host transitions into rows, the critic's views
of a batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transitions import ACT, OBS, ROW, batch

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.rows import CriticTargets, RowLayout


def test_pack_writes_each_part_into_its_columns_and_names_a_wrong_shape() -> None:
    layout = RowLayout(OBS, ACT)
    rows = np.full((2, ROW + 1), -7.0, dtype=np.float32)  # one more column: left alone
    layout.pack(rows, *batch(4, 2))
    assert rows[0, :ROW].tolist() == pytest.approx(
        [4, 4.1, 4.2, -4, -4.5, 40, 1.0, 1004, 1004.1, 1004.2])
    assert rows[1, layout.not_dones].tolist() == [0.0]  # 5 is odd: terminated
    assert rows[:, ROW].tolist() == [-7.0, -7.0]
    observations, actions, rewards, next_observations, terminations = batch(0, 2)
    with pytest.raises(ValueError, match=r"actions must have shape \(2, 2\), got \(2, 3\)"):
        layout.pack(rows, observations, np.zeros((2, 3)), rewards, next_observations,
                    terminations)
    with pytest.raises(ValueError, match=r"rewards must have shape \(2,\) or \(2, 1\)"):
        layout.pack(rows, observations, actions, np.zeros(3), next_observations, terminations)


def test_row_layout() -> None:
    replay = ReplayBuffer(4, OBS, ACT, "cpu")
    replay.add(*batch(0, 2))
    rows = replay.storage[:2]
    layout = replay.layout
    assert isinstance(layout, RowLayout) and layout.row_size == replay.row_size == 10
    torch.testing.assert_close(rows[:, layout.observations],
                               torch.tensor([[0, 0.1, 0.2], [1, 1.1, 1.2]]))
    torch.testing.assert_close(rows[:, layout.actions], torch.tensor([[0, -0.5], [-1, -1.5]]))
    assert rows[:, layout.rewards].flatten().tolist() == [0.0, 10.0]
    assert rows[:, layout.not_dones].flatten().tolist() == [1.0, 0.0]
    torch.testing.assert_close(
        rows[:, layout.next_observations],
        torch.tensor([[1000, 1000.1, 1000.2], [1001, 1001.1, 1001.2]]))
    # The critic's inputs and targets are two adjacent ranges covering the row.
    assert (layout.critic_inputs, layout.critic_targets) == (slice(0, 5), slice(5, 10))
    targets = layout.split_targets(rows[:, layout.critic_targets])
    assert isinstance(targets, CriticTargets)
    assert targets.rewards.shape == targets.not_dones.shape == (2, 1)
    assert torch.equal(targets.rewards, rows[:, layout.rewards])
    assert torch.equal(targets.not_dones, rows[:, layout.not_dones])
    assert torch.equal(targets.next_observations, rows[:, layout.next_observations])
    # Views, not copies: they share the rows' memory.
    assert targets.next_observations.data_ptr() == rows[:, 7:].data_ptr()
