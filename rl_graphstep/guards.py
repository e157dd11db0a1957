"""Gradient guards run inside an update: gradient-norm clipping, and the non-finite guard that
skips a bad update on the device."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from rl_graphstep.capture import selected_parameters, state_tensors


class GradNormClip:
    """Clip the gradients' total 2-norm to ``max_norm``; keep the pre-clip norm in ``self.norm``.

    ``self.norm`` is a preallocated 0-dim float32 tensor updated in place, so inside a CUDA
    graph every replay refreshes it and a logger can read it without re-allocations. The
    clipping itself never syncs with the host (``clip_grad_norm_`` scales by
    ``min(1, max_norm / (norm + 1e-6))`` on the device). ``max_norm=inf`` only records.
    """

    def __init__(self, parameters: Iterable[Tensor], max_norm: float) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        if not self.parameters:
            raise ValueError("clip_grad_norm needs at least one parameter that requires grad")
        if not max_norm > 0:
            raise ValueError(f"max_norm must be > 0, got {max_norm}")
        self.max_norm = float(max_norm)
        self.norm = torch.zeros((), dtype=torch.float32, device=self.parameters[0].device)

    def __call__(self) -> None:
        total = nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        self.norm.copy_(total)


def clip_grad_norm(parameters: Iterable[Tensor], max_norm: float) -> GradNormClip:
    """A capture-safe :data:`~rl_graphstep.graphstep.GradientTransform` clipping
    ``parameters`` to ``max_norm``."""
    return GradNormClip(parameters, max_norm)


class NonFiniteGuard:
    """Skips, on the device and without a host sync, an update whose loss or gradients are
    not finite, so one bad batch cannot corrupt the parameters.

    Before the optimizer step it zeroes the gradients of a bad update (so the step itself
    stays finite) and copies the parameters and optimizer state aside; after the step it
    puts them back exactly when the update was bad. ``skipped`` counts skipped updates,
    ``consecutive`` the current run of them (both int64 device tensors).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)
        self.consecutive = torch.zeros((), dtype=torch.int64, device=device)
        # The tensors' device, indexed ("cuda" -> "cuda:0"), so that it compares equal to the
        # parameters' devices: with "cuda" nothing would be backed up and a skip not undone.
        self.device = self.skipped.device
        self._tensors: list[Tensor] = []
        self._backups: list[Tensor] = []

    def _guarded(self) -> tuple[list[Tensor], list[Tensor]]:
        tensors = [
            t for t in (*selected_parameters(self.optimizer),
                        *(v for _, _, v in state_tensors(self.optimizer)))
            if t.is_floating_point() and t.device == self.device
        ]
        # The state appears after the first eager step; inside a graph this never changes.
        if len(tensors) != len(self._tensors) or any(
            a is not b for a, b in zip(tensors, self._tensors, strict=True)
        ):
            self._tensors, self._backups = tensors, [t.detach().clone() for t in tensors]
        return self._tensors, self._backups

    @torch.no_grad()
    def before_step(self, loss: Tensor, parameters: list[Tensor],
                    grad_norm: Tensor | None = None) -> Tensor:
        """Check the update, neutralise a bad one's gradients, back up what the step changes;
        returns the 0-dim float ``keep`` (1: finite update, 0: skip). ``grad_norm``: the
        gradients' total norm when already known (a clip computed it; it is finite exactly
        when every gradient is), saving its recomputation."""
        grads = [p.grad for p in parameters if p.grad is not None]
        finite = torch.isfinite(loss.detach())
        if grads:
            if grad_norm is None:
                grad_norm = torch.stack(torch._foreach_norm(grads)).sum()
            finite = finite & torch.isfinite(grad_norm)
            for grad in grads:
                grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            torch._foreach_mul_(grads, finite.to(grads[0].dtype))
        self.skipped.add_(~finite)
        self.consecutive.mul_(~finite).add_(~finite)
        tensors, backups = self._guarded()
        torch._foreach_copy_(backups, tensors)
        return finite.float()

    @torch.no_grad()
    def after_step(self, keep: Tensor) -> None:
        """Undo the step when ``keep`` is 0: t*1 + b*0 = t and t*0 + b*1 = b, exactly."""
        tensors, backups = self._guarded()
        torch._foreach_mul_(tensors, keep)
        torch._foreach_add_(tensors, torch._foreach_mul(backups, 1.0 - keep))

    def reset(self) -> None:
        """Zero both counts (a capture's warm-up skips are not the run's)."""
        self.skipped.zero_()
        self.consecutive.zero_()
