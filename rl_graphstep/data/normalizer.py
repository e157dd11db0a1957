"""Observation and reward normalisation (``--obs-norm``, ``--reward-norm``): each seed's
running statistics, kept on the host in float64 (Chan's parallel rule), and for observations
the one fixed device tensor that the captured update and the acting policy read them from.

Observations are normalised in one of two forms (:class:`NormalizationForm`), the one of the
reference each algorithm follows (its ``observation_form``):

- off-policy (:data:`REFERENCE_FORM`): ``(x - mean) / (std + 0.01)``, FastTD3's and FastSAC's
  ``EmpiricalNormalization``. The ring keeps raw observations; a sampled batch's observations
  and next observations, and the observations the policy acts on, are normalised. The 0.01
  is added to the standard deviation, not under the square root, so a constant dimension
  gives 0 and a dimension that barely varies is scaled by at most 100, not by 1e4. There is
  no clipping, as in the references: with the 0.01 floor an outlier is at most 100 times its
  distance to the mean, and clipping would hide the scale the references were tuned with.
- PPO (:data:`CLEANRL_FORM`): ``clip((x - mean) / sqrt(var + 1e-8), -10, 10)``, CleanRL's
  ``ppo_continuous_action.py`` (gymnasium's ``NormalizeObservation`` then a clip). The
  rollout stores the normalised observations, as CleanRL's buffer does.

Rewards (PPO, :class:`RewardNormalizer`): CleanRL's ``NormalizeReward`` then a clip. Each
env's discounted return ``ret = gamma * ret + r`` (0 again after an episode's end) feeds a
running variance, and the reward is ``clip(r / sqrt(var + 1e-8), -10, 10)``.

CleanRL keeps statistics per env (each env its own wrapper); here the N envs of a seed pool
theirs, one set per seed, as the stacked form of a seed's envs (K seeds keep K sets). Chan's
rule starts from no rows, where gymnasium's ``RunningMeanStd`` starts from a count of 1e-4 with
mean 0 and variance 1 (a difference of that weight in the first steps only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rl_graphstep.data.ringwrite import InTurns
from rl_graphstep.data.rows import ArrayLike, as_columns

__all__ = ["CLEANRL_FORM", "REFERENCE_FORM", "STD_EPS", "NormalizationForm",
           "ObservationNormalizer", "RewardNormalizer", "chan_one_row", "chan_update",
           "chan_update_seeds"]

STD_EPS = 1e-2
"""Added to the standard deviation (as FastTD3 and FastSAC do)."""

VAR_EPS = 1e-8
"""Added to the variance under the square root (gymnasium's wrappers, as CleanRL uses them)."""

CLIP = 10.0
"""CleanRL's clip of normalised observations and rewards."""


@dataclass(frozen=True)
class NormalizationForm:
    """``clip((x - mean) / (sqrt(var + var_eps) + std_eps), -clip, clip)``; no clip where
    ``clip`` is None."""

    std_eps: float
    var_eps: float
    clip: float | None

    def divisor(self, var: np.ndarray) -> np.ndarray:
        return np.sqrt(var + self.var_eps) + self.std_eps


REFERENCE_FORM = NormalizationForm(std_eps=STD_EPS, var_eps=0.0, clip=None)
"""The off-policy recipe's form, FastTD3's and FastSAC's: ``(x - mean) / (std + 0.01)``
(``var + 0.0`` and ``+ 0.01`` as before: the same values to the bit)."""

CLEANRL_FORM = NormalizationForm(std_eps=0.0, var_eps=VAR_EPS, clip=CLIP)
"""PPO's form, CleanRL's: ``clip((x - mean) / sqrt(var + 1e-8), -10, 10)``."""


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


def chan_update_seeds(count: np.ndarray, mean: np.ndarray, var: np.ndarray, batch: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`chan_update` of K seeds at once, every seed counting n rows: ``count`` (K,),
    ``mean`` and ``var`` (K, D), ``batch`` (K, n, D), n >= 1. The same operations, elementwise:
    the same values to the bit as K calls (one launch of numpy's work instead of K). It runs
    at every env step (the observations', PPO's returns'): its few numpy calls are kept few."""
    size = batch.shape[1]
    total = count + size
    counted = count[:, None].astype(np.float64)  # exact: counts stay far below 2**53
    totals = total[:, None].astype(np.float64)
    # One row a seed (one env): its mean is the row and its variance 0, exactly.
    delta = (batch[:, 0] if size == 1 else batch.mean(axis=1)) - mean
    new_mean = mean + delta * (size / totals)
    m2 = var * counted
    if size > 1:
        m2 += batch.var(axis=1) * size
    m2 += delta * delta * (counted * size / totals)
    return total, new_mean, m2 / totals


def chan_one_row(count: float, mean: Any, var: Any, row: Any) -> tuple[Any, Any]:
    """(mean, variance) after one more row: :func:`chan_update_seeds` with one row, the same
    operations in the same order, for Python floats or numpy arrays alike (the same values
    to the bit). ``count``: the rows counted before, as a float (exact below 2**53)."""
    total = count + 1.0
    delta = row - mean
    return mean + delta * (1 / total), (var * count + delta * delta * (count / total)) / total


class ObservationNormalizer:
    """K seeds' observation statistics: host float64 ``count`` (K,), ``mean`` and ``var``
    (K, O), and ``stats``, a fixed device tensor (2, K, 1, O) float32 of [mean | divisor]
    that every normalisation reads (the divisor ``std + 0.01`` in the off-policy ``form``,
    ``sqrt(var + 1e-8)`` in PPO's, which also clips to +-10). ``stats`` is made once and
    only ever written in place, so captured graphs that read it read the values of the last
    :meth:`update`.

    Before any observation (count 0) a seed's normalisation is the identity (mean 0,
    divisor 1).

    Stream order (CUDA): :meth:`update` copies the new statistics to ``stats`` from pinned
    memory without blocking, on the current stream (the loop's: the one the ring writes and
    the updates use). What is queued after it on that stream reads the new values, what was
    queued before the old ones. An action on a stream of its own reads a copy of ``stats``
    staged on the updates' stream with the actor (see ``run.acting``), one round behind, as
    it reads the actor. When the loop updates it: see ``run.collector``. PPO instead counts
    with :meth:`observe` and brings :meth:`write_stats`'s rows in with the observations it
    acts on, in the acting's one copy, which writes ``stats`` on the same stream
    (``learners.onpolicy``).
    """

    def __init__(self, seeds: int, observation_size: int, device: torch.device | str, *,
                 form: NormalizationForm = REFERENCE_FORM) -> None:
        self.seeds, self.observation_size = int(seeds), int(observation_size)
        self.form = form
        self.device = torch.device(device)
        self.count = np.zeros(self.seeds, dtype=np.int64)
        self.mean = np.zeros((self.seeds, self.observation_size))
        self.var = np.ones((self.seeds, self.observation_size))
        self.stats = torch.empty((2, self.seeds, 1, self.observation_size), device=self.device)
        cuda = self.device.type == "cuda"
        # Two pinned host copies used in turn, as the ring's staging is: the upload of two
        # updates ago may still be reading one.
        self._host = [torch.empty(self.stats.shape, pin_memory=cuda) for _ in range(2)]
        self._host_rows = [host.numpy()[:, :, 0] for host in self._host]  # (2, K, O) views
        self._turns = InTurns()
        self._upload()

    def update(self, observations: ArrayLike, keep: ArrayLike | None = None) -> None:
        """Count the rows of ``observations`` (K x n, O; seed k's rows k*n .. k*n+n-1) whose
        ``keep`` is true (all when None) and upload the new statistics. The caller keeps
        non-finite rows out (the collector keeps those the replay buffer will not store)."""
        self.observe(observations, keep)
        self._upload()

    def observe(self, observations: ArrayLike, keep: ArrayLike | None = None) -> None:
        """:meth:`update`'s counting alone, on the host: ``stats`` stays as it was until
        its owner writes :meth:`write_stats`'s rows into it (PPO's acting does, with the
        observations, in one copy)."""
        total = observations.shape[0]
        rows = as_columns("observations", observations, total, self.observation_size)
        by_seed = np.asarray(rows, dtype=np.float64).reshape(self.seeds, -1,
                                                             self.observation_size)
        kept = None if keep is None else np.asarray(keep, dtype=bool).reshape(self.seeds, -1)
        if self.seeds == 1 and by_seed.shape[1] == 1 and (kept is None or kept[0, 0]):
            self._count_one_row(by_seed[0])
        elif by_seed.shape[1] and (kept is None or kept.all()):  # every row counts: at once
            self.count, self.mean, self.var = chan_update_seeds(self.count, self.mean,
                                                                self.var, by_seed)
        else:
            for k in range(self.seeds):
                batch = by_seed[k] if kept is None else by_seed[k][kept[k]]
                self.count[k], self.mean[k], self.var[k] = chan_update(
                    int(self.count[k]), self.mean[k], self.var[k], batch)

    def _count_one_row(self, row: np.ndarray) -> None:
        """:func:`chan_update_seeds` of one seed's one row (1, O) by :func:`chan_one_row`,
        its count in a Python float: half the numpy calls. One env of one seed (PPO's
        CleanRL settings) counts a row before every action, on the path from one env step
        to the next."""
        self.mean, self.var = chan_one_row(float(self.count[0]), self.mean, self.var, row)
        self.count = self.count + 1

    def _upload(self) -> None:
        """``stats`` from the host statistics, written in place on the current stream."""
        turn = self._turns.take()
        host = self._host[turn]
        self.write_stats(self._host_rows[turn])
        if self.device.type != "cuda":
            self.stats.copy_(host)
            return
        self.stats.copy_(host, non_blocking=True)
        self._turns.queued(torch.cuda.current_stream(self.device))

    def write_stats(self, rows: np.ndarray) -> None:
        """[mean | divisor] of the host statistics into ``rows`` (2, K, O), a float32 view of
        host memory that is copied to :attr:`stats` (a seed without observations: the
        identity, mean 0 and divisor 1)."""
        if self.count.all():
            rows[0], rows[1] = self.mean, self.form.divisor(self.var)
        else:
            seen = (self.count > 0)[:, None]
            rows[0] = np.where(seen, self.mean, 0.0)
            rows[1] = np.where(seen, self.form.divisor(self.var), 1.0)

    def normalize(self, observations: Tensor, stats: Tensor | None = None) -> Tensor:
        """``(x - mean) / divisor`` of ``observations``, clipped where the form clips: (K, B, O)
        with K > 1 seeds, (B, O) with one. ``stats``: a copy of :attr:`stats` to read instead
        (the acting one)."""
        mean, divisor = self._parts(self.stats if stats is None else stats)
        normalized = (observations - mean) / divisor
        clip = self.form.clip
        return normalized if clip is None else normalized.clamp_(-clip, clip)

    def normalize_(self, observations: Tensor) -> Tensor:
        """:meth:`normalize` in place (a sample's columns); the same values to the bit."""
        mean, divisor = self._parts(self.stats)
        normalized = observations.sub_(mean).div_(divisor)
        clip = self.form.clip
        return normalized if clip is None else normalized.clamp_(-clip, clip)

    def _parts(self, stats: Tensor) -> tuple[Tensor, Tensor]:
        # (K, 1, O) views broadcast over (K, B, O); one seed's (1, O) over (B, O).
        return (stats[0], stats[1]) if self.seeds > 1 else (stats[0, 0], stats[1, 0])

    def member(self, k: int) -> ObservationNormalizer:
        """Seed ``k``'s statistics alone, as a one-seed normaliser (for evaluation)."""
        one = ObservationNormalizer(1, self.observation_size, self.device, form=self.form)
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


class RewardNormalizer:
    """PPO's ``--reward-norm`` for K seeds of N envs (env rows k*N .. k*N+N-1 are seed k's),
    on the host in float64: each env's running discounted return ``returns`` (K*N,), and each
    seed's ``count``, ``mean`` and ``var`` (K,) of the returns of its N envs, pooled.

    :meth:`scale` takes one vector step's rewards: it adds them to the returns, counts the
    returns into their seed's statistics, and gives back ``clip(r / sqrt(var + 1e-8), -10,
    10)`` with the variance that counts them; then an env whose episode ended (terminated or
    truncated) starts its return again at 0. No mean is subtracted (gymnasium's wrapper
    neither: a reward's sign stays). gymnasium's ``NormalizeReward`` instead writes ``ret =
    gamma * ret * (1 - terminated) + r``, which keeps the carry of a truncated episode, and
    at a termination counts the reward alone; here a return is its episode's, from its start.
    A non-finite return is not counted (its env's return counts again from its next episode).
    """

    def __init__(self, seeds: int, num_envs: int, gamma: float, *, var_eps: float = VAR_EPS,
                 clip: float = CLIP) -> None:
        self.seeds, self.num_envs, self.gamma = int(seeds), int(num_envs), float(gamma)
        self.var_eps, self.clip = var_eps, clip
        self.count = np.zeros(self.seeds, dtype=np.int64)
        self.mean = np.zeros(self.seeds)
        self.var = np.ones(self.seeds)
        self.returns = np.zeros(self.seeds * self.num_envs)

    def scale(self, rewards: ArrayLike, terminations: ArrayLike, truncations: ArrayLike
              ) -> np.ndarray:
        """The step's rewards (K*N,) scaled and clipped, float64; the statistics and returns
        moved on by them."""
        if self.returns.shape[0] == 1:
            return self._scale_one(rewards, terminations, truncations)
        return self._scale_all(rewards, terminations, truncations)

    def _scale_all(self, rewards: ArrayLike, terminations: ArrayLike, truncations: ArrayLike
                   ) -> np.ndarray:
        """:meth:`scale` of every env at once, in numpy."""
        rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
        self.returns = self.returns * self.gamma + rewards
        by_seed = self.returns.reshape(self.seeds, self.num_envs, 1)
        finite = np.isfinite(by_seed[..., 0])
        if finite.all():  # every return counts: all seeds at once
            count, mean, var = chan_update_seeds(self.count, self.mean[:, None],
                                                 self.var[:, None], by_seed)
            self.count, self.mean, self.var = count, mean[:, 0], var[:, 0]
        else:
            for k in range(self.seeds):
                count, mean, var = chan_update(int(self.count[k]), self.mean[k : k + 1],
                                               self.var[k : k + 1], by_seed[k][finite[k]])
                self.count[k], self.mean[k], self.var[k] = count, mean[0], var[0]
        divisor = np.sqrt(self.var + self.var_eps)
        if self.num_envs > 1:
            divisor = np.repeat(divisor, self.num_envs)
        # np.clip's values, in two ufuncs (np.clip's wrapper costs more than both).
        scaled = np.minimum(np.maximum(rewards / divisor, -self.clip), self.clip)
        ended = np.logical_or(np.asarray(terminations, dtype=bool).reshape(-1),
                              np.asarray(truncations, dtype=bool).reshape(-1))
        self.returns[ended] = 0.0
        return scaled

    def _scale_one(self, rewards: ArrayLike, terminations: ArrayLike, truncations: ArrayLike
                   ) -> np.ndarray:
        """:meth:`scale` of one seed's one env in Python floats (:func:`chan_one_row`; IEEE
        doubles either way, so the same values to the bit), without numpy's cost per call on
        one-element arrays (about 50 µs a step against 9 on a 2-CPU machine)."""
        reward = float(np.asarray(rewards).reshape(-1)[0])
        ret = float(self.returns[0]) * self.gamma + reward
        if math.isfinite(ret):
            self.mean[0], self.var[0] = chan_one_row(float(self.count[0]), float(self.mean[0]),
                                                     float(self.var[0]), ret)
            self.count[0] += 1
        scaled = min(max(reward / math.sqrt(float(self.var[0]) + self.var_eps), -self.clip),
                     self.clip)
        ended = bool(np.asarray(terminations).reshape(-1)[0]) or bool(
            np.asarray(truncations).reshape(-1)[0])
        self.returns[0] = 0.0 if ended else ret
        return np.array([scaled])

    def state_dict(self) -> dict[str, Any]:
        """The statistics and the envs' running returns as CPU tensors (float64: a resume
        continues bit for bit)."""
        return {"count": torch.from_numpy(self.count.copy()),
                "mean": torch.from_numpy(self.mean.copy()),
                "var": torch.from_numpy(self.var.copy()),
                "returns": torch.from_numpy(self.returns.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put :meth:`state_dict` back; a ValueError names statistics of another number of
        seeds. Saved returns of another number of envs (a resume with another --num-envs,
        whose episodes restart) are not taken: every env's return starts at 0."""
        var = np.asarray(state["var"], dtype=np.float64)
        if var.shape != self.var.shape:
            raise ValueError(f"the saved reward statistics are for {var.size} seeds, this run "
                             f"has {self.seeds}")
        self.count[:] = np.asarray(state["count"], dtype=np.int64)
        self.mean[:] = np.asarray(state["mean"], dtype=np.float64)
        self.var[:] = var
        returns = np.asarray(state["returns"], dtype=np.float64)
        self.returns[:] = returns if returns.shape == self.returns.shape else 0.0

    def restart_episodes(self) -> None:
        """Every env's return from 0: their episodes restart (a resume without the envs)."""
        self.returns[:] = 0.0
