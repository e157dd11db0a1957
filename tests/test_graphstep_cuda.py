"""GPU tests of the captured step: the documented constructor, restore, parity with the eager
twin, noise, pools, memory."""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from cudatools import DEVICE, batches, mlp, mse
from torch import nn

from rl_graphstep.core.errors import CaptureError
from rl_graphstep.core.guards import clip_grad_norm
from rl_graphstep.graphstep import (
    CudaGraphAdaptationStep,
    EagerAdaptationStep,
    make_adaptation_step,
)

pytestmark = pytest.mark.cuda


def adam(params, **kwargs) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=1e-2, capturable=True, **kwargs)


def snapshot(module: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list, list]:
    params = [p.detach().clone() for p in module.parameters()]
    state = [{k: v.clone() for k, v in optimizer.state[p].items()} for p in module.parameters()]
    return params, state


def test_factory_picks_the_graph_on_cuda() -> None:
    module = mlp()
    step = make_adaptation_step(module, adam(module.parameters()), *batches(1)[0], mse)
    assert isinstance(step, CudaGraphAdaptationStep)
    assert isinstance(step.graph, torch.cuda.CUDAGraph)


def test_a_step_built_from_the_six_documented_fields_replays() -> None:
    """The specification's constructor on a graph captured by hand: ``__call__`` copies into
    the static buffers and replays, ``replay`` replays what they hold; the updates are the
    eager twin's."""
    module = mlp()
    optimizer = adam(module.parameters())
    static_inputs, static_targets = (t.clone() for t in batches(1, seed=7)[0])

    def update() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = mse(module(static_inputs), static_targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # creates the optimizer state
            update()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = update()
    torch.cuda.synchronize()
    reference = copy.deepcopy(module)  # the capture ran nothing: the values after the warm-up
    ref_optimizer = adam(reference.parameters())
    ref_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # its own tensors
    eager = EagerAdaptationStep.capture(reference, ref_optimizer, static_inputs, static_targets,
                                        mse)

    step = CudaGraphAdaptationStep(module, optimizer, static_inputs, static_targets, graph,
                                   static_loss)
    assert step.guard is None and step.pool == graph.pool()
    data = batches(4, seed=8)
    for inputs, targets in data[:3]:
        torch.testing.assert_close(step(inputs, targets, synchronize=True),
                                   eager(inputs, targets))
    assert torch.equal(static_inputs, data[2][0])  # __call__ copied into the static buffers
    static_inputs.copy_(data[3][0])
    static_targets.copy_(data[3][1])
    torch.testing.assert_close(step.replay(synchronize=True), eager(*data[3]))
    for p, q in zip(module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    with pytest.raises(CaptureError, match="run_update needs the step's update body"):
        step.run_update()


def test_capture_restores_a_fresh_optimizer_exactly() -> None:
    module = mlp()
    optimizer = adam(module.parameters())
    params, _ = snapshot(module, optimizer)
    CudaGraphAdaptationStep.capture(module, optimizer, *batches(1)[0], mse, warmup_steps=3)
    for p, before in zip(module.parameters(), params, strict=True):
        assert torch.equal(p, before)
    for p in module.parameters():
        state = optimizer.state[p]
        assert state["step"].item() == 0
        assert not state["exp_avg"].any() and not state["exp_avg_sq"].any()


def test_capture_restores_an_optimizer_with_state_exactly() -> None:
    module = mlp()
    optimizer = adam(module.parameters())
    eager = EagerAdaptationStep.capture(module, optimizer, *batches(1)[0], mse)
    for inputs, targets in batches(2, seed=5):
        eager(inputs, targets)
    params, state = snapshot(module, optimizer)
    CudaGraphAdaptationStep.capture(module, optimizer, *batches(1)[0], mse, warmup_steps=3)
    for p, before, state_before in zip(module.parameters(), params, state, strict=True):
        assert torch.equal(p, before)
        assert optimizer.state[p]["step"].item() == 2
        for key, value in state_before.items():
            assert torch.equal(optimizer.state[p][key], value), key


OPTIMIZERS = ["Adam", "AdamW", "RMSprop", "NAdam", "RAdam", "Adamax", "Adadelta", "ASGD", "Rprop"]


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_replays_equal_eager_updates(kind: str) -> None:
    graph_module, eager_module = mlp(), mlp()
    make = getattr(torch.optim, kind)
    graph_opt = make(graph_module.parameters(), lr=1e-2, capturable=True)
    eager_opt = make(eager_module.parameters(), lr=1e-2, capturable=True)
    data = batches(20)
    graph_step = CudaGraphAdaptationStep.capture(
        graph_module, graph_opt, *data[0], mse,
        gradient_transform=clip_grad_norm(graph_module.parameters(), 1.0))
    eager_step = EagerAdaptationStep.capture(
        eager_module, eager_opt, *data[0], mse,
        gradient_transform=clip_grad_norm(eager_module.parameters(), 1.0))
    for inputs, targets in data:
        torch.testing.assert_close(graph_step(inputs, targets), eager_step(inputs, targets))
    for p, q in zip(graph_module.parameters(), eager_module.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert not all(torch.equal(p, q) for p, q in zip(graph_module.parameters(), mlp().parameters(),
                                                      strict=True))


class NoisyHead(nn.Module):
    """A module that draws noise in forward, as a SAC actor does."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out + torch.randn_like(out)


def test_noise_is_fresh_on_every_replay_and_matches_eager_draws() -> None:
    graph_module, eager_module = NoisyHead(), NoisyHead()
    data = batches(1)[0]
    graph_step = CudaGraphAdaptationStep.capture(
        graph_module, adam(graph_module.parameters(), ), *data, mse)
    eager_step = EagerAdaptationStep.capture(eager_module, adam(eager_module.parameters()),
                                             *data, mse)
    torch.manual_seed(123)
    graph_losses = [graph_step(*data) for _ in range(5)]
    torch.manual_seed(123)
    eager_losses = [eager_step(*data) for _ in range(5)]
    assert len({round(loss.item(), 6) for loss in graph_losses}) == 5
    torch.testing.assert_close(torch.stack(graph_losses), torch.stack(eager_losses))


def test_dropout_masks_differ_between_replays() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 256), nn.Dropout(0.5), nn.Linear(256, 2)).to(DEVICE)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.0, capturable=True)  # lr 0: same net
    step = CudaGraphAdaptationStep.capture(module, optimizer, *batches(1)[0], mse)
    losses = {round(step(*batches(1)[0]).item(), 6) for _ in range(5)}
    assert len(losses) == 5


def test_returned_loss_is_a_clone() -> None:
    module = mlp()
    step = CudaGraphAdaptationStep.capture(module, adam(module.parameters()), *batches(1)[0], mse)
    first_batch, second_batch = batches(2, seed=9)
    first = step(*first_batch, synchronize=True)
    kept = first.item()
    step(*second_batch, synchronize=True)
    assert first.item() == kept
    assert first.data_ptr() != step.static_loss.data_ptr()
    assert not first.requires_grad


def test_optimizer_over_a_subset_changes_only_that_subset() -> None:
    module = mlp()
    first_before = [p.detach().clone() for p in module[0].parameters()]
    last_before = [p.detach().clone() for p in module[2].parameters()]
    step = CudaGraphAdaptationStep.capture(module, adam(module[2].parameters()), *batches(1)[0],
                                           mse)
    for inputs, targets in batches(5):
        step(inputs, targets)
    torch.cuda.synchronize()
    for p, before in zip(module[0].parameters(), first_before, strict=True):
        assert torch.equal(p, before) and p.grad is None
    for p, before in zip(module[2].parameters(), last_before, strict=True):
        assert not torch.equal(p, before)


class Pair:
    """A critic Q(obs, act) and an actor obs -> act, wired as the two steps of an agent."""

    def __init__(self, graphs: bool) -> None:
        torch.manual_seed(0)
        self.critic = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 1)).to(DEVICE)
        self.actor = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2), nn.Tanh()).to(
            DEVICE)
        kind = CudaGraphAdaptationStep if graphs else EagerAdaptationStep
        obs, act, q = batches(1)[0][0], torch.zeros(32, 2, device=DEVICE), torch.zeros(
            32, 1, device=DEVICE)
        self.critic_step = kind.capture(
            self.critic, adam(self.critic.parameters()), torch.cat([obs, act], 1), q, mse,
            gradient_transform=clip_grad_norm(self.critic.parameters(), 10.0))
        self.actor_step = kind.capture(
            self.actor, adam(self.actor.parameters()), obs, obs, self.actor_loss,
            gradient_transform=clip_grad_norm(self.actor.parameters(), 10.0),
            pool=getattr(self.critic_step, "pool", None))

    def actor_loss(self, action: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        return -self.critic(torch.cat([obs, action], 1)).mean()


def test_critic_and_actor_sharing_a_pool_stay_correct() -> None:
    graphs, eager = Pair(graphs=True), Pair(graphs=False)
    g = torch.Generator(device=DEVICE).manual_seed(3)
    for _ in range(20):
        obs = torch.randn(32, 4, device=DEVICE, generator=g)
        act = torch.rand(32, 2, device=DEVICE, generator=g) * 2 - 1
        q = torch.randn(32, 1, device=DEVICE, generator=g)
        for pair in (graphs, eager):
            pair.critic_step(torch.cat([obs, act], 1), q)
        critic_grads = [p.grad.clone() for p in graphs.critic.parameters()]
        for pair in (graphs, eager):
            pair.actor_step(obs, obs)
        torch.cuda.synchronize()
        for p, grad in zip(graphs.critic.parameters(), critic_grads, strict=True):
            assert torch.equal(p.grad, grad)  # the actor step wrote no gradient into the critic
    for name in ("critic", "actor"):
        for p, q in zip(getattr(graphs, name).parameters(), getattr(eager, name).parameters(),
                        strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_ten_thousand_replays_do_not_grow_memory() -> None:
    module = mlp()
    step = CudaGraphAdaptationStep.capture(module, adam(module.parameters()), *batches(1)[0], mse)
    data = batches(1)[0]
    for _ in range(10):
        loss = step(*data)
    gc.collect()  # earlier tests' steps must not be freed inside the measured window
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(10_000):
        loss = step(*data)
    torch.cuda.synchronize()
    assert torch.isfinite(loss)
    assert torch.cuda.memory_allocated() <= before


def test_reallocated_parameter_is_detected() -> None:
    module = mlp()
    step = CudaGraphAdaptationStep.capture(module, adam(module.parameters()), *batches(1)[0], mse)
    module[0].weight.data = module[0].weight.data.clone()
    with pytest.raises(RuntimeError, match="parameter or buffer of Sequential was re-allocated"):
        step(*batches(1)[0])


def test_reallocated_optimizer_state_is_detected() -> None:
    module = mlp()
    optimizer = adam(module.parameters())
    step = CudaGraphAdaptationStep.capture(module, optimizer, *batches(1)[0], mse)
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    with pytest.raises(RuntimeError, match="optimizer's state tensors were re-allocated"):
        step(*batches(1)[0])


def test_host_sync_in_the_step_names_the_cause_and_leaves_cuda_usable() -> None:
    class Syncing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.body(x)
            return out * 2 if out.mean().item() > 0 else out  # a host sync

    module = Syncing()
    before = [p.detach().clone() for p in module.parameters()]
    message = (r"could not capture the update of Syncing \(at tests/test_graphstep_cuda.py:\d+\)"
               r": .*remove \.item\(\)")
    with pytest.raises(CaptureError, match=message):
        CudaGraphAdaptationStep.capture(module, adam(module.parameters()), *batches(1)[0], mse)
    # nothing consumed: the warm-up's updates are undone and random draws work again
    for p, b in zip(module.parameters(), before, strict=True):
        assert torch.equal(p, b)
    assert torch.randn(3, device=DEVICE).isfinite().all()
    eager = EagerAdaptationStep.capture(module, adam(module.parameters()), *batches(1)[0], mse)
    assert torch.isfinite(eager(*batches(1)[0], synchronize=True))


def test_uncapturable_optimizer_is_refused() -> None:
    module = mlp()
    with pytest.raises(CaptureError, match="SGD cannot be captured"):
        CudaGraphAdaptationStep.capture(module, torch.optim.SGD(module.parameters(), lr=0.1),
                                        *batches(1)[0], mse)
    with pytest.raises(CaptureError, match="capturable=False"):
        CudaGraphAdaptationStep.capture(module, torch.optim.Adam(module.parameters()),
                                        *batches(1)[0], mse)


def test_cpu_parameter_is_refused() -> None:
    module = mlp()
    module[2].to("cpu")
    with pytest.raises(ValueError, match=r"Sequential 2.weight is on cpu, expected cuda:0"):
        CudaGraphAdaptationStep.capture(module, adam(module.parameters()), *batches(1)[0], mse)


def test_call_checks_shape_and_device() -> None:
    module = mlp()
    step = CudaGraphAdaptationStep.capture(module, adam(module.parameters()), *batches(1)[0], mse)
    inputs, targets = batches(1)[0]
    with pytest.raises(ValueError, match=r"inputs has shape \(31, 4\), expected \(32, 4\)"):
        step(inputs[:31], targets)
    with pytest.raises(ValueError, match="targets is on cpu, expected cuda:0"):
        step(inputs, targets.cpu())


def test_step_keeps_alive_what_its_graph_writes() -> None:
    module = mlp()
    # the clip transform (and its recorded norm) is referenced by nothing but the step
    step = CudaGraphAdaptationStep.capture(
        module, adam(module.parameters()), *batches(1)[0], mse,
        gradient_transform=clip_grad_norm(module.parameters(), 1.0))
    gc.collect()
    bystanders = [torch.full((n,), 7.0, device=DEVICE) for n in (1, 2, 4, 64, 256, 4096)]
    for _ in range(3):
        step(*batches(1)[0])
    torch.cuda.synchronize()
    assert all(bool((b == 7.0).all()) for b in bystanders)


def test_a_hundred_thousand_replays_grow_neither_gpu_nor_host_memory() -> None:
    import resource

    module = mlp()
    step = CudaGraphAdaptationStep.capture(module, adam(module.parameters()), *batches(1)[0], mse,
                                           skip_nonfinite=True)
    data = batches(1)[0]
    for _ in range(1000):
        loss = step(*data)
    gc.collect()
    torch.cuda.synchronize()
    gpu_before = torch.cuda.memory_allocated()
    host_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    for _ in range(100_000):
        loss = step(*data)
    torch.cuda.synchronize()
    gpu_after = torch.cuda.memory_allocated()
    host_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"100k replays: GPU allocated {gpu_before} -> {gpu_after} bytes, "
          f"host max RSS {host_before} -> {host_after} KiB")
    assert torch.isfinite(loss)
    assert gpu_after <= gpu_before
    assert host_after - host_before < 16 * 1024  # KiB: no per-replay growth (it would be GBs)


def test_compiled_graph_noise_is_fresh_on_every_replay() -> None:
    module = NoisyHead().to(DEVICE)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3, capturable=True)
    inputs, targets = torch.randn(32, 4, device=DEVICE), torch.randn(32, 2, device=DEVICE)
    step = CudaGraphAdaptationStep.capture(
        module, optimizer, inputs, targets, lambda p, t: ((p - t) ** 2).mean(), compile=True)
    assert step._body.uncompiled_parts == []
    losses = [step(inputs, targets).item() for _ in range(5)]
    assert len({round(loss, 6) for loss in losses}) == 5
