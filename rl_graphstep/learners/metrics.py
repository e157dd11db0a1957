"""Running sums of per-update metrics on the device: added without a sync, read once per log."""

from __future__ import annotations

from typing import Any

import torch


class MetricSums:
    """Running sums of 0-dim metric tensors, each on its value's device, and how many adds
    each set of keys had: adding never syncs, and :meth:`take` syncs once per device.

    The device add and the count are apart so a CUDA graph can record the add: prepare the
    keys first (that creates their sums), record :meth:`add_on_device` in the graph, and
    :meth:`count` each replay on the host.

    ``shape``: the shape of every value; a seed group's are ``(K,)``, one entry per seed, read
    with :meth:`take_rows`.
    """

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.shape = torch.Size(shape)
        self._sums: dict[str, torch.Tensor] = {}
        # Adds per set of keys (the delayed actor's metrics come every other update) and the
        # sums each set adds into, so an add costs one dict lookup and one launch.
        self._calls: dict[tuple[str, ...], int] = {}
        self._groups: dict[tuple[str, ...], list[torch.Tensor]] = {}

    def prepare(self, values: dict[str, torch.Tensor]) -> tuple[str, ...]:
        """Create the sums of ``values``' keys where missing (checking each value is 0-dim);
        return the set of keys, for :meth:`count`."""
        keys = tuple(values)
        if keys not in self._groups:
            for key, value in values.items():
                if value.shape != self.shape:
                    want = "a 0-dim tensor" if not self.shape else f"of shape {tuple(self.shape)}"
                    raise ValueError(f"logged value {key!r} must be {want}, got {value.shape}")
                if key not in self._sums:
                    # float32 even for integer tensors, so the mean is a true division.
                    self._sums[key] = torch.zeros(self.shape, dtype=torch.float32,
                                                  device=value.device)
            self._groups[keys] = [self._sums[k] for k in keys]
            self._calls.setdefault(keys, 0)
        return keys

    def add_on_device(self, values: dict[str, torch.Tensor]) -> None:
        """Add ``values`` into their prepared sums: one fused kernel, nothing on the host."""
        if values:
            with torch.no_grad():
                torch._foreach_add_(self._groups[tuple(values)], list(values.values()))

    def count(self, keys: tuple[str, ...]) -> None:
        """Count one add of the key set ``keys`` (made on the device, by a graph)."""
        self._calls[keys] += 1

    def add(self, values: dict[str, torch.Tensor]) -> None:
        """Add each 0-dim tensor into its key's running sum, without a sync."""
        keys = self.prepare(values)
        self.add_on_device(values)
        self.count(keys)

    def take(self) -> dict[str, float]:
        """Each key's mean since the last take (keys added since), then zero the sums in
        place: a graph that adds into them keeps adding into the same tensors."""
        return self._take()  # type: ignore[return-value]

    def take_rows(self) -> dict[str, list[float]]:
        """:meth:`take` for sums of shape ``(K,)``: each key's K means."""
        if len(self.shape) != 1:
            raise ValueError(f"take_rows needs sums of shape (K,), these are {tuple(self.shape)}")
        return self._take()  # type: ignore[return-value]

    def _take(self) -> dict[str, float] | dict[str, list[float]]:
        counts = dict.fromkeys(self._sums, 0)
        for keys, calls in self._calls.items():
            for key in keys:
                counts[key] += calls
        added = [k for k in self._sums if counts[k]]
        means: dict[str, Any] = {}
        # Grouped by device: one host sync for the usual single-device run.
        for device in {self._sums[k].device for k in added}:
            group = [k for k in added if self._sums[k].device == device]
            totals = torch.stack([self._sums[k] for k in group]).tolist()
            means.update({k: _divide(total, counts[k])
                          for k, total in zip(group, totals, strict=True)})
        if added:
            with torch.no_grad():
                torch._foreach_zero_([self._sums[k] for k in added])
        self._calls = dict.fromkeys(self._calls, 0)
        return {k: means[k] for k in added}


def _divide(total: Any, count: int) -> Any:
    """A sum read back (a float, or a list of them for shaped sums) over its add count."""
    return [t / count for t in total] if isinstance(total, list) else total / count
