"""Replay buffer: a ring of packed transition rows (see rows.RowLayout) preallocated on the
training device, its adds, fixed-size samples drawn on the device, and its checkpoint state.

A sample is always exactly `batch_size` rows, drawn on the device, so it can feed a captured
step's static buffers without a host sync. With K seeds trained together, each seed has a ring
of its own: one (K, capacity, row) storage, per-seed fill levels and positions, (K, batch_size,
row) samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.data.memory import available_memory as _available_memory
from rl_graphstep.data.memory import format_bytes as _format_bytes
from rl_graphstep.data.memory import is_out_of_memory as _is_out_of_memory
from rl_graphstep.data.normalizer import ObservationNormalizer
from rl_graphstep.data.ringwrite import RingWriter, place
from rl_graphstep.data.rows import ArrayLike, RowLayout, as_columns, leading_size

__all__ = ["ReplayBuffer"]

# Indices are drawn as randint(0, 2**62) % size: the size is a device tensor (a graph reads its
# current value), and the modulo bias is below size / 2**62, far under any sampling noise.
_INDEX_RANGE = 2**62


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
        normalizer: with ``--obs-norm``, the observation statistics that the samples of a
            ``BatchSampler`` come out normalised by (the collector counts the observations).
            The ring itself keeps the raw observations.

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
        normalizer: ObservationNormalizer | None = None,
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
        # The K rings end to end in one flat storage, then one spare row that takes the rows
        # an add does not store (see ringwrite.place); `storage` views the rings alone.
        self._flat = self._allocate(device)
        rings = self._flat[: self.seeds * self.capacity]
        self.storage = rings if self.seeds == 1 else rings.view(self.seeds, self.capacity,
                                                                self.row_size)
        # The storage's device, so a bare "cuda" reads back as "cuda:0".
        self.device = self.storage.device
        # The write positions and fill levels: the host's, and on the device (a captured
        # sampling graph reads the current fill level, the write graph sets both), as views
        # of one (2, K) tensor the write copies in one go. One seed's are 0-dim.
        self._positions = np.zeros(self.seeds, dtype=np.int64)
        self._sizes = np.zeros(self.seeds, dtype=np.int64)
        self._counters = torch.zeros((2, self.seeds), dtype=torch.int64, device=self.device)
        self.position_tensor, self.size_tensor = ((self._counters[0, 0], self._counters[1, 0])
                                                  if self.seeds == 1 else self._counters)
        # Where each seed's ring starts in the flat storage, (K, 1), read by the sampling.
        self._seed_starts = (torch.arange(self.seeds, device=self.device)[:, None] * self.capacity
                             if self.seeds > 1 else None)
        # Stages each add's rows on the host and writes them in (on CUDA, a captured write).
        self._writer = RingWriter(self._flat, self._counters)
        self.normalizer = normalizer

    def _check_fits(self, device: torch.device) -> None:
        needed = (self.seeds * self.capacity + 1) * self.row_size * self.dtype.itemsize
        available = _available_memory(device)
        if available is None or needed <= available[0]:
            return
        raise self._too_big(*available)

    def _too_big(self, free: int, where: str) -> ConfigError:
        row_bytes = self.row_size * self.dtype.itemsize
        needed = (self.seeds * self.capacity + 1) * row_bytes
        fitting = max(free // row_bytes - 1, 0) // self.seeds  # the spare row, then K rings
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
        """The zeroed flat storage; an allocation that fails after all (memory taken
        meanwhile, or a limit the check cannot see) is the same one line as a failed check."""
        try:
            return torch.zeros((self.seeds * self.capacity + 1, self.row_size), dtype=self.dtype,
                               device=device)
        except (MemoryError, RuntimeError) as error:  # torch.OutOfMemoryError is a RuntimeError
            if not _is_out_of_memory(error):
                raise
            free, where = _available_memory(device) or (0, f"{device} has too little memory")
            raise self._too_big(free, f"{where} and the allocation failed") from None

    def __len__(self) -> int:
        """Rows filled so far (at most `capacity`); with K seeds, the least filled seed's
        count, so ``len(buffer) >= batch_size`` means every seed can give a batch."""
        return int(self._sizes.min())

    @property
    def position(self) -> int:
        """The ring index the next added row goes to (one seed only: see `positions`)."""
        if self.seeds > 1:
            raise ValueError(f"a replay buffer of {self.seeds} seeds has a position per seed; "
                             f"read positions")
        return int(self._positions[0])

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each seed's fill level (one value with one seed)."""
        return tuple(int(size) for size in self._sizes)

    @property
    def positions(self) -> tuple[int, ...]:
        """Each seed's next write position (one value with one seed)."""
        return tuple(int(position) for position in self._positions)

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
        terminations: ArrayLike | None,
        *,
        keep: ArrayLike | None = None,
        not_dones: ArrayLike | None = None,
    ) -> None:
        """Append n transitions (one per parallel env), overwriting the oldest when full.

        `observations`/`next_observations` are (n, observation_size), `actions` is
        (n, action_size), `rewards` and `terminations` are (n,) or (n, 1). Pass terminations
        only, never `terminations | truncations`: a truncated episode must still bootstrap.
        The rows are packed on the host, beside the slot each goes to, and copied to the
        device in one transfer (see `ringwrite`).

        With K seeds the arrays hold K x n rows, seed k's envs being rows k*n .. k*n+n-1, and
        `keep` (K x n booleans; all when None) says which rows are stored: each seed appends
        its own kept rows, in order, to its own ring (n at most, none at all is fine).

        `not_dones` (n,) instead of terminations (None then) stores each row's not_done
        column as given: n-step rows (see `nstep`), whose not_done is gamma^(k-1) or 0.
        """
        total, seeds = leading_size(observations), self.seeds
        if seeds == 1 and keep is not None:
            raise ValueError("keep is for a replay buffer of several seeds")
        if total % seeds:
            raise ValueError(f"observations must hold {seeds} seeds x num_envs rows, got {total}")
        if seeds > 1 and total // seeds > self.capacity:
            raise ValueError(f"{total // seeds} rows per seed do not fit in a ring of "
                             f"{self.capacity}")
        kept = (None if keep is None
                else as_columns("keep", keep, total, 1).reshape(seeds, -1).astype(bool))
        staging = self._writer.staging(total)
        self.layout.pack(staging.rows, observations, actions, rewards, next_observations,
                         terminations, not_dones=not_dones)
        place(self._positions, self._sizes, self.capacity, kept, staging.slots,
              staging.counters)
        self._writer.write()
        self._positions[:], self._sizes[:] = staging.counters

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
        if self._sizes[0] == 0:
            raise RuntimeError("cannot sample from an empty replay buffer; add transitions first")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        index = torch.randint(0, _INDEX_RANGE, (batch_size,), device=self.device)
        index.remainder_(self.size_tensor)
        if out is None:
            return torch.index_select(self.storage, 0, index)
        return torch.index_select(self.storage, 0, index, out=out)

    def _sample_seeds(self, batch_size: int, out: torch.Tensor | None) -> torch.Tensor:
        if self._sizes.min() == 0:
            empty = int(np.flatnonzero(self._sizes == 0)[0])
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
                "storage": self.storage[:, : max(self.sizes)].detach().cpu(),
                "positions": list(self.positions),
                "sizes": list(self.sizes),
                "seeds": self.seeds,
                "capacity": self.capacity,
                "row_size": self.row_size,
            }
        return {
            "storage": self.storage[: len(self)].detach().cpu(),
            "position": self.position,
            "size": len(self),
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
        saved = state["storage"]
        if self.seeds > 1:
            self.storage[:, : saved.shape[1]].copy_(saved)
            positions, sizes = state["positions"], state["sizes"]
        else:
            self.storage[: saved.shape[0]].copy_(saved)
            positions, sizes = [state["position"]], [state["size"]]
        self._positions[:] = [int(p) for p in positions]
        self._sizes[:] = [int(s) for s in sizes]
        self._counters.copy_(torch.from_numpy(np.stack([self._positions, self._sizes])))
