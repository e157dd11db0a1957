"""CPU tests of the gradient guards: gradient-norm clipping and the non-finite guard."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rl_graphstep.graphstep import EagerAdaptationStep
from rl_graphstep.guards import NonFiniteGuard, clip_grad_norm


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))


def mse(prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((prediction - targets) ** 2).mean()


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)


def test_clip_bounds_the_update_and_records_the_norm() -> None:
    module = mlp()
    start = [p.detach().clone() for p in module.parameters()]
    clip = clip_grad_norm(module.parameters(), max_norm=0.1)
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    inputs, targets = batch()
    reference = mlp()
    mse(reference(inputs), 100 * targets).backward()
    expected_norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in reference.parameters()])
    )
    step = EagerAdaptationStep.capture(module, optimizer, inputs, 100 * targets, mse,
                                       gradient_transform=clip)
    step(inputs, 100 * targets)
    assert expected_norm > 1.0  # clipping is active
    torch.testing.assert_close(clip.norm, expected_norm)
    moved = torch.linalg.vector_norm(
        torch.cat([(p - s).flatten() for p, s in zip(module.parameters(), start, strict=True)])
    )
    torch.testing.assert_close(moved, torch.tensor(0.1), rtol=1e-4, atol=0)


def test_clip_with_infinite_max_norm_only_records() -> None:
    module = mlp()
    clip = clip_grad_norm(module.parameters(), float("inf"))
    mse(module(torch.ones(3, 4)), torch.zeros(3, 2)).backward()
    grads = [p.grad.clone() for p in module.parameters()]
    clip()
    assert clip.norm > 0
    for p, g in zip(module.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)


@pytest.mark.parametrize(("parameters", "max_norm", "message"), [
    ([], 1.0, "needs at least one parameter that requires grad"),
    (None, 0.0, "max_norm must be > 0, got 0.0"),
])
def test_clip_refuses_bad_arguments(parameters: list | None, max_norm: float,
                                    message: str) -> None:
    with pytest.raises(ValueError, match=message):
        clip_grad_norm(mlp().parameters() if parameters is None else parameters, max_norm)


def guarded_update(guard: NonFiniteGuard, module: nn.Module, optimizer: torch.optim.Optimizer,
                   targets: torch.Tensor) -> None:
    """One update as the steps run it: backward, guard, step, undo when bad."""
    optimizer.zero_grad(set_to_none=True)
    loss = mse(module(torch.ones(8, 4)), targets)
    loss.backward()
    keep = guard.before_step(loss, list(module.parameters()))
    optimizer.step()
    guard.after_step(keep)


def test_a_non_finite_update_leaves_parameters_and_state_as_they_were() -> None:
    module = mlp()
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    guard = NonFiniteGuard(optimizer, torch.device("cpu"))
    good = torch.zeros(8, 2)
    guarded_update(guard, module, optimizer, good)  # creates the optimizer state
    params = [p.detach().clone() for p in module.parameters()]
    state = {k: v.clone() for k, v in optimizer.state[module[0].weight].items()}
    bad = good.clone()
    bad[2, 1] = float("nan")
    for _ in range(2):
        guarded_update(guard, module, optimizer, bad)
    assert (guard.skipped.item(), guard.consecutive.item()) == (2, 2)
    for p, b in zip(module.parameters(), params, strict=True):
        assert torch.equal(p, b)
    for key, value in state.items():
        assert torch.equal(optimizer.state[module[0].weight][key], value), key
    guarded_update(guard, module, optimizer, good)
    assert (guard.skipped.item(), guard.consecutive.item()) == (2, 0)
    assert not torch.equal(module[0].weight, params[0])
    guard.reset()
    assert (guard.skipped.item(), guard.consecutive.item()) == (0, 0)
