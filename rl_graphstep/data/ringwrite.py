"""Writing packed host rows into replay rings on their device.

The host knows where every row goes: each ring's position and fill level are its own
arithmetic (`place`), so it stages, beside the rows, each row's slot in the flat storage and
the counters after the add. The device then has nothing to compute: on CUDA a write is one
replay of a small captured graph of one copy from pinned memory, one `index_copy_` and the
counters' copy, whatever the number of seeds; elsewhere the same two operations run eagerly.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import torch

from rl_graphstep.core.capture import capture_graph
from rl_graphstep.core.errors import CaptureError

__all__ = ["InTurns", "RingWriter", "Staging", "place"]


def place(positions: np.ndarray, sizes: np.ndarray, capacity: int, kept: np.ndarray | None,
          slots: np.ndarray, counters: np.ndarray) -> None:
    """Where K seeds' new rows go in their rings, and the counters after they are stored.

    ``positions`` and ``sizes`` are each ring's next write position and fill level, (K,).
    ``kept`` (K, n) says which of each seed's n rows are stored (all when None); seed k's
    stored rows go in order to its ring from its position on, wrapping at the end. Writes
    ``slots`` (K * n,): each row's index in the flat (K * capacity + 1, row) storage, where
    seed k's ring starts at k * capacity and the last row is a spare that takes every row not
    stored (and the rows an add of more than a ring's length overwrites itself); no sample
    reads it, so which of its rows the write keeps does not matter. Writes ``counters``
    (2, K): the positions, then the fill levels, after the add.
    """
    seeds = positions.shape[0]
    n = slots.shape[0] // seeds
    if seeds == 1 and kept is None and n <= capacity:
        # One ring and every row, the single run's add: host ints, a few times faster than
        # numpy's temporaries on a handful of rows (this is on one seed's critical path).
        position = int(positions[0])
        for i in range(n):
            slots[i] = (position + i) % capacity
        counters[0, 0] = (position + n) % capacity
        counters[1, 0] = min(int(sizes[0]) + n, capacity)
        return
    starts = np.arange(seeds)[:, None] * capacity
    if kept is None and n <= capacity:  # the common add: every row stored, none overwritten
        flat = (positions[:, None] + np.arange(n)) % capacity + starts
        slots[:] = flat.ravel()
        counts = np.full(seeds, n)
    else:
        kept = np.ones((seeds, n), dtype=bool) if kept is None else kept
        order = np.cumsum(kept, axis=1) - 1  # a stored row's place among its seed's
        counts = order[:, -1] + 1 if n else np.zeros(seeds, dtype=np.int64)
        lands = kept & (order >= counts[:, None] - capacity)  # only a ring's length lands
        flat = (positions[:, None] + order) % capacity + starts
        slots[:] = np.where(lands, flat, seeds * capacity).ravel()
    counters[0] = (positions + counts) % capacity
    counters[1] = np.minimum(sizes + counts, capacity)


class InTurns:
    """Two pinned host buffers used in turn by copies to the device queued on a stream
    (the ring's staging, the observation statistics): taking a buffer waits for the copy
    that read it, two turns ago, which has almost always finished."""

    def __init__(self) -> None:
        self.turn = 0
        self._read: list[torch.cuda.Event | None] = [None, None]

    def take(self) -> int:
        """The next buffer's index, once no queued copy reads it any more."""
        self.turn ^= 1
        read = self._read[self.turn]
        if read is not None:
            read.synchronize()
        return self.turn

    def queued(self, stream: torch.cuda.Stream) -> None:
        """Note that a copy from this turn's buffer is queued on ``stream`` (CUDA only)."""
        read = self._read[self.turn] or torch.cuda.Event()
        read.record(stream)
        self._read[self.turn] = read

    def forget(self) -> None:
        """New buffers replace the old ones: no copy reads them yet."""
        self._read = [None, None]


class Staging(NamedTuple):
    """One add's host-side staging, as numpy views of one buffer: the packed ``rows``
    (n, row_size), each row's flat ``slots`` (n,) and the ``counters`` (2, K) after the add."""

    rows: np.ndarray
    slots: np.ndarray
    counters: np.ndarray


class _Buffer(NamedTuple):
    """A staging buffer's bytes and its torch views of them (the same layout serves the host
    buffer and its device copy)."""

    data: torch.Tensor
    rows: torch.Tensor
    slots: torch.Tensor
    counters: torch.Tensor


def _views(data: torch.Tensor, rows: int, row_size: int, seeds: int,
           dtype: torch.dtype) -> _Buffer:
    """Cut ``data`` (bytes) into rows of ``dtype``, then int64 slots and counters."""
    row_bytes = _aligned(rows * row_size * dtype.itemsize)
    ints = data[row_bytes:].view(torch.int64)
    return _Buffer(data, data[: rows * row_size * dtype.itemsize].view(dtype).view(rows, row_size),
                   ints[:rows], ints[rows:].view(2, seeds))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 8) * 8  # the int64 part starts on an 8-byte boundary


class RingWriter:
    """Stages host rows and writes them into ``flat`` (K * capacity + 1, row_size; the K
    rings end to end, then a spare row) and the device counters ``counters`` (2, K int64: the
    positions, then the fill levels).

    Two staging buffers are used in turn: the add after next waits, rarely, for the copy that
    read its buffer. On CUDA each buffer has a captured write (see `write`).
    """

    def __init__(self, flat: torch.Tensor, counters: torch.Tensor) -> None:
        self.flat = flat
        self.counters = counters
        self.device = flat.device
        self.seeds = counters.shape[1]
        self.graphs: list[torch.cuda.CUDAGraph] | None = None
        self._graph_writes = True  # False once a capture failed
        self._host: list[_Buffer] = []
        self._numpy: list[Staging] = []
        self._device: _Buffer | None = None  # on CUDA, where the graphs copy the staging to
        self._turns = InTurns()
        self._stream: torch.cuda.Stream | None = None

    def staging(self, rows: int) -> Staging:
        """This add's staging for ``rows`` rows in all (K seeds x n), to fill in before
        `write`: made at the first add of that many rows, then reused."""
        if not self._host or self._host[0].rows.shape[0] != rows:
            self._make_staging(rows)
        return self._numpy[self._turns.take()]

    def _make_staging(self, rows: int) -> None:
        cuda = self.device.type == "cuda"
        row_size, dtype = self.flat.shape[1], self.flat.dtype
        nbytes = _aligned(rows * row_size * dtype.itemsize) + 8 * (rows + 2 * self.seeds)
        self._host = [_views(torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda),
                             rows, row_size, self.seeds, dtype) for _ in range(2)]
        self._numpy = [Staging(b.rows.numpy(), b.slots.numpy(), b.counters.numpy())
                       for b in self._host]
        self._device = (_views(torch.empty(nbytes, dtype=torch.uint8, device=self.device),
                               rows, row_size, self.seeds, dtype) if cuda else None)
        self._turns.forget()
        self.graphs = None  # captured for the new buffers at their first write
        # Fetched once: current_stream() costs more than the copy it orders. Adds are issued
        # on the stream current at the first one.
        self._stream = torch.cuda.current_stream(self.device) if cuda else None

    def write(self) -> None:
        """Write this add's staging into the rings: on CUDA one replay of a captured graph
        (the copy from pinned memory, the `index_copy_`, the counters' copy), three
        operations run eagerly where no graph can be used."""
        host = self._host[self._turns.turn]
        graph = self._graph()
        if graph is not None:
            graph.replay()
        elif self._device is not None:
            _upload(host, self._device, self.flat, self.counters)
        else:
            _store(self.flat, self.counters, host)
        if self._stream is not None:
            self._turns.queued(self._stream)

    def _graph(self) -> torch.cuda.CUDAGraph | None:
        """This turn's captured write (both captured at the first write); None off CUDA or
        when capturing failed (the eager write then runs, after a one-time warning)."""
        if self._device is None or not self._graph_writes:
            return None
        if self.graphs is None:
            try:
                self.graphs = [self._capture(host) for host in self._host]
            except CaptureError as error:
                warnings.warn(f"{error}; writing the replay buffer without a graph",
                              stacklevel=4)
                self._graph_writes = False
                return None
        return self.graphs[self._turns.turn]

    def _capture(self, host: _Buffer) -> torch.cuda.CUDAGraph:
        """A graph that copies ``host``'s bytes (pinned; read when the graph runs) to the
        device and stores them. Warmed up on a scratch ring and counters, so capturing
        writes nothing."""
        device = self._device
        assert device is not None
        rows = host.rows.shape[0]
        scratch_flat = torch.empty(rows + 1, self.flat.shape[1], dtype=self.flat.dtype,
                                   device=self.device)
        scratch = device._replace(slots=torch.zeros(rows, dtype=torch.int64, device=self.device))

        graph, _ = capture_graph(
            lambda: _upload(host, device, self.flat, self.counters), self.device,
            what="the replay buffer's write",
            warmup=lambda: _upload(host, scratch, scratch_flat, self.counters.clone()))
        return graph


def _upload(host: _Buffer, device: _Buffer, flat: torch.Tensor, counters: torch.Tensor) -> None:
    """An add on CUDA: the staging's bytes from pinned memory to ``device``, then `_store`."""
    device.data.copy_(host.data, non_blocking=True)
    _store(flat, counters, device)


def _store(flat: torch.Tensor, counters: torch.Tensor, staged: _Buffer) -> None:
    """The device's whole part of an add: the rows to their slots, the new counters."""
    flat.index_copy_(0, staged.slots, staged.rows)
    counters.copy_(staged.counters)
