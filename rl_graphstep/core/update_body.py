"""The update both adaptation steps run: zero grads, forward, loss, backward, gradient transform,
(guarded) optimizer step, optionally compiled part by part."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from rl_graphstep.core.capture import selected_parameters
from rl_graphstep.core.compiling import CompiledParts
from rl_graphstep.core.guards import GradNormClip, NonFiniteGuard
from rl_graphstep.core.maskedadam import masked_adam_step, supports_masked_step

TensorLoss = Callable[[Any, Tensor], Tensor]
"""``loss_function(prediction, targets)``: a scalar, differentiable tensor."""

GradientTransform = Callable[[], None]
"""Run after backward and before the optimizer step, e.g. gradient-norm clipping."""

_FORWARD_LOSS = "forward and loss"
_APPLY = "gradient transform and optimizer step"


def _check_scalar_loss(loss: Any, loss_function: Callable, seeds: int = 1) -> None:
    """A differentiable scalar, or with K seeds the (K,) per-seed losses."""
    name = getattr(loss_function, "__qualname__", type(loss_function).__name__)
    if not isinstance(loss, Tensor):
        raise TypeError(f"loss_function {name} returned {type(loss).__name__}, expected a tensor")
    if seeds == 1 and loss.dim() != 0:
        raise ValueError(
            f"loss_function {name} returned shape {tuple(loss.shape)}, expected a scalar "
            "(shape ()); reduce it, e.g. with .mean()"
        )
    if seeds > 1 and loss.shape != (seeds,):
        raise ValueError(
            f"loss_function {name} returned shape {tuple(loss.shape)}, expected one loss per "
            f"seed (shape ({seeds},)); reduce all but the seed dimension, e.g. with "
            ".mean(dim=(1, 2))"
        )
    if not loss.requires_grad:
        raise ValueError(
            f"loss_function {name} returned a tensor that does not require grad; it must "
            "depend on the optimizer's parameters"
        )


def _check_seed_pieces(seeds: int, gradient_transform: Any,
                       guard: NonFiniteGuard | None) -> None:
    """With K seeds, the guard and a clip must be per-seed ones of the same K."""
    if guard is not None and guard.seeds != seeds:
        raise ValueError(f"the update has {seeds} seeds, its guard {guard.seeds}")
    if isinstance(gradient_transform, GradNormClip):
        clip_seeds = getattr(gradient_transform, "seeds", 1)
        if clip_seeds != seeds:
            raise ValueError(
                f"the update has {seeds} seeds, its gradient-norm clip {clip_seeds}; clip each "
                f"seed by its own norm with clip_grad_norm(parameters, max_norm, seeds={seeds})"
            )


class UpdateBody:
    """The update both steps run: zero grads, forward, loss, backward, transform, step.

    With ``seeds=K > 1`` the module's parameters are stacked as (K, ...) and the loss function
    returns the (K,) per-seed losses: backward runs on their sum, which gives each seed exactly
    its own gradients, and the guard (a ``NonFiniteGuard(..., seeds=K)``) decides per seed
    from them and from the clip's per-seed norms, never from the sum, which one seed's NaN
    would make NaN for all. The step then returns the (K,) losses.

    Backward is restricted to the optimizer's parameters, so other module parameters and any
    module the loss calls (a critic inside an actor's loss) get no ``.grad`` written.

    With ``compile=True`` two parts are ``torch.compile``d (default mode), which fuses their
    many small kernels: forward + loss (its backward is compiled with it) and transform +
    guard + optimizer step; with torch's Adam the step there is
    :func:`~rl_graphstep.core.maskedadam.masked_adam_step`, which skips a bad update (or seed)
    itself, without the guard's backup and restore. The first call runs uncompiled: it
    checks the loss and creates the optimizer state, so the compiled code is traced once
    against the state it will keep. A part the compiler fails on (on its first compiled call,
    before it runs) stays uncompiled, with a warning, and :attr:`uncompiled_parts` names it.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_function: TensorLoss,
        gradient_transform: GradientTransform | None,
        guard: NonFiniteGuard | None = None,
        *,
        compile: bool = False,
        seeds: int = 1,
    ) -> None:
        _check_seed_pieces(seeds, gradient_transform, guard)
        self.seeds = seeds
        self.module, self.optimizer, self.guard = module, optimizer, guard
        self.loss_function, self.gradient_transform = loss_function, gradient_transform
        self.parameters = selected_parameters(optimizer)
        self._masked_step = supports_masked_step(optimizer)
        self._parts = CompiledParts({_FORWARD_LOSS: self._forward_loss, _APPLY: self._apply},
                                    compile=compile, owner=module._get_name())
        self._first_call_done = False

    @property
    def uncompiled_parts(self) -> list[str]:
        """The parts the compiler failed on, which run uncompiled."""
        return self._parts.uncompiled

    def _forward_loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        return self.loss_function(self.module(inputs), targets)

    def forward_loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """The loss on ``inputs``/``targets``, checked to be a differentiable scalar (the (K,)
        per-seed losses with K seeds)."""
        loss = self._forward_loss(inputs, targets)
        _check_scalar_loss(loss, self.loss_function, self.seeds)
        return loss

    def _apply(self, loss: Tensor) -> None:
        """Transform the gradients and step (skipping a non-finite update when guarded)."""
        if self.gradient_transform is not None:
            self.gradient_transform()
        if self.guard is None:
            self.optimizer.step()
        else:
            norm = self.gradient_transform.norm if isinstance(
                self.gradient_transform, GradNormClip) else None
            # Compiled, torch's Adam is replaced by one that skips a bad update (or seed) inside
            # its own step: fused passes instead of its step between the guard's backup and
            # restore.
            masked = self._masked_step and torch.compiler.is_compiling()
            keep = self.guard.before_step(loss, self.parameters, norm, masked_step=masked)
            if masked:
                masked_adam_step(self.optimizer, keep)
            else:
                self.optimizer.step()
                self.guard.after_step(keep)

    def __call__(self, inputs: Tensor, targets: Tensor) -> Tensor:
        # set_to_none: inside a capture, backward then allocates the gradients from the graph's
        # pool instead of recording an accumulation into stale ones.
        self.optimizer.zero_grad(set_to_none=True)
        if self._first_call_done:
            loss = self._parts.run(_FORWARD_LOSS, inputs, targets)
        else:
            loss = self.forward_loss(inputs, targets)
        (loss if self.seeds == 1 else loss.sum()).backward(inputs=self.parameters)
        # No grad: all of it works on gradients, and a compiled graph that starts with grad
        # mode on is traced as a training graph, which copies every tensor it updates.
        with torch.no_grad():
            if self._first_call_done:
                self._parts.run(_APPLY, loss.detach())
            else:
                self._apply(loss.detach())
        self._first_call_done = True
        return loss.detach()
