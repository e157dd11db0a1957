"""Replay buffer: a ring of packed transition rows preallocated on the training device.

A row is `[observation | action | reward | not_done | next_observation]` (`RowLayout`), so a
sampled batch splits without copies into the critic step's inputs and targets. A sample is
always exactly `batch_size` rows, drawn on the device, so it can feed a captured step's static
buffers without a host sync. With K seeds trained together, each seed has a ring of its own:
one (K, capacity, row) storage, per-seed fill levels and positions, (K, batch_size, row) samples.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import torch

from rl_graphstep.capture import capture_graph
from rl_graphstep.errors import CaptureError, ConfigError
from rl_graphstep.memory import available_memory as _available_memory
from rl_graphstep.memory import format_bytes as _format_bytes
from rl_graphstep.memory import is_out_of_memory as _is_out_of_memory

__all__ = ["BatchSampler", "CriticTargets", "ReplayBuffer", "RowLayout", "write_rows",
           "write_seed_rows"]

# Indices are drawn as randint(0, 2**62) % size: the size is a device tensor (a graph reads its
# current value), and the modulo bias is below size / 2**62, far under any sampling noise.
_INDEX_RANGE = 2**62

ArrayLike = np.ndarray | torch.Tensor


class CriticTargets(NamedTuple):
    """Views of the critic step's targets ``[reward | not_done | next_observation]``;
    rewards and not_dones are shaped (B, 1)."""

    rewards: torch.Tensor
    not_dones: torch.Tensor
    next_observations: torch.Tensor


class RowLayout:
    """Where each part of a transition lies in a packed row
    ``[observation | action | reward | not_done | next_observation]``: the one owner of it.

    The critic step's inputs ``[observation | action]`` and targets ``[reward | not_done |
    next_observation]`` are two adjacent column ranges, so a sampled batch feeds both steps
    without copies.
    """

    def __init__(self, observation_size: int, action_size: int) -> None:
        self.observation_size = int(observation_size)
        self.action_size = int(action_size)
        critic_input_size = self.observation_size + self.action_size
        self.row_size = 2 * self.observation_size + self.action_size + 2
        self.observations = slice(0, self.observation_size)
        self.actions = slice(self.observation_size, critic_input_size)
        self.critic_inputs = slice(0, critic_input_size)
        self.critic_targets = slice(critic_input_size, self.row_size)
        self.rewards = slice(critic_input_size, critic_input_size + 1)
        self.not_dones = slice(critic_input_size + 1, critic_input_size + 2)
        self.next_observations = slice(critic_input_size + 2, self.row_size)

    @staticmethod
    def split_targets(targets: torch.Tensor) -> CriticTargets:
        """Views of ``rows[:, layout.critic_targets]``, what the critic step receives."""
        return CriticTargets(targets[..., :1], targets[..., 1:2], targets[..., 2:])


class ReplayBuffer:
    """A fixed-capacity ring of transitions stored as one (capacity, row_size) device tensor.

    Args:
        capacity: rows kept; once full, each new row overwrites the oldest.
        observation_size: length of a flat observation.
        action_size: length of a flat action.
        device: where the storage lives (the training device).
        dtype: floating dtype of the storage.
        seeds: K, the number of seeds trained together. Each has a ring of its own of
            `capacity` rows: the storage is (K, capacity, row_size), the fill levels and write
            positions are per seed ((K,) device tensors), an add takes K x n rows and a sample
            is (K, batch_size, row_size). With 1 (the default) the buffer is the single-seed
            one: a (capacity, row_size) storage and 0-dim counters.

    Raises `ConfigError` when the capacity is below 1 or the storage would not fit in the
    device's free memory (the machine's physical memory for the CPU).
    """

    def __init__(
        self,
        capacity: int,
        observation_size: int,
        action_size: int,
        device: torch.device | str,
        dtype: torch.dtype = torch.float32,
        *,
        seeds: int = 1,
    ) -> None:
        if capacity < 1:
            raise ConfigError(f"replay buffer size must be at least 1, got {capacity}")
        if seeds < 1:
            raise ConfigError(f"replay buffer seeds must be at least 1, got {seeds}")
        self.seeds = int(seeds)
        if not dtype.is_floating_point:
            raise ConfigError(f"replay buffer dtype must be a floating type, got {dtype}")
        self.capacity = int(capacity)
        self.layout = RowLayout(observation_size, action_size)
        self.observation_size = self.layout.observation_size
        self.action_size = self.layout.action_size
        self.row_size = self.layout.row_size
        self.dtype = dtype
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            # Name the actual GPU in messages and query its memory, not "cuda".
            device = torch.device("cuda", torch.cuda.current_device())
        self._check_fits(device)
        self.storage = self._allocate(device)
        # The storage's device, so a bare "cuda" reads back as "cuda:0".
        self.device = self.storage.device
        self._position = 0  # the row the next add writes first
        self._size = 0
        # The fill level on the device too, so a captured sampling graph reads the current one,
        # and the write position, so a captured write graph writes at the current one.
        counter_shape = () if self.seeds == 1 else (self.seeds,)
        self.size_tensor = torch.zeros(counter_shape, dtype=torch.int64, device=self.device)
        self.position_tensor = torch.zeros(counter_shape, dtype=torch.int64, device=self.device)
        # With K seeds, the host's copies of the per-seed counters, and where each seed's ring
        # starts in the flat (K * capacity, row) storage: (K, 1), read by the graphs.
        self._positions = [0] * self.seeds
        self._sizes = [0] * self.seeds
        self._seed_starts = (torch.arange(self.seeds, device=self.device)[:, None] * self.capacity
                             if self.seeds > 1 else None)
        # On CUDA, per staging buffer, a captured write: see _write.
        self._write_graphs: list[torch.cuda.CUDAGraph] | None = None
        self._write_offsets: torch.Tensor | None = None  # arange(n), read by the write graphs
        self._graph_writes = True  # False once a capture failed
        # Two pinned host staging buffers used in turn (with numpy views of them), each with
        # the event of the last copy reading it; all made once, reused every add.
        self._staging: list[tuple[torch.Tensor, np.ndarray, torch.cuda.Event | None]] = []
        self._staging_turn = 0
        self._staging_copied = [False, False]

    def _check_fits(self, device: torch.device) -> None:
        needed = self.seeds * self.capacity * self.row_size * self.dtype.itemsize
        available = _available_memory(device)
        if available is None or needed <= available[0]:
            return
        raise self._too_big(*available)

    def _too_big(self, free: int, where: str) -> ConfigError:
        row_bytes = self.seeds * self.row_size * self.dtype.itemsize  # a row in every seed
        needed = self.capacity * row_bytes
        fitting = free // row_bytes
        if self.seeds == 1:
            return ConfigError(
                f"replay buffer of {self.capacity:,} rows x {self.row_size} needs "
                f"{needed / 2**30:.1f} GiB but {where}; "
                f"use a smaller --buffer-size (at most {fitting:,} fit)"
            )
        return ConfigError(
            f"replay buffers of {self.seeds} seeds x {self.capacity:,} rows x {self.row_size} "
            f"need {needed / 2**30:.1f} GiB but {where}; "
            f"use a smaller --buffer-size (at most {fitting:,} fit for {self.seeds} seeds)"
        )

    def _allocate(self, device: torch.device) -> torch.Tensor:
        """The zeroed storage; an allocation that fails after all (memory taken meanwhile,
        or a limit the check cannot see) is the same one line as a failed check."""
        shape = ((self.capacity, self.row_size) if self.seeds == 1
                 else (self.seeds, self.capacity, self.row_size))
        try:
            return torch.zeros(shape, dtype=self.dtype, device=device)
        except (MemoryError, RuntimeError) as error:  # torch.OutOfMemoryError is a RuntimeError
            if not _is_out_of_memory(error):
                raise
            free, where = _available_memory(device) or (0, f"{device} has too little memory")
            raise self._too_big(free, f"{where} and the allocation failed") from None

    def __len__(self) -> int:
        """Rows filled so far (at most `capacity`); with K seeds, the least filled seed's
        count, so ``len(buffer) >= batch_size`` means every seed can give a batch."""
        return self._size if self.seeds == 1 else min(self._sizes)

    @property
    def position(self) -> int:
        """The ring index the next added row goes to (one seed only: see `positions`)."""
        if self.seeds > 1:
            raise ValueError(f"a replay buffer of {self.seeds} seeds has a position per seed; "
                             f"read positions")
        return self._position

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each seed's fill level (one value with one seed)."""
        return (self._size,) if self.seeds == 1 else tuple(self._sizes)

    @property
    def positions(self) -> tuple[int, ...]:
        """Each seed's next write position (one value with one seed)."""
        return (self._position,) if self.seeds == 1 else tuple(self._positions)

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage tensor."""
        return self.storage.numel() * self.storage.element_size()

    def describe(self) -> str:
        """One line for the run log, e.g. `replay buffer: 1,000 rows x 24 float32 on cpu = ...`."""
        dtype = str(self.dtype).removeprefix("torch.")
        seeds = f"{self.seeds} seeds x " if self.seeds > 1 else ""
        return (
            f"replay buffer: {seeds}{self.capacity:,} rows x {self.row_size} {dtype} "
            f"on {self.device} = {_format_bytes(self.nbytes)}"
        )

    def add(
        self,
        observations: ArrayLike,
        actions: ArrayLike,
        rewards: ArrayLike,
        next_observations: ArrayLike,
        terminations: ArrayLike,
        *,
        keep: ArrayLike | None = None,
    ) -> None:
        """Append n transitions (one per parallel env), overwriting the oldest when full.

        `observations`/`next_observations` are (n, observation_size), `actions` is
        (n, action_size), `rewards` and `terminations` are (n,) or (n, 1). Pass terminations
        only, never `terminations | truncations`: a truncated episode must still bootstrap.
        The rows are packed on the host and copied to the device in one transfer.

        With K seeds the arrays hold K x n rows, seed k's envs being rows k*n .. k*n+n-1, and
        `keep` (K x n booleans; all when None) says which rows are stored: each seed appends
        its own kept rows, in order, to its own ring (n at most, none at all is fine).
        """
        if self.seeds > 1:
            self._add_seeds(observations, actions, rewards, next_observations, terminations,
                            keep)
            return
        if keep is not None:
            raise ValueError("keep is for a replay buffer of several seeds")
        n = _leading_size(observations)
        layout = self.layout
        staging, rows = self._staging_rows((n, self.row_size))
        rows[:, layout.observations] = _as_columns("observations", observations, n,
                                                   self.observation_size)
        rows[:, layout.actions] = _as_columns("actions", actions, n, self.action_size)
        rows[:, layout.rewards] = _as_columns("rewards", rewards, n, 1)
        # Stored as not_done.
        rows[:, layout.not_dones] = 1.0 - _as_columns("terminations", terminations, n,
                                                      1).astype(rows.dtype)
        rows[:, layout.next_observations] = _as_columns("next_observations", next_observations,
                                                        n, self.observation_size)
        self._write(staging)

    def _add_seeds(self, observations: ArrayLike, actions: ArrayLike, rewards: ArrayLike,
                   next_observations: ArrayLike, terminations: ArrayLike,
                   keep: ArrayLike | None) -> None:
        """`add` with K seeds. The staging is (K, n, row_size + 1): each seed's kept rows
        first, then a last column that is 1 on the rows to store and 0 on the others; the
        device writes each seed's count at its own position (`write_seed_rows`)."""
        total, seeds = _leading_size(observations), self.seeds
        if total % seeds:
            raise ValueError(f"observations must hold {seeds} seeds x num_envs rows, got {total}")
        n = total // seeds
        if n > self.capacity:
            raise ValueError(f"{n} rows per seed do not fit in a ring of {self.capacity}")
        layout, row_size = self.layout, self.row_size
        staging, packed = self._staging_rows((seeds, n, row_size + 1))
        rows = packed.reshape(total, row_size + 1)  # a view: the staging is contiguous
        rows[:, layout.observations] = _as_columns("observations", observations, total,
                                                   self.observation_size)
        rows[:, layout.actions] = _as_columns("actions", actions, total, self.action_size)
        rows[:, layout.rewards] = _as_columns("rewards", rewards, total, 1)
        rows[:, layout.not_dones] = 1.0 - _as_columns("terminations", terminations, total,
                                                      1).astype(rows.dtype)
        rows[:, layout.next_observations] = _as_columns("next_observations", next_observations,
                                                        total, self.observation_size)
        counts = [n] * seeds
        if keep is None:
            rows[:, row_size] = 1.0
        else:
            kept = _as_columns("keep", keep, total, 1).reshape(seeds, n).astype(bool)
            for seed in range(seeds):
                block, count = packed[seed], int(kept[seed].sum())
                if count < n:  # the kept rows first, in order
                    block[:count] = block[kept[seed]]
                counts[seed] = count
                block[:count, row_size] = 1.0
                block[count:, row_size] = 0.0
        self._write_seeds(staging, counts)

    def _write_seeds(self, staged: torch.Tensor, counts: list[int]) -> None:
        """Write the staged (K, n, row_size + 1) rows: one replay of a captured graph on
        CUDA (as `_write`), the same function run eagerly elsewhere."""
        graph = self._write_graph(staged.shape[1])
        if graph is not None:
            graph.replay()
        else:
            assert self._seed_starts is not None
            write_seed_rows(self.storage, self.position_tensor, self.size_tensor, staged,
                            self._offsets(staged.shape[1]), self._seed_starts)
        if self.device.type == "cuda":
            self._staging[self._staging_turn][2].record(self._stream)
            self._staging_copied[self._staging_turn] = True
        for seed, count in enumerate(counts):
            self._positions[seed] = (self._positions[seed] + count) % self.capacity
            self._sizes[seed] = min(self._sizes[seed] + count, self.capacity)

    def _offsets(self, n: int) -> torch.Tensor:
        """``arange(n)`` on the device, made once per n and held: a graph that reads it keeps
        only its address."""
        if self._write_offsets is None or self._write_offsets.shape[0] != n:
            self._write_offsets = torch.arange(n, device=self.device)
        return self._write_offsets

    def _staging_rows(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
        """A host tensor of `shape` (n rows, or K seeds x n rows + a flag) to pack into (and
        its numpy view); pinned when the storage is on CUDA."""
        if not self._staging or self._staging[0][0].shape != shape:
            pin = self.device.type == "cuda"
            tensors = [torch.empty(shape, dtype=self.dtype, pin_memory=pin)
                       for _ in range(2)]
            self._staging = [(t, t.numpy(), torch.cuda.Event() if pin else None)
                             for t in tensors]
            # Fetched once: current_stream() costs more than the copy it orders. Adds are
            # issued on the stream current at the first one.
            self._stream = torch.cuda.current_stream(self.device) if pin else None
            self._staging_copied = [False, False]
            self._write_graphs = None  # captured for the new staging buffers at first use
        self._staging_turn ^= 1
        rows, view, copied = self._staging[self._staging_turn]
        if self._staging_copied[self._staging_turn]:
            # The non-blocking copy from two adds ago may still be reading these pinned rows;
            # with two buffers in turn that copy has almost always finished, so this rarely waits.
            copied.synchronize()
        return rows, view

    def _write(self, rows: torch.Tensor) -> None:
        """Write the staged ``rows`` into the ring. On CUDA that is one replay of a small
        captured graph (the copy from pinned memory, the scatter at the device-side position,
        the position and fill-level updates): one launch where the plain path makes three."""
        n = rows.shape[0]
        graph = self._write_graph(n)
        if graph is not None:
            graph.replay()
        else:
            self._write_plain(rows)
        if self.device.type == "cuda":
            self._staging[self._staging_turn][2].record(self._stream)
            self._staging_copied[self._staging_turn] = True
        self._position = (self._position + n) % self.capacity
        self._size = min(self._size + n, self.capacity)

    def _write_graph(self, n: int) -> torch.cuda.CUDAGraph | None:
        """The captured write of this add's staging buffer (captured at the first add of n
        rows); None on the CPU, for a batch longer than the ring, or when capturing failed
        (the plain path then writes, after a one-time warning)."""
        if self.device.type != "cuda" or n > self.capacity or not self._graph_writes:
            return None
        if self._write_graphs is None:
            try:
                self._write_graphs = [self._capture_write(staging)
                                      for staging, _, _ in self._staging]
            except CaptureError as error:
                warnings.warn(f"{error}; writing the replay buffer without a graph",
                              stacklevel=4)
                self._graph_writes = False
                return None
        return self._write_graphs[self._staging_turn]

    def _write_plain(self, rows: torch.Tensor) -> None:
        n = rows.shape[0]
        kept = min(n, self.capacity)  # a batch longer than the ring keeps only its last rows
        rows = rows[n - kept :]
        start = (self._position + n - kept) % self.capacity
        non_blocking = self.device.type == "cuda"
        if start + kept <= self.capacity:
            self.storage[start : start + kept].copy_(rows, non_blocking=non_blocking)
        else:
            # The batch straddles the end: one transfer, then scatter with device-made indices.
            on_device = rows.to(self.device, non_blocking=non_blocking)
            index = torch.arange(start, start + kept, device=self.device) % self.capacity
            self.storage.index_copy_(0, index, on_device)
        self.position_tensor.fill_((self._position + n) % self.capacity)
        if self._size < self.capacity:
            self.size_tensor.fill_(min(self._size + n, self.capacity))

    def _capture_write(self, staging: torch.Tensor) -> torch.cuda.CUDAGraph:
        """A graph that writes ``staging``'s rows (pinned; read when the graph runs) at the
        device-side position. Its kernels are warmed up on scratch copies of the ring, so
        capturing writes nothing."""
        if self.seeds > 1:
            return self._capture_seed_write(staging)
        n = staging.shape[0]
        # Held by the buffer: a graph keeps only the addresses of the tensors it reads, and
        # freed ones are handed out again (the write then lands wherever their new data says).
        if self._write_offsets is None or self._write_offsets.shape[0] != n:
            self._write_offsets = torch.arange(n, device=self.device)
        offsets = self._write_offsets
        scratch = (self.storage[:n].clone(), self.position_tensor.clone(),
                   self.size_tensor.clone())
        graph, _ = capture_graph(
            lambda: write_rows(self.storage, self.position_tensor, self.size_tensor, staging,
                               offsets),
            self.device, what="the replay buffer's write",
            warmup=lambda: write_rows(*scratch, staging, offsets))
        return graph

    def _capture_seed_write(self, staging: torch.Tensor) -> torch.cuda.CUDAGraph:
        """`_capture_write` with K seeds: warmed up on scratch rings of n rows per seed."""
        seeds, n = staging.shape[0], staging.shape[1]
        offsets, starts = self._offsets(n), self._seed_starts
        assert starts is not None
        scratch = (self.storage[:, :n].clone(), self.position_tensor.clone(),
                   self.size_tensor.clone(), staging, offsets,
                   torch.arange(seeds, device=self.device)[:, None] * n)
        graph, _ = capture_graph(
            lambda: write_seed_rows(self.storage, self.position_tensor, self.size_tensor,
                                    staging, offsets, starts),
            self.device, what="the replay buffer's write",
            warmup=lambda: write_seed_rows(*scratch))
        return graph

    def sample(self, batch_size: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Exactly `batch_size` packed rows drawn uniformly, with replacement, from the filled part.

        The indices are drawn on the device from its default generator and gathered with
        `index_select`, so sampling never waits for the device. Pass `out` (batch_size,
        row_size) to gather straight into a captured step's static input.

        With K seeds the sample is (K, batch_size, row_size): seed k's rows come from seed k's
        ring only, uniformly over its own fill level.
        """
        if self.seeds > 1:
            return self._sample_seeds(batch_size, out)
        if self._size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer; add transitions first")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        index = torch.randint(0, _INDEX_RANGE, (batch_size,), device=self.device)
        index.remainder_(self.size_tensor)
        if out is None:
            return torch.index_select(self.storage, 0, index)
        return torch.index_select(self.storage, 0, index, out=out)

    def _sample_seeds(self, batch_size: int, out: torch.Tensor | None) -> torch.Tensor:
        if min(self._sizes) == 0:
            empty = self._sizes.index(0)
            raise RuntimeError(f"cannot sample from an empty replay buffer (seed index {empty} "
                               f"holds no rows); add transitions first")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        assert self._seed_starts is not None
        # One draw for all seeds: seed k's indices are row k, each reduced modulo its own
        # fill level, then moved into its ring of the flat storage.
        index = torch.randint(0, _INDEX_RANGE, (self.seeds, batch_size), device=self.device)
        index.remainder_(self.size_tensor[:, None])
        index.add_(self._seed_starts)
        flat = self.storage.view(self.seeds * self.capacity, self.row_size)
        if out is None:
            rows = torch.index_select(flat, 0, index.view(-1))
            return rows.view(self.seeds, batch_size, self.row_size)
        torch.index_select(flat, 0, index.view(-1),
                           out=out.view(self.seeds * batch_size, self.row_size))
        return out

    def state_dict(self) -> dict[str, Any]:
        """The filled rows (as a CPU tensor), ring position and size, for a checkpoint. With
        K seeds: the rows up to the fullest seed's level, and positions and sizes per seed."""
        if self.seeds > 1:
            return {
                "storage": self.storage[:, : max(self._sizes)].detach().cpu(),
                "positions": list(self._positions),
                "sizes": list(self._sizes),
                "seeds": self.seeds,
                "capacity": self.capacity,
                "row_size": self.row_size,
            }
        return {
            "storage": self.storage[: self._size].detach().cpu(),
            "position": self._position,
            "size": self._size,
            "capacity": self.capacity,
            "row_size": self.row_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved, into this buffer's existing storage."""
        saved_seeds = int(state.get("seeds", 1))
        if saved_seeds != self.seeds:
            raise ConfigError(
                f"the checkpoint's replay buffer holds {saved_seeds} seed"
                f"{'s' if saved_seeds > 1 else ''}, this run has {self.seeds}; "
                f"resume with --num-seeds {saved_seeds}"
            )
        if state["capacity"] != self.capacity or state["row_size"] != self.row_size:
            raise ConfigError(
                f"the checkpoint's replay buffer is {state['capacity']:,} rows x "
                f"{state['row_size']}, this one is {self.capacity:,} x {self.row_size}; "
                f"resume with --buffer-size {state['capacity']} and the same environment"
            )
        if self.seeds > 1:
            self._load_seeds(state)
            return
        size = int(state["size"])
        self.storage[:size].copy_(state["storage"])
        self._position = int(state["position"])
        self._size = size
        self.size_tensor.fill_(size)
        self.position_tensor.fill_(self._position)

    def _load_seeds(self, state: dict[str, Any]) -> None:
        saved = state["storage"]
        self.storage[:, : saved.shape[1]].copy_(saved)
        self._positions = [int(p) for p in state["positions"]]
        self._sizes = [int(s) for s in state["sizes"]]
        self.size_tensor.copy_(torch.tensor(self._sizes, dtype=torch.int64))
        self.position_tensor.copy_(torch.tensor(self._positions, dtype=torch.int64))


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


def _leading_size(value: ArrayLike) -> int:
    shape = tuple(value.shape)
    if len(shape) != 2:
        raise ValueError(
            f"observations must be shaped (num_envs, observation_size), got shape {shape}"
        )
    return shape[0]


def _as_columns(name: str, value: ArrayLike, n: int, width: int) -> np.ndarray:
    """`value` as a host array of shape (n, width), or a ValueError naming the argument."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    shape = tuple(array.shape)
    if shape == (n,) and width == 1:
        return array.reshape(n, 1)
    if shape != (n, width):
        expected = f"({n},) or ({n}, 1)" if width == 1 else f"({n}, {width})"
        raise ValueError(f"{name} must have shape {expected}, got {shape}")
    return array


class BatchSampler:
    """One replay sample per call, written straight into fixed tensors (a step's static
    inputs and targets), so nothing is copied or gathered in Python between steps.

    Args:
        buffer: the replay buffer to draw from (uniformly, with replacement).
        batch_size: rows per sample.
        outputs: ``(tensor, columns)`` pairs: each ``tensor`` (batch_size, width) receives the
            sample's ``columns`` (a slice of the packed row); with a buffer of K seeds each
            is (K, batch_size, width), seed k's sample in row k.
        use_graph: capture the draw as a CUDA graph (the buffer must be on CUDA): one launch
            per sample, reading the buffer's current fill level from its device tensor.
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        batch_size: int,
        outputs: list[tuple[torch.Tensor, slice]],
        *,
        use_graph: bool = False,
    ) -> None:
        if len(buffer) == 0:
            raise RuntimeError("cannot sample from an empty replay buffer; add transitions first")
        self.buffer = buffer
        self.batch_size = batch_size
        seeds = () if buffer.seeds == 1 else (buffer.seeds,)
        self.rows = torch.empty(*seeds, batch_size, buffer.row_size, dtype=buffer.dtype,
                                device=buffer.device)
        self._outputs = [tensor for tensor, _ in outputs]
        self._columns = [self.rows[..., columns] for _, columns in outputs]
        for tensor, column in zip(self._outputs, self._columns, strict=True):
            if tensor.shape != column.shape or tensor.device != self.rows.device:
                raise ValueError(
                    f"sample output of shape {tuple(tensor.shape)} on {tensor.device} does not "
                    f"match its columns, {tuple(column.shape)} on {self.rows.device}"
                )
        self.graph = (capture_graph(self.draw, self.rows.device, what="the replay sampling")[0]
                      if use_graph else None)

    def draw(self) -> None:
        """Draw a new sample into the outputs as ordinary launches, not as the graph (inside
        another capture, this records the sampling into that graph)."""
        self.buffer.sample(self.batch_size, out=self.rows)
        torch._foreach_copy_(self._outputs, self._columns)

    def __call__(self) -> None:
        """Draw a new sample into the outputs."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self.draw()
