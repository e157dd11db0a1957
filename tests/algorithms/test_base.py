"""What the algorithms share (algorithms/base.py), with a distributional critic
(--critic-atoms): SAC's, TD3's and DDPG's target distributions and critic losses against hand
computations, and actor losses that read the critic's expected values where a scalar critic's
Q values are read."""

from __future__ import annotations

import math

import pytest
import torch
from fakes import CPU, ROWS, FixedActor, FixedDeterministicActor
from torch import Tensor, nn

from rl_graphstep.algorithms.base import OffPolicyAlgorithm
from rl_graphstep.algorithms.ddpg import DDPG
from rl_graphstep.algorithms.distributional import CategoricalSupport
from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.algorithms.td3 import TD3
from rl_graphstep.data.rows import RowLayout
from rl_graphstep.settings.config import Config

TARGETS = RowLayout.split_targets(ROWS[:, 3:])
# Five atoms on [-4, 4]: z = -4, -2, 0, 2, 4.
C51 = {"critic_atoms": 5, "v_min": -4.0, "v_max": 4.0}
SETTINGS = {"alpha": 0.5, "gamma": 0.9, "batch_size": 2, "policy_noise": 0.0}


class PeakCritic(nn.Module):
    """Member e's logits put the whole mass (but e^-50) on atom ``peaks[e]``, whatever the
    input: a target critic whose distributions are known."""

    def __init__(self, peaks: list[int], atoms: int = 5) -> None:
        super().__init__()
        self.num_critics = len(peaks)
        self.scale = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("peaks", torch.tensor(peaks, dtype=torch.float32))
        self.register_buffer("index", torch.arange(atoms, dtype=torch.float32))

    def forward(self, obs: Tensor, act: Tensor) -> Tensor:
        logits = -50.0 * self.scale * (self.index - self.peaks[:, None]) ** 2  # (E, A)
        return logits.expand(*obs.shape[:-1], *logits.shape)


class SlopeCritic(nn.Module):
    """Logits ``0.3 c_e (o.sum + a.sum) (j - 2)``, c = (1, 2, ...): each member's expected
    value rises with the action, as a Q value the actor can climb."""

    def __init__(self, members: int = 2, atoms: int = 5) -> None:
        super().__init__()
        self.num_critics = members
        self.c = nn.Parameter(torch.arange(1.0, members + 1.0))
        self.register_buffer("centred", torch.arange(atoms, dtype=torch.float32) - 2)

    def forward(self, obs: Tensor, act: Tensor) -> Tensor:
        x = obs.sum(-1, keepdim=True) + act.sum(-1, keepdim=True)  # (B, 1)
        return 0.3 * (x * self.c).unsqueeze(-1) * self.centred  # (B, E, A)


class ExpectedValues(nn.Module):
    """A scalar critic: the expected values of a distributional one."""

    def __init__(self, critic: nn.Module, support: CategoricalSupport) -> None:
        super().__init__()
        self.critic, self.support = critic, support

    def forward(self, obs: Tensor, act: Tensor) -> Tensor:
        return self.support.expected(self.critic(obs, act))


def made(kind: type[OffPolicyAlgorithm], critic: nn.Module, **settings: object
         ) -> OffPolicyAlgorithm:
    actor = FixedActor() if kind is SAC else FixedDeterministicActor()
    return kind(actor, critic, Config(**{**SETTINGS, **settings}), action_size=1, device=CPU)


def split(position: float, atoms: int = 5) -> list[float]:
    """The projection of a point mass at ``position`` (in atoms): its l/u split."""
    m = [0.0] * atoms
    lower = math.floor(position)
    m[lower] += 1 - (position - lower)
    if position > lower:
        m[lower + 1] += position - lower
    return m


@pytest.mark.parametrize(("kind", "peaks", "row0"), [
    # SAC, members at z = 2 and z = -2: the lower, -2, whatever its place. Row 0: r = 1,
    # d = 0.9, log pi(a'|s') = 0.1 * 0.5 * (0.2 - 0.4) = -0.01 folded into the reward:
    # r' = 1 - 0.9 * 0.5 * -0.01 = 1.0045; 1.0045 + 0.9 * -2 = -0.7955, at atom 1.60225.
    (SAC, [3, 1], split(1.60225)),
    # TD3 (no smoothing noise), the same members: 1 - 1.8 = -0.8, at atom 1.6.
    (TD3, [3, 1], split(1.6)),
    # DDPG's one member at z = 2: 1 + 1.8 = 2.8, at atom 3.4.
    (DDPG, [3], split(3.4)),
])
def test_the_target_distribution_of_each_algorithm(kind: type[OffPolicyAlgorithm],
                                                   peaks: list[int], row0: list[float]
                                                   ) -> None:
    algorithm = made(kind, PeakCritic(peaks), **C51)
    target = algorithm.target_distribution(TARGETS)
    assert target.shape == (2, 5) and not target.requires_grad
    assert target[0].tolist() == pytest.approx(row0, abs=1e-5)
    # Row 1 is terminal (not_done 0): the reward -2 alone, on atom 1.
    assert target[1].tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0, 0.0], abs=1e-6)


@pytest.mark.parametrize(("kind", "peaks"), [(SAC, [3, 1]), (TD3, [3, 1]), (DDPG, [3])])
def test_the_critic_loss_is_each_members_cross_entropy_summed(kind: type[OffPolicyAlgorithm],
                                                              peaks: list[int]) -> None:
    algorithm = made(kind, PeakCritic(peaks), **C51)
    members = len(peaks)
    logits = torch.linspace(-1.0, 1.0, 2 * members * 5).view(2, members, 5)
    loss, metrics = algorithm.critic_loss(logits, TARGETS)
    target = algorithm.target_distribution(TARGETS).tolist()
    expected = 0.0
    for e in range(members):
        for b in range(2):
            row = logits[b, e].tolist()
            log_total = math.log(sum(math.exp(v) for v in row))
            expected -= sum(m * (v - log_total) for m, v in zip(target[b], row, strict=True)) / 2
    assert loss.shape == () and loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics == {}


@pytest.mark.parametrize("kind", [SAC, TD3, DDPG])
def test_the_actor_loss_reads_expected_values(kind: type[OffPolicyAlgorithm]) -> None:
    """The same loss and actor gradient as the scalar algorithm whose critic returns the
    distributional critic's expected values (the minimum for SAC, the first for TD3/DDPG)."""
    members = kind.num_critics
    distributional = made(kind, SlopeCritic(members), **C51)
    assert distributional.support is not None
    scalar = made(kind, ExpectedValues(SlopeCritic(members), distributional.support))
    assert scalar.support is None
    obs = ROWS[:, :2]
    losses, gradients = [], []
    for algorithm in (distributional, scalar):
        loss, _ = algorithm.actor_loss(algorithm.actor(obs), obs)
        (gradient,) = torch.autograd.grad(loss, [algorithm.actor.w])
        losses.append(loss)
        gradients.append(gradient)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(gradients[0], gradients[1], rtol=1e-6, atol=1e-7)
    assert gradients[0] != 0
    # The frozen critic's values are expected values, (B, E).
    q = distributional.frozen_critic(obs, torch.zeros(2, 1))
    assert q.shape == (2, members)


def test_a_scalar_critics_algorithm_has_no_support() -> None:
    assert made(SAC, PeakCritic([3, 1])).support is None
    support = made(SAC, PeakCritic([3, 1]), **C51).support
    assert support is not None and support.z.tolist() == [-4.0, -2.0, 0.0, 2.0, 4.0]


def test_with_seeds_the_distributional_losses_are_per_seed() -> None:
    """Two seeds stacked: the critic loss is (2,), entry k what seed k computes alone (the
    peak critic reads no actions, so the fixed actor's shapes do not matter)."""
    cfg = Config(**SETTINGS, **C51)
    group = TD3(FixedDeterministicActor(), PeakCritic([3, 1]), cfg, action_size=1,
                device=CPU, seeds=2)
    other = ROWS.flip(0) * torch.tensor([0.5, -1.0, 0.3, 2.0, 1.0, -0.7, 0.9])
    rows = torch.stack([ROWS, other])
    logits = torch.linspace(-1.0, 1.0, 40).view(2, 2, 2, 5)
    loss, _ = group.critic_loss(logits, RowLayout.split_targets(rows[..., 3:]))
    assert loss.shape == (2,)
    for k in range(2):
        alone = made(TD3, PeakCritic([3, 1]), **C51)
        seed_loss, _ = alone.critic_loss(logits[k], RowLayout.split_targets(rows[k, :, 3:]))
        assert torch.equal(seed_loss, loss[k])
