"""Observation normalisation (``--obs-norm``): each seed's running mean and variance of the
observations it has collected, kept on the host in float64, and the one fixed device tensor
that the captured update and the acting policy read them from.

The ring keeps raw observations; a sampled batch's observations and next observations, and
the observations the policy acts on, are normalised as ``(x - mean) / (std + 0.01)``: the
references' form (FastTD3's and FastSAC's ``EmpiricalNormalization``). The 0.01 is added to
the standard deviation, not under the square root, so a constant dimension gives 0 and a
dimension that barely varies is scaled by at most 100, not by 1e4. There is no clipping, as
in the references: with the 0.01 floor an outlier is at most 100 times its distance to the
mean, and clipping (SB3's +-10) would hide the scale the references were tuned with.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from rl_graphstep.data.ringwrite import InTurns
from rl_graphstep.data.rows import ArrayLike, as_columns

__all__ = ["STD_EPS", "ObservationNormalizer", "chan_update"]

STD_EPS = 1e-2
"""Added to the standard deviation (as FastTD3 and FastSAC do)."""


def chan_update(count: int, mean: np.ndarray, var: np.ndarray, batch: np.ndarray
                ) -> tuple[int, np.ndarray, np.ndarray]:
    """(count, mean, population variance) of the rows seen so far and the rows of ``batch``
    (B, O) together: Chan et al.'s parallel rule. Its cross term is ``(batch_mean -
    old_mean)^2``; the references use the new mean there, which shrinks the term by
    (count / new_count)^2 ({1, 3} then {5} gives them 1.556 instead of 8/3)."""
    size = batch.shape[0]
    if size == 0:
        return count, mean, var
    batch_mean = batch.mean(axis=0)
    batch_var = batch.var(axis=0)
    total = count + size
    delta = batch_mean - mean
    new_mean = mean + delta * (size / total)
    m2 = var * count + batch_var * size + delta**2 * (count * size / total)
    return total, new_mean, m2 / total


class ObservationNormalizer:
    """K seeds' observation statistics: host float64 ``count`` (K,), ``mean`` and ``var``
    (K, O), and ``stats``, a fixed device tensor (2, K, 1, O) float32 of [mean | std + 0.01]
    that every normalisation reads. ``stats`` is made once and only ever written in place,
    so captured graphs that read it read the values of the last :meth:`update`.

    Before any observation (count 0) a seed's normalisation is the identity (mean 0,
    divisor 1).

    Stream order (CUDA): :meth:`update` copies the new statistics to ``stats`` from pinned
    memory without blocking, on the current stream (the loop's: the one the ring writes and
    the updates use). What is queued after it on that stream reads the new values, what was
    queued before the old ones; nothing else writes ``stats``. An action on a stream of its
    own reads a copy of ``stats`` staged on the updates' stream with the actor (see
    ``run.acting``), one round behind, as it reads the actor. When the loop updates it: see
    ``run.collector``.
    """

    def __init__(self, seeds: int, observation_size: int, device: torch.device | str) -> None:
        self.seeds, self.observation_size = int(seeds), int(observation_size)
        self.device = torch.device(device)
        self.count = np.zeros(self.seeds, dtype=np.int64)
        self.mean = np.zeros((self.seeds, self.observation_size))
        self.var = np.ones((self.seeds, self.observation_size))
        self.stats = torch.empty((2, self.seeds, 1, self.observation_size), device=self.device)
        cuda = self.device.type == "cuda"
        # Two pinned host copies used in turn, as the ring's staging is: the upload of two
        # updates ago may still be reading one.
        self._host = [torch.empty(self.stats.shape, pin_memory=cuda) for _ in range(2)]
        self._turns = InTurns()
        self._upload()

    def update(self, observations: ArrayLike, keep: ArrayLike | None = None) -> None:
        """Count the rows of ``observations`` (K x n, O; seed k's rows k*n .. k*n+n-1) whose
        ``keep`` is true (all when None) and upload the new statistics. The caller keeps
        non-finite rows out (the collector keeps those the replay buffer will not store)."""
        total = observations.shape[0]
        rows = as_columns("observations", observations, total, self.observation_size)
        by_seed = rows.astype(np.float64).reshape(self.seeds, -1, self.observation_size)
        kept = None if keep is None else np.asarray(keep, dtype=bool).reshape(self.seeds, -1)
        for k in range(self.seeds):
            batch = by_seed[k] if kept is None else by_seed[k][kept[k]]
            self.count[k], self.mean[k], self.var[k] = chan_update(
                int(self.count[k]), self.mean[k], self.var[k], batch)
        self._upload()

    def _upload(self) -> None:
        """``stats`` from the host statistics, written in place on the current stream."""
        host = self._host[self._turns.take()]
        seen = (self.count > 0)[:, None]
        host[0, :, 0] = torch.from_numpy(np.where(seen, self.mean, 0.0))
        host[1, :, 0] = torch.from_numpy(np.where(seen, np.sqrt(self.var) + STD_EPS, 1.0))
        if self.device.type != "cuda":
            self.stats.copy_(host)
            return
        self.stats.copy_(host, non_blocking=True)
        self._turns.queued(torch.cuda.current_stream(self.device))

    def normalize(self, observations: Tensor, stats: Tensor | None = None) -> Tensor:
        """``(x - mean) / (std + 0.01)`` of ``observations``: (K, B, O) with K > 1 seeds,
        (B, O) with one. ``stats``: a copy of :attr:`stats` to read instead (the acting one)."""
        mean, divisor = self._parts(self.stats if stats is None else stats)
        return (observations - mean) / divisor

    def normalize_(self, observations: Tensor) -> Tensor:
        """:meth:`normalize` in place (a sample's columns); the same values to the bit."""
        mean, divisor = self._parts(self.stats)
        return observations.sub_(mean).div_(divisor)

    def _parts(self, stats: Tensor) -> tuple[Tensor, Tensor]:
        # (K, 1, O) views broadcast over (K, B, O); one seed's (1, O) over (B, O).
        return (stats[0], stats[1]) if self.seeds > 1 else (stats[0, 0], stats[1, 0])

    def member(self, k: int) -> ObservationNormalizer:
        """Seed ``k``'s statistics alone, as a one-seed normaliser (for evaluation)."""
        one = ObservationNormalizer(1, self.observation_size, self.device)
        one.load_state_dict({name: value[k : k + 1] for name, value in self.state_dict().items()})
        return one

    def state_dict(self) -> dict[str, Any]:
        """The host statistics as CPU tensors (float64: a resume continues bit for bit)."""
        return {"count": torch.from_numpy(self.count.copy()),
                "mean": torch.from_numpy(self.mean.copy()),
                "var": torch.from_numpy(self.var.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put :meth:`state_dict` back and upload it; a ValueError names a shape that does not
        fit this normaliser's seeds and observation size."""
        shape = (self.seeds, self.observation_size)
        mean = np.asarray(state["mean"], dtype=np.float64)
        if mean.shape != shape:
            raise ValueError(f"the saved observation statistics are for (seeds, observation "
                             f"size) {mean.shape}, this run has {shape}")
        self.count[:] = np.asarray(state["count"], dtype=np.int64)
        self.mean[:] = mean
        self.var[:] = np.asarray(state["var"], dtype=np.float64)
        self._upload()
