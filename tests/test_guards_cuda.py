"""GPU tests of the gradient guards inside a captured step: the clip's recorded norm and the
non-finite guard's skip, replay by replay as the eager twin computes them."""

from __future__ import annotations

import pytest
import torch
from cudatools import batches, mlp, mse

from rl_graphstep.graphstep import CudaGraphAdaptationStep, EagerAdaptationStep
from rl_graphstep.guards import NonFiniteGuard, clip_grad_norm

pytestmark = pytest.mark.cuda


def adam(params) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=1e-2, capturable=True)


def test_every_replay_refreshes_the_clip_norm() -> None:
    graph_module, eager_module = mlp(), mlp()
    graph_clip = clip_grad_norm(graph_module.parameters(), float("inf"))
    eager_clip = clip_grad_norm(eager_module.parameters(), float("inf"))
    data = batches(3, seed=2)
    graph_step = CudaGraphAdaptationStep.capture(graph_module, adam(graph_module.parameters()),
                                                 *data[0], mse, gradient_transform=graph_clip)
    eager_step = EagerAdaptationStep.capture(eager_module, adam(eager_module.parameters()),
                                             *data[0], mse, gradient_transform=eager_clip)
    norms = set()
    for inputs, targets in data:
        graph_step(inputs, targets, synchronize=True)
        eager_step(inputs, targets)
        torch.testing.assert_close(graph_clip.norm, eager_clip.norm)
        norms.add(graph_clip.norm.item())
    assert len(norms) == 3


def test_a_nan_batch_is_skipped_inside_the_graph() -> None:
    graph_module, eager_module = mlp(), mlp()
    graph_step = CudaGraphAdaptationStep.capture(
        graph_module, adam(graph_module.parameters()), *batches(1)[0], mse, skip_nonfinite=True,
        gradient_transform=clip_grad_norm(graph_module.parameters(), 1.0))
    eager_step = EagerAdaptationStep.capture(
        eager_module, adam(eager_module.parameters()), *batches(1)[0], mse,
        gradient_transform=clip_grad_norm(eager_module.parameters(), 1.0))
    good = batches(3, seed=4)
    poisoned = good[1][1].clone()
    poisoned[3, 1] = float("inf")
    for inputs, targets in (good[0], (good[1][0], poisoned), good[1], good[2]):
        graph_step(inputs, targets)
    for inputs, targets in good:
        eager_step(inputs, targets)
    assert graph_step.guard is not None and graph_step.guard.skipped.item() == 1
    for p, q in zip(graph_module.parameters(), eager_module.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_guard_on_the_unindexed_cuda_device_still_undoes_a_bad_step() -> None:
    """``torch.device("cuda")`` names the same GPU as the parameters' ``cuda:0``: the guard
    backs them up and puts them back after a step on a non-finite loss."""
    module = mlp()
    optimizer = adam(module.parameters())
    guard = NonFiniteGuard(optimizer, torch.device("cuda"))
    assert guard.device == next(module.parameters()).device
    inputs, targets = batches(1)[0]
    for bad in (False, True):
        before = [p.detach().clone() for p in module.parameters()]
        optimizer.zero_grad()
        loss = mse(module(inputs), targets) * (float("nan") if bad else 1.0)
        loss.backward()
        keep = guard.before_step(loss, list(module.parameters()))
        optimizer.step()
        guard.after_step(keep)
        changed = [not torch.equal(p, q) for p, q in zip(module.parameters(), before, strict=True)]
        assert all(changed) if not bad else not any(changed)
    assert guard.skipped.item() == 1
