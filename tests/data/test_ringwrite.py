"""Tests for the ring's writes: where the host places each row (`place`), and the staging and
eager write of the CPU (the captured write: test_ringwrite_cuda.py)."""

from __future__ import annotations

import numpy as np
import torch

from rl_graphstep.data import ringwrite
from rl_graphstep.data.ringwrite import RingWriter, place


def placed(positions: list[int], sizes: list[int], capacity: int, n: int,
           kept: list[list[bool]] | None = None) -> tuple[list[int], list[list[int]]]:
    slots = np.full(len(positions) * n, -1, dtype=np.int64)
    counters = np.full((2, len(positions)), -1, dtype=np.int64)
    place(np.array(positions), np.array(sizes), capacity,
          None if kept is None else np.array(kept), slots, counters)
    return slots.tolist(), counters.tolist()


def test_place_wraps_each_ring_at_its_end_from_its_own_position() -> None:
    # Two rings of 4 (seed 1's starts at flat row 4; the spare row is 8), two rows each.
    slots, counters = placed([3, 1], [4, 1], 4, 2)
    assert slots == [3, 0, 5, 6]
    assert counters == [[1, 3], [4, 3]]
    # One ring (the host-int path) wraps the same way.
    assert placed([3], [3], 4, 2) == ([3, 0], [[1], [4]])


def test_place_sends_rows_not_kept_to_the_spare_row_and_keeps_the_order() -> None:
    slots, counters = placed([3, 0, 2], [4, 0, 2], 4, 3,
                             [[True, False, True], [False, False, False], [False, True, True]])
    spare = 12
    # Seed 0 stores two rows (3, then 0 after the wrap), seed 1 none, seed 2 two from 2 on.
    assert slots == [3, spare, 0, spare, spare, spare, spare, 10, 11]
    assert counters == [[1, 0, 0], [4, 0, 4]]


def test_place_of_more_rows_than_a_ring_lands_only_the_last_ring_length() -> None:
    # Seven rows into one ring of 3 at position 1: rows 4, 5, 6 land, in slots 2, 0, 1.
    slots, counters = placed([1], [0], 3, 7)
    assert slots == [3, 3, 3, 3, 2, 0, 1]
    assert counters == [[2], [3]]
    # The same through the kept path: the mask drops row 6, so rows 3, 4, 5 land in 1, 2, 0.
    slots, _ = placed([1], [0], 3, 7, [[True] * 6 + [False]])
    assert slots == [3, 3, 3, 1, 2, 0, 3]


def test_the_cpu_write_stores_the_staging_and_the_buffers_alternate() -> None:
    """On the CPU the write runs eagerly: each staged row lands at its slot, the spare takes
    the rest, and the counters are the staged ones; the two staging buffers alternate."""
    flat = torch.zeros(2 * 3 + 1, 2)
    counters = torch.zeros(2, 2, dtype=torch.int64)
    writer = RingWriter(flat, counters)
    seen = []
    positions, sizes = np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64)
    for add in range(4):
        staging = writer.staging(2)
        seen.append(staging.rows)
        staging.rows[:] = [[add, 0.0], [add, 1.0]]
        place(positions, sizes, 3, np.array([[True], [add % 2 == 0]]), staging.slots,
              staging.counters)
        writer.write()
        positions[:], sizes[:] = staging.counters
    assert seen[0] is seen[2] and seen[1] is seen[3] and seen[0] is not seen[1]
    # Seed 0 took adds 0..3 into a ring of 3 (3 overwrote 0); seed 1 adds 0 and 2.
    assert flat[:3].tolist() == [[3.0, 0.0], [1.0, 0.0], [2.0, 0.0]]
    assert flat[3:6].tolist() == [[0.0, 1.0], [2.0, 1.0], [0.0, 0.0]]
    assert flat[6].tolist() == [3.0, 1.0]  # the spare holds the last row not kept
    assert counters.tolist() == [[1, 2], [3, 2]] == [positions.tolist(), sizes.tolist()]
    assert writer.graphs is None


def test_two_buffers_are_taken_in_turn_without_a_device() -> None:
    turns = ringwrite.InTurns()
    assert [turns.take() for _ in range(4)] == [1, 0, 1, 0]
    turns.forget()
    assert turns.take() == 1 and turns.turn == 1
