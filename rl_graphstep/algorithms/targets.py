"""Target networks' Polyak averaging: target <- (1 - tau) target + tau source, in place."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from rl_graphstep.core.compiling import compile_now


class PolyakAverage:
    """target <- (1 - tau) * target + tau * source for each (target, source) module pair, in
    place (a target is never re-created) and in one fused launch for all pairs.

    :meth:`compile` makes that launch one compiled kernel instead of a multi-tensor one.
    """

    def __init__(self, pairs: list[tuple[nn.Module, nn.Module]], tau: float) -> None:
        self.targets = [p for target, _ in pairs for p in target.parameters()]
        self.sources = [p for _, source in pairs for p in source.parameters()]
        if len(self.targets) != len(self.sources):
            raise ValueError("each target network must have its source's parameters")
        self.tau = tau
        # The compiled form and its weight, a device tensor: 0 while it compiles.
        self._compiled: Callable[[Tensor], None] | None = None
        self._weight: Tensor | None = None

    def compile(self) -> None:
        """Compile the average now, outside any capture (compiling inside one would fail),
        so that a graph recording it later records the compiled kernel. Compiled once, by a
        call with weight 0, which leaves every finite target as it is. Where the compiler
        fails, the average stays as it was, with a warning."""
        if self._compiled is not None or not self.targets:
            return
        weight = torch.zeros((), device=self.targets[0].device, dtype=self.targets[0].dtype)
        with torch.no_grad():
            self._compiled = compile_now(self._step, weight, what="the target update")
        weight.fill_(self.tau)
        self._weight = weight

    def _step(self, weight: Tensor) -> None:
        """targets += weight * (sources - targets), the formula ``lerp`` uses for weights
        below 0.5, in foreach ops: ``_foreach_lerp_`` takes no tensor weight."""
        differences = torch._foreach_sub(self.sources, self.targets)
        torch._foreach_add_(self.targets, torch._foreach_mul(differences, weight))

    @torch.no_grad()
    def __call__(self) -> None:
        if self._compiled is not None:
            self._compiled(self._weight)
        else:
            torch._foreach_lerp_(self.targets, self.sources, self.tau)
