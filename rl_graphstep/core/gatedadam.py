"""Adam whose step a device tensor can hold back, per seed and without a host sync: PPO's
target-KL early stop, where a seed that stops must leave its parameters and moments exactly
as they are for the rest of the rollout's update, inside a captured graph that replays
every minibatch all the same."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from rl_graphstep.core.maskedadam import masked_adam_step


class GatedAdam(torch.optim.Adam):
    """``torch.optim.Adam`` whose :meth:`step` updates only where ``gate`` is 1.

    ``gate``: a float device tensor, () for one run or (K,) for K seeds stacked on the leading
    dimension of every parameter, 1 to step and 0 to hold; the caller writes it in place
    (a captured step reads its current value on every replay). A held seed keeps its
    parameters and its moments to the bit; the step count, one per tensor and shared by the
    seeds, advances while any seed steps (as with the non-finite guard's skips).

    The step is :func:`~rl_graphstep.core.maskedadam.masked_adam_step` (the capturable form's
    arithmetic), so it needs what that supports: no AMSGrad, maximize or L2 weight decay. The
    state is Adam's own (``exp_avg``, ``exp_avg_sq``, ``step`` on the parameter's device), so
    its state dict loads into a plain Adam and back.
    """

    def __init__(self, params: Iterable[Any], gate: Tensor, **kwargs: Any) -> None:
        for option in ("amsgrad", "maximize", "differentiable"):
            if kwargs.get(option):
                raise ValueError(f"GatedAdam does not support {option}=True")
        if kwargs.get("weight_decay"):
            raise ValueError("GatedAdam does not support weight_decay (Adam's L2 term)")
        super().__init__(params, **kwargs)
        self.gate = gate

    def _initialise_state(self) -> None:
        """Adam's zero state where a parameter with a gradient has none yet (torch's own step
        would make it on its first call)."""
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.grad is None or self.state[parameter]:
                    continue
                self.state[parameter] = {
                    "step": torch.zeros((), dtype=torch.float32, device=parameter.device),
                    "exp_avg": torch.zeros_like(parameter, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(parameter,
                                                   memory_format=torch.preserve_format),
                }

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """One Adam step for the seeds (or the run) whose gate is 1."""
        if closure is not None:
            raise ValueError("GatedAdam.step takes no closure")
        self._initialise_state()
        masked_adam_step(self, self.gate)
