"""Adam's (and AdamW's) step that leaves what the non-finite guard skips untouched, for the
compiled update: one run's whole step, or the skipped seeds of K stacked on a leading
dimension.

With ``torch.optim.Adam`` a skip needs the guard's backup of every parameter and moment
before the step and its restore after it: passes over all of them besides Adam's own. Here
the skip is part of the step: a kept seed gets torch's Adam update (the capturable form's
arithmetic), a skipped one keeps its parameters and moments to the bit, and the compiler
fuses each tensor's update into one pass. It works on the Adam's own state, so checkpoints
and the uncompiled path (torch's step and the guard's restore) are unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rl_graphstep.core.guards import seed_view


def supports_masked_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether :func:`masked_adam_step` can stand in for ``optimizer.step()``: torch's Adam
    or AdamW without the options it leaves out (AMSGrad, L2 weight decay added to the
    gradient, maximize, differentiable), whose step counts live beside the parameters (CPU
    parameters, or a capturable or fused optimizer): the step count advances by the device's
    ``keep``, with no copy to the host. Decoupled (AdamW's) weight decay it applies."""
    return type(optimizer) in (torch.optim.Adam, torch.optim.AdamW) and all(
        not group["amsgrad"] and not group["maximize"]
        and (group["weight_decay"] == 0 or _decoupled(optimizer, group))
        and not group["differentiable"] and _steps_on_device(group)
        for group in optimizer.param_groups)


def _decoupled(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether the group's weight decay is AdamW's (the parameters shrink by ``lr * wd``
    before the step) rather than Adam's L2 term added to the gradient."""
    return type(optimizer) is torch.optim.AdamW or bool(
        group.get("decoupled_weight_decay", False))


def _steps_on_device(group: dict[str, Any]) -> bool:
    """Whether Adam keeps this group's step counts on its parameters' device."""
    return bool(group["capturable"] or group["fused"]) or all(
        parameter.device.type == "cpu" for parameter in group["params"])


@torch.no_grad()
def masked_adam_step(optimizer: torch.optim.Adam, keep: Tensor) -> None:
    """One Adam step for the seeds whose ``keep`` (K,) is 1; the others' slices of every
    parameter and moment stay as they are. The step count is one per tensor, shared by the
    seeds, as with the guard's restore: it advances when any seed steps. One run's ``keep``
    is 0-dim: the whole step or nothing. A group's decoupled weight decay (AdamW) first
    scales a kept seed's parameters by ``1 - lr * weight_decay``, as torch's AdamW does."""
    stepped = keep.amax()
    for group in optimizer.param_groups:
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        weight_decay = group["weight_decay"]  # 0 but for AdamW (supports_masked_step)
        for parameter in group["params"]:
            if parameter.grad is None:
                continue
            grad = parameter.grad
            state = optimizer.state[parameter]
            step, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
            kept = (keep if keep.dim() == 0 else seed_view(keep, parameter)) > 0
            step.add_(stepped)
            new_avg = exp_avg.lerp(grad, 1 - beta1)
            new_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
            step_size = lr / (1 - beta1 ** step)
            denominator = new_avg_sq.sqrt() / (1 - beta2 ** step).sqrt() + eps
            decayed = parameter * (1 - lr * weight_decay) if weight_decay else parameter
            parameter.copy_(torch.where(kept, decayed - step_size * (new_avg / denominator),
                                        parameter))
            exp_avg.copy_(torch.where(kept, new_avg, exp_avg))
            exp_avg_sq.copy_(torch.where(kept, new_avg_sq, exp_avg_sq))
