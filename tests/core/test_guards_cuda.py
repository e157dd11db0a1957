"""GPU tests of the gradient guards inside a captured step: the clip's recorded norm and the
non-finite guard's skip, replay by replay as the eager twin computes them; per seed for K
stacked seeds too."""

from __future__ import annotations

import pytest
import torch
from cudatools import DEVICE, batches, mlp, mse
from torch import nn

import rl_graphstep.core.update_body as update_body
from rl_graphstep.core.capture import Snapshot, capturing, warm_up
from rl_graphstep.core.guards import GradNormClip, NonFiniteGuard, clip_grad_norm
from rl_graphstep.core.maskedadam import masked_adam_step
from rl_graphstep.core.update_body import UpdateBody
from rl_graphstep.graphstep import CudaGraphAdaptationStep, EagerAdaptationStep

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


@pytest.mark.parametrize("compile", [False, True], ids=["plain", "compiled"])
def test_a_nan_batch_is_skipped_inside_the_graph(compile: bool) -> None:
    """Plain, between the guard's backup and restore; compiled, by the masked Adam step."""
    graph_module, eager_module = mlp(), mlp()
    graph_step = CudaGraphAdaptationStep.capture(
        graph_module, adam(graph_module.parameters()), *batches(1)[0], mse, skip_nonfinite=True,
        gradient_transform=clip_grad_norm(graph_module.parameters(), 1.0), compile=compile)
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
    assert graph_step._body is not None and not graph_step._body.uncompiled_parts
    for p, q in zip(graph_module.parameters(), eager_module.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)



SEEDS = 3


class StackedMLP(nn.Module):
    """K two-layer MLPs stacked by hand as (K, ...) parameters; bmm forward."""

    def __init__(self, seeds: int = SEEDS, seed: int = 0, width: int = 64) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = nn.Parameter(0.5 * torch.randn(seeds, 4, width, generator=g))
        self.b1 = nn.Parameter(0.1 * torch.randn(seeds, 1, width, generator=g))
        self.w2 = nn.Parameter(0.1 * torch.randn(seeds, width, 2, generator=g))
        self.b2 = nn.Parameter(0.1 * torch.randn(seeds, 1, 2, generator=g))
        self.to(DEVICE)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.baddbmm(self.b1, inputs, self.w1).relu()
        return torch.baddbmm(self.b2, hidden, self.w2)


def seed_mse(prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((prediction - targets) ** 2).mean(dim=(1, 2))


def seed_batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    scale = torch.tensor([1.0, 10.0, 100.0], device=DEVICE).view(-1, 1, 1)
    return [(torch.randn(SEEDS, 32, 4, device=DEVICE, generator=g),
             scale * torch.randn(SEEDS, 32, 2, device=DEVICE, generator=g)) for _ in range(n)]


def seed_body(module: nn.Module, compile: bool = False) -> UpdateBody:
    optimizer = adam(module.parameters())
    return UpdateBody(module, optimizer, seed_mse,
                      clip_grad_norm(module.parameters(), 5.0, seeds=SEEDS),
                      NonFiniteGuard(optimizer, torch.device(DEVICE), seeds=SEEDS), seeds=SEEDS,
                      compile=compile)


def captured(body: UpdateBody, inputs: torch.Tensor,
             targets: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
    """The body captured by hand (warm-up, capture, pre-capture values back) on static
    buffers; returns the graph and the buffers it reads."""
    static_inputs, static_targets = inputs.clone(), targets.clone()
    snapshot = Snapshot(body.module, body.optimizer)
    warm_up(lambda: body(static_inputs, static_targets), torch.device(DEVICE), 3)
    graph = torch.cuda.CUDAGraph()
    body.optimizer.zero_grad(set_to_none=True)
    with capturing(graph, None):
        body(static_inputs, static_targets)
    snapshot.restore(body.optimizer)
    assert body.guard is not None
    body.guard.reset()
    return graph, static_inputs, static_targets


@pytest.mark.parametrize("compile", [False, True], ids=["plain", "compiled"])
def test_a_captured_seed_update_clips_and_skips_each_seed_alone(
        compile: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain, torch's Adam steps between the guard's backup and restore; compiled, the masked
    Adam step skips the bad seed itself."""
    # A tensor counts the masked steps: compiled code guards on a Python list's length, so
    # appending to one would recompile the part inside the capture.
    masked = torch.zeros((), device=DEVICE)

    def counted_step(*args: object) -> None:
        masked.add_(1)
        masked_adam_step(*args)

    monkeypatch.setattr(update_body, "masked_adam_step", counted_step)
    data = seed_batches(4, seed=3)
    poisoned = data[2][1].clone()
    poisoned[1, 5, 0] = float("nan")
    runs = {}
    for name, poison in (("clean", False), ("poisoned", True)):
        body = seed_body(StackedMLP(), compile)
        graph, static_inputs, static_targets = captured(body, *data[0])
        history = []
        for update, (inputs, targets) in enumerate(data):
            static_inputs.copy_(inputs)
            static_targets.copy_(poisoned if poison and update == 2 else targets)
            graph.replay()
            history.append([p.detach().clone() for p in body.parameters])
        torch.cuda.synchronize()
        runs[name] = (body, history)
    eager = seed_body(StackedMLP())
    for inputs, targets in data:
        eager(inputs, targets)
    clean_body, clean = runs["clean"]
    body, guarded = runs["poisoned"]
    assert (masked.item() > 0) == compile and not body.uncompiled_parts
    assert body.guard is not None and clean_body.guard is not None
    assert body.guard.skipped.tolist() == [0, 1, 0]
    assert clean_body.guard.skipped.tolist() == [0, 0, 0]
    gradient_transform = clean_body.gradient_transform
    assert isinstance(gradient_transform, GradNormClip)
    assert gradient_transform.norm.shape == (SEEDS,)
    assert (gradient_transform.norm[1:] > 5.0).all()  # the clip was active
    for update in range(4):
        for a, b in zip(clean[update], guarded[update], strict=True):
            assert torch.equal(a[[0, 2]], b[[0, 2]]), update  # the other seeds, to the bit
    for a, b in zip(guarded[1], guarded[2], strict=True):
        assert torch.equal(a[1], b[1])  # the bad seed's update was undone
    for p, q in zip(clean_body.parameters, eager.parameters, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)  # the graph is the eager twin


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
