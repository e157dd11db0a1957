"""Batch renormalisation (Ioffe, 2017) as CrossQ uses it: a layer of the built-in networks,
with each ensemble member's statistics where it sits in the ensemble critic, and the switch of
a network's normalisation between its batch (training) and running (inference) statistics.

The layer follows CrossQ's original implementation (``adityab/CrossQ``,
``sbx/sac/policies.py``, ``BatchRenorm``): biased batch variance, running statistics moved by
``momentum`` towards the batch's (Flax's ``0.99`` decay is a ``momentum`` of 0.01 here),
plain batch normalisation for the first ``warmup`` training calls, then the batch statistics
corrected by ``r`` and ``d`` (clipped to ``r_max`` and ``d_max``, no gradient through them).
Everything is a device tensor (the call count too), shapes are fixed and nothing syncs with
the host, so a training call runs inside a CUDA graph and, stacked over K seeds
(``networks.seeds``), under ``torch.vmap``: the running statistics are updated with
``mul_``/``add_`` (``lerp_`` has no vmap batching rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["BatchRenorm", "BatchRenormSettings", "InTrainingMode", "renorm_blocks",
           "training_mode"]


@dataclasses.dataclass(frozen=True)
class BatchRenormSettings:
    """A batch-renormalisation layer's constants (CrossQ's: momentum 0.01, i.e. Flax's decay
    0.99; 100,000 warm-up calls; r_max 3, d_max 5; eps 1e-3, Flax's default)."""

    momentum: float = 0.01
    warmup: int = 100_000
    r_max: float = 3.0
    d_max: float = 5.0
    eps: float = 1e-3


class BatchRenorm(nn.Module):
    """Batch renormalisation over the batch dimension (the second to last) of inputs shaped
    ``(*groups, B, width)``, with statistics, scale and shift shaped ``(*groups, width)``:
    ``groups=(E,)`` in the ensemble critic gives each member its own.

    Training mode normalises with the batch's mean and (biased) variance, corrected after the
    warm-up by ``r = clip(sigma_B / sigma, 1/r_max, r_max)`` and
    ``d = clip((mu_B - mu) / sigma, -d_max, d_max)``, and moves the running statistics
    towards the batch's; inference mode (``eval()``) normalises with the running ones.

    Args:
        width: the features normalised.
        groups: leading dimensions with statistics of their own (ensemble members).
        settings: momentum, warm-up, clip limits and eps.
    """

    def __init__(self, width: int, groups: Sequence[int] = (),
                 settings: BatchRenormSettings = BatchRenormSettings()) -> None:
        super().__init__()
        shape = (*groups, width)
        self.settings = settings
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        # Training calls so far: the warm-up reads it on the device, never as a Python int
        # frozen into a captured graph.
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (*groups, B, width) normalised, scaled and shifted."""
        if self.training:
            mean, var = self._training_statistics(x)
        else:
            mean, var = self.running_mean, self.running_var
        scale = torch.rsqrt(var + self.settings.eps) * self.weight
        return (x - mean.unsqueeze(-2)) * scale.unsqueeze(-2) + self.bias.unsqueeze(-2)

    def _training_statistics(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The mean and variance a training call normalises with, after moving the running
        statistics (and the call count) on."""
        s = self.settings
        batch_mean = x.mean(dim=-2)
        batch_var = x.var(dim=-2, unbiased=False)
        with torch.no_grad():
            running_std = torch.sqrt(self.running_var + s.eps)
            r = (torch.sqrt(batch_var + s.eps) / running_std).clamp(1 / s.r_max, s.r_max)
            d = ((batch_mean - self.running_mean) / running_std).clamp(-s.d_max, s.d_max)
        # The original's renormalised statistics: normalising with them is x_hat * r + d up
        # to eps. clamp_min keeps sqrt's gradient finite where a feature is constant over the
        # batch (a ReLU unit dead on every row): sqrt(0)'s infinite slope times the zero
        # gradient torch.where sends the unused branch would be NaN.
        renorm_mean = batch_mean - d * batch_var.clamp_min(torch.finfo(x.dtype).tiny).sqrt() / r
        renorm_var = batch_var / r.square()
        warmed_up = self.steps >= s.warmup
        mean = torch.where(warmed_up, renorm_mean, batch_mean)
        var = torch.where(warmed_up, renorm_var, batch_var)
        with torch.no_grad():
            self.running_mean.add_(batch_mean - self.running_mean, alpha=s.momentum)
            self.running_var.add_(batch_var - self.running_var, alpha=s.momentum)
            self.steps.add_(1)
        return mean, var

    def extra_repr(self) -> str:
        s = self.settings
        return (f"{tuple(self.weight.shape)}, momentum={s.momentum}, warmup={s.warmup}, "
                f"r_max={s.r_max}, d_max={s.d_max}, eps={s.eps}")


def renorm_blocks(sizes: Sequence[int], settings: BatchRenormSettings) -> nn.Sequential:
    """CrossQ's trunk ``sizes[0] -> ... -> sizes[-1]``: batch renormalisation of the input,
    then Linear -> ReLU -> batch renormalisation per hidden layer (the original's order:
    normalised after the activation)."""
    layers: list[nn.Module] = [BatchRenorm(sizes[0], settings=settings)]
    for fan_in, fan_out in pairwise(sizes):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU(), BatchRenorm(fan_out, settings=settings)]
    return nn.Sequential(*layers)


@contextmanager
def training_mode(module: nn.Module, training: bool) -> Iterator[None]:
    """``module`` (and its submodules) in training or inference mode inside the block, as
    it was after it. The mode is read on the host as a step is recorded: a captured graph
    keeps the mode it was recorded in."""
    modes = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


class InTrainingMode(nn.Module):
    """``module`` called in training mode (batch statistics, running ones moved on) and left
    in inference mode: an adaptation step's module, whose network otherwise acts, evaluates
    and serves other losses with its running statistics. Its parameters and buffers are the
    network's own."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def _get_name(self) -> str:
        return f"{self.module._get_name()} (in training mode)"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with training_mode(self.module, True):
            return self.module(*args, **kwargs)
