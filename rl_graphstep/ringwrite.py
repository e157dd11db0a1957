"""Writing packed host rows into a replay ring on its device: two pinned staging buffers used
in turn, and on CUDA each write one replay of a small captured graph (`write_rows`, and
`write_seed_rows` for K seeds' rings), with a plain path where no graph can be used."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from rl_graphstep.capture import capture_graph
from rl_graphstep.errors import CaptureError

__all__ = ["RingWriter", "write_rows", "write_seed_rows"]


class RingWriter:
    """Stages host rows and writes them into the ring ``storage`` at its device-side positions.

    Args:
        storage: the ring, (capacity, row_size), or (K, capacity, row_size) with K seeds.
        positions: the next write position, a 0-dim int64 device tensor (K,) with K seeds.
        sizes: the fill level, shaped as ``positions``.
        seed_starts: with K seeds, ``arange(K)[:, None] * capacity`` on the device (where each
            seed's ring starts in the flat storage); None with one.

    The writes advance ``positions`` and ``sizes`` on the device; the host's copies are the
    caller's, passed to `write` where the plain path needs them.
    """

    def __init__(self, storage: torch.Tensor, positions: torch.Tensor, sizes: torch.Tensor,
                 seed_starts: torch.Tensor | None) -> None:
        self.storage = storage
        self.positions = positions
        self.sizes = sizes
        self.seed_starts = seed_starts
        self.device = storage.device
        self.capacity = storage.shape[-2]
        # On CUDA, per staging buffer, a captured write: see write.
        self.graphs: list[torch.cuda.CUDAGraph] | None = None
        self._offsets_held: torch.Tensor | None = None  # arange(n), read by the write graphs
        self._graph_writes = True  # False once a capture failed
        # Two pinned host staging buffers used in turn (with numpy views of them), each with
        # the event of the last copy reading it; all made once, reused every add.
        self._staging: list[tuple[torch.Tensor, np.ndarray, torch.cuda.Event | None]] = []
        self._turn = 0
        self._copied = [False, False]
        self._stream: torch.cuda.Stream | None = None

    def staging(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
        """A host tensor of `shape` (n rows, or K seeds x n rows + a flag) to pack into (and
        its numpy view); pinned when the storage is on CUDA."""
        if not self._staging or self._staging[0][0].shape != shape:
            pin = self.device.type == "cuda"
            tensors = [torch.empty(shape, dtype=self.storage.dtype, pin_memory=pin)
                       for _ in range(2)]
            self._staging = [(t, t.numpy(), torch.cuda.Event() if pin else None)
                             for t in tensors]
            # Fetched once: current_stream() costs more than the copy it orders. Adds are
            # issued on the stream current at the first one.
            self._stream = torch.cuda.current_stream(self.device) if pin else None
            self._copied = [False, False]
            self.graphs = None  # captured for the new staging buffers at first use
        self._turn ^= 1
        rows, view, copied = self._staging[self._turn]
        if self._copied[self._turn]:
            # The non-blocking copy from two adds ago may still be reading these pinned rows;
            # with two buffers in turn that copy has almost always finished, so this rarely waits.
            assert copied is not None
            copied.synchronize()
        return rows, view

    def write(self, rows: torch.Tensor, position: int, size: int) -> None:
        """Write the staged ``rows`` into a single ring whose host-side position and fill
        level are ``position`` and ``size``. On CUDA that is one replay of a small captured
        graph (the copy from pinned memory, the scatter at the device-side position, the
        position and fill-level updates): one launch where the plain path makes three."""
        graph = self._graph(rows.shape[0])
        if graph is not None:
            graph.replay()
        else:
            self._write_plain(rows, position, size)
        self._record_copy()

    def write_seeds(self, staged: torch.Tensor) -> None:
        """Write the staged (K, n, row_size + 1) rows (see `write_seed_rows`): one replay of a
        captured graph on CUDA (as `write`), the same function run eagerly elsewhere."""
        graph = self._graph(staged.shape[1])
        if graph is not None:
            graph.replay()
        else:
            assert self.seed_starts is not None
            write_seed_rows(self.storage, self.positions, self.sizes, staged,
                            self._offsets(staged.shape[1]), self.seed_starts)
        self._record_copy()

    def _record_copy(self) -> None:
        if self.device.type == "cuda":
            event = self._staging[self._turn][2]
            assert event is not None
            event.record(self._stream)
            self._copied[self._turn] = True

    def _offsets(self, n: int) -> torch.Tensor:
        """``arange(n)`` on the device, made once per n and held: a graph that reads it keeps
        only its address (and freed tensors are handed out again, the write then landing
        wherever their new data says)."""
        if self._offsets_held is None or self._offsets_held.shape[0] != n:
            self._offsets_held = torch.arange(n, device=self.device)
        return self._offsets_held

    def _graph(self, n: int) -> torch.cuda.CUDAGraph | None:
        """The captured write of this add's staging buffer (captured at the first add of n
        rows); None on the CPU, for a batch longer than the ring, or when capturing failed
        (the plain path then writes, after a one-time warning)."""
        if self.device.type != "cuda" or n > self.capacity or not self._graph_writes:
            return None
        if self.graphs is None:
            try:
                self.graphs = [self._capture(staging) for staging, _, _ in self._staging]
            except CaptureError as error:
                warnings.warn(f"{error}; writing the replay buffer without a graph",
                              stacklevel=4)
                self._graph_writes = False
                return None
        return self.graphs[self._turn]

    def _write_plain(self, rows: torch.Tensor, position: int, size: int) -> None:
        n = rows.shape[0]
        kept = min(n, self.capacity)  # a batch longer than the ring keeps only its last rows
        rows = rows[n - kept :]
        start = (position + n - kept) % self.capacity
        non_blocking = self.device.type == "cuda"
        if start + kept <= self.capacity:
            self.storage[start : start + kept].copy_(rows, non_blocking=non_blocking)
        else:
            # The batch straddles the end: one transfer, then scatter with device-made indices.
            on_device = rows.to(self.device, non_blocking=non_blocking)
            index = torch.arange(start, start + kept, device=self.device) % self.capacity
            self.storage.index_copy_(0, index, on_device)
        self.positions.fill_((position + n) % self.capacity)
        if size < self.capacity:
            self.sizes.fill_(min(size + n, self.capacity))

    def _capture(self, staging: torch.Tensor) -> torch.cuda.CUDAGraph:
        """A graph that writes ``staging``'s rows (pinned; read when the graph runs) at the
        device-side position. Its kernels are warmed up on scratch copies of the ring (of n
        rows per seed), so capturing writes nothing."""
        if self.seed_starts is not None:
            seeds, n = staging.shape[0], staging.shape[1]
            offsets, starts = self._offsets(n), self.seed_starts
            scratch = (self.storage[:, :n].clone(), self.positions.clone(), self.sizes.clone(),
                       staging, offsets, torch.arange(seeds, device=self.device)[:, None] * n)
            graph, _ = capture_graph(
                lambda: write_seed_rows(self.storage, self.positions, self.sizes, staging,
                                        offsets, starts),
                self.device, what="the replay buffer's write",
                warmup=lambda: write_seed_rows(*scratch))
            return graph
        n = staging.shape[0]
        offsets = self._offsets(n)
        single = (self.storage[:n].clone(), self.positions.clone(), self.sizes.clone())
        graph, _ = capture_graph(
            lambda: write_rows(self.storage, self.positions, self.sizes, staging, offsets),
            self.device, what="the replay buffer's write",
            warmup=lambda: write_rows(*single, staging, offsets))
        return graph


def write_rows(storage: torch.Tensor, position: torch.Tensor, size: torch.Tensor,
               rows: torch.Tensor, offsets: torch.Tensor) -> None:
    """Write ``rows`` (n, row_size; at most the ring's length, on any device) into the ring
    ``storage`` from the device-side ``position`` on, wrapping at the end, then advance
    ``position`` and the fill level ``size`` (0-dim int64 tensors). ``offsets`` is
    ``arange(n)`` on the storage's device. No host value is read: a graph can record it."""
    capacity = storage.shape[0]
    index = (position + offsets) % capacity
    storage.index_copy_(0, index, rows.to(storage.device, non_blocking=True))
    position.copy_((position + rows.shape[0]) % capacity)
    size.copy_((size + rows.shape[0]).clamp(max=capacity))


def write_seed_rows(storage: torch.Tensor, positions: torch.Tensor, sizes: torch.Tensor,
                    staged: torch.Tensor, offsets: torch.Tensor,
                    seed_starts: torch.Tensor) -> None:
    """Write K seeds' rows into their rings, each seed its own count at its own position.

    ``storage`` is (K, capacity, row_size), ``positions`` and ``sizes`` (K,) int64 tensors.
    ``staged`` (K, n, row_size + 1; n at most the capacity; on any device) holds per seed its
    rows to store first, and in its last column 1 on those and 0 on the others. ``offsets`` is
    ``arange(n)`` and ``seed_starts`` ``arange(K)[:, None] * capacity``, on the storage's
    device. A row not stored writes back the ring's own value at the slot it would have
    taken: every index is then distinct (the write is deterministic) and no other seed's slot
    is touched. No host value is read: a graph can record it.
    """
    seeds, capacity, row_size = storage.shape
    staged = staged.to(storage.device, non_blocking=True)
    stored = staged[..., row_size:] > 0.5  # (K, n, 1)
    index = ((positions[:, None] + offsets) % capacity + seed_starts).view(-1)
    flat = storage.view(seeds * capacity, row_size)
    rows = torch.where(stored.view(-1, 1), staged[..., :row_size].reshape(-1, row_size),
                       flat.index_select(0, index))
    flat.index_copy_(0, index, rows)
    counts = stored.view(seeds, -1).sum(dim=1)
    positions.copy_((positions + counts) % capacity)
    sizes.copy_((sizes + counts).clamp(max=capacity))
