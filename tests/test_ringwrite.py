"""Tests for the ring's writes: the device-side write of one ring and of K seeds' rings, and
the staging and plain write of the CPU (the captured write: test_ringwrite_cuda.py)."""

from __future__ import annotations

import torch

from rl_graphstep import ringwrite
from rl_graphstep.ringwrite import write_rows, write_seed_rows


def test_write_rows_wraps_at_the_end_and_advances_position_and_size() -> None:
    storage = torch.zeros(5, 2)
    position, size = torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)
    offsets = torch.arange(2)
    for start in range(0, 8, 2):
        rows = torch.tensor([[start, 0.0], [start + 1, 0.0]])
        write_rows(storage, position, size, rows, offsets)
    # Rows 0..7 into a ring of 5: 5, 6, 7 overwrote 0, 1, 2.
    assert storage[:, 0].tolist() == [5.0, 6.0, 7.0, 3.0, 4.0]
    assert position.item() == 3 and size.item() == 5


def test_write_seed_rows_stores_the_flagged_rows_and_touches_nothing_else() -> None:
    storage = torch.full((2, 4, 2), -1.0)
    positions = torch.tensor([3, 0])
    sizes = torch.tensor([4, 0])
    staged = torch.tensor([[[7.0, 7.0, 1.0], [8.0, 8.0, 1.0], [9.0, 9.0, 0.0]],
                           [[5.0, 5.0, 0.0], [6.0, 6.0, 0.0], [4.0, 4.0, 0.0]]])
    write_seed_rows(storage, positions, sizes, staged, torch.arange(3),
                    torch.arange(2)[:, None] * 4)
    # Seed 0 wraps: 7 -> slot 3, 8 -> slot 0; its unflagged row 9 writes nothing.
    assert storage[0, :, 0].tolist() == [8.0, -1.0, -1.0, 7.0]
    assert (storage[1] == -1).all()
    assert positions.tolist() == [1, 0] and sizes.tolist() == [4, 0]


def test_the_staging_buffers_alternate_and_the_plain_write_wraps_and_counts() -> None:
    """On the CPU every write is the plain one: it lands at the host's position, wraps at the
    end, and moves the device counters as the graph would."""
    storage = torch.zeros(5, 2)
    position, size = torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)
    writer = ringwrite.RingWriter(storage, position, size, None)
    staged = []
    host_position = host_size = 0
    for start in range(0, 8, 2):
        rows, view = writer.staging((2, 2))
        view[:] = [[start, 0.0], [start + 1, 0.0]]
        staged.append(rows)
        writer.write(rows, host_position, host_size)
        host_position, host_size = (host_position + 2) % 5, min(host_size + 2, 5)
    assert staged[0] is staged[2] and staged[1] is staged[3] and staged[0] is not staged[1]
    assert storage[:, 0].tolist() == [5.0, 6.0, 7.0, 3.0, 4.0]
    assert (position.item(), size.item()) == (host_position, host_size) == (3, 5)
    assert writer.graphs is None
