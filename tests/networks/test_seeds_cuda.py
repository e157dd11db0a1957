"""On a GPU: a SeedStack's vmapped call has no host sync, captures as a CUDA graph (with each
seed's own noise drawn afresh per replay), compiles, and keeps the seeds apart to the bit."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from rl_graphstep.graphstep import CudaGraphAdaptationStep, EagerAdaptationStep
from rl_graphstep.networks.builtin import EnsembleCritic, SquashedGaussianActor
from rl_graphstep.networks.seeds import SeedStack, check_batchable

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")
K, B, OBS, A = 4, 256, 17, 6  # seeds, batch, observation and action sizes
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
ACT_SPACE = gym.spaces.Box(-1.0, 1.0, (A,), np.float32)


def stack_of(cls: type, **kwargs: object) -> SeedStack:
    nets = []
    for seed in range(K):
        torch.manual_seed(seed)
        nets.append(cls(OBS_SPACE, ACT_SPACE, **kwargs).to(DEVICE))
    return SeedStack(nets)


def adam(params: object) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=1e-3, capturable=True)


def inputs(seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(K, B, OBS, device=DEVICE, generator=g),
            torch.rand(K, B, A, device=DEVICE, generator=g) * 2 - 1)


def per_seed_mse(prediction: Tensor, targets: Tensor) -> Tensor:
    """Each seed's mean squared error, summed over seeds: each seed's gradient its own."""
    return (prediction - targets).pow(2).mean(dim=(1, 2)).sum()


def test_the_vmapped_call_makes_no_host_sync() -> None:
    actor, critic = stack_of(SquashedGaussianActor), stack_of(EnsembleCritic)
    obs, act = inputs()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        acted, log_pi = actor(obs)
        actor.sample(obs, noise=torch.randn_like(act))
        q = critic(obs, acted)
        (log_pi.mean(1) - q.min(-1).values.mean(1)).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def test_outputs_match_each_members_forward_on_cuda() -> None:
    critic = stack_of(EnsembleCritic)
    obs, act = inputs()
    expected = torch.stack([critic.member(k)(obs[k], act[k]) for k in range(K)])
    torch.testing.assert_close(critic(obs, act), expected)


def test_a_critic_step_on_a_stack_captures_and_replays_as_the_eager_twin() -> None:
    stack = stack_of(EnsembleCritic)
    twin = copy.deepcopy(stack)
    packed = StackedStateAction(stack)
    obs, act = inputs()
    targets = torch.randn(K, B, 2, device=DEVICE)
    step = CudaGraphAdaptationStep.capture(packed, adam(stack.parameters()),
                                           torch.cat([obs, act], -1), targets, per_seed_mse)
    eager = EagerAdaptationStep.capture(StackedStateAction(twin), adam(twin.parameters()),
                                        torch.cat([obs, act], -1), targets, per_seed_mse)
    for seed in range(1, 4):
        obs, act = inputs(seed)
        torch.testing.assert_close(step(torch.cat([obs, act], -1), targets, synchronize=True),
                                   eager(torch.cat([obs, act], -1), targets))
    for p, q in zip(stack.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_replayed_steps_keep_the_seeds_apart_bit_for_bit() -> None:
    def train(perturb: bool) -> list[Tensor]:
        stack = stack_of(EnsembleCritic)
        obs, act = inputs()
        targets = torch.randn(K, B, 2, device=DEVICE, generator=torch.Generator(
            device=DEVICE).manual_seed(9))
        step = CudaGraphAdaptationStep.capture(StackedStateAction(stack),
                                               adam(stack.parameters()),
                                               torch.cat([obs, act], -1), targets, per_seed_mse)
        for seed in range(1, 6):
            obs, act = inputs(seed)
            if perturb:
                obs[0] += 1.0
            step(torch.cat([obs, act], -1), targets, synchronize=True)
        return [p.detach().clone() for p in stack.parameters()]

    before, after = train(False), train(True)
    assert not all(torch.equal(b[0], a[0]) for b, a in zip(before, after, strict=True))
    assert all(torch.equal(b[1:], a[1:]) for b, a in zip(before, after, strict=True))


def test_a_captured_actor_draws_fresh_noise_per_seed_and_replay() -> None:
    actor = stack_of(SquashedGaussianActor)
    obs = inputs()[0]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        actor(obs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        acted, _ = actor(obs[:1].expand(K, B, OBS).contiguous())
    graph.replay()
    first = acted.clone()
    graph.replay()
    assert not torch.equal(first, acted)
    assert not torch.equal(first[0], first[1])


def test_torch_compile_of_a_stacks_forward_and_backward() -> None:
    stack = stack_of(EnsembleCritic)
    obs, act = inputs()

    def loss_and_backward(o: Tensor, a: Tensor) -> Tensor:
        loss = stack(o, a).pow(2).mean(dim=(1, 2)).sum()
        loss.backward()
        return loss.detach()

    expected = loss_and_backward(obs, act)
    grads = [p.grad.clone() for p in stack.parameters()]
    stack.zero_grad()
    torch.testing.assert_close(torch.compile(loss_and_backward)(obs, act), expected)
    for p, g in zip(stack.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_the_check_leaves_the_cuda_random_stream_as_it_was() -> None:
    actor = stack_of(SquashedGaussianActor)
    state = torch.cuda.get_rng_state()
    check_batchable(actor, "actor", (inputs()[0],))
    assert torch.equal(torch.cuda.get_rng_state(), state)


class StackedStateAction(nn.Module):
    """A stacked critic fed one packed ``[observation | action]`` (K, B, row) tensor, as the
    critic step feeds it."""

    def __init__(self, critic: SeedStack) -> None:
        super().__init__()
        self.critic = critic

    def forward(self, packed: Tensor) -> Tensor:
        return self.critic(packed[..., :OBS], packed[..., OBS:])
