"""The C51 maths against hand computations: the projection of a target distribution onto
the support (FastTD3's hand values, the mass kept, the mean kept where nothing clamps, equal
to C51's l/u split scattered with index_add_), expected values, the per-row choice of the
member with the lower mean, and the cross-entropy; any leading dimensions (K seeds)."""

from __future__ import annotations

import math

import pytest
import torch

from rl_graphstep.algorithms.distributional import CategoricalSupport

CPU = torch.device("cpu")
# A = 5 atoms on [-1, 1]: z = -1, -0.5, 0, 0.5, 1, delta 0.5.
FIVE = CategoricalSupport(5, -1.0, 1.0, CPU)
UNIFORM = torch.full((1, 5), 0.2)


def project(reward: float, discount: float, support: CategoricalSupport = FIVE,
            probabilities: torch.Tensor = UNIFORM) -> torch.Tensor:
    return support.project(probabilities, torch.tensor([[reward]]), torch.tensor([[discount]]))


def reference_projection(support: CategoricalSupport, probabilities: torch.Tensor,
                         rewards: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
    """C51's projection as FastTD3 writes it: l/u of each clamped target atom, the l == u
    fix, two index_add_ on a flat view with row offsets."""
    rows, atoms = probabilities.shape
    targets = (rewards + discounts * support.z).clamp(support.v_min, support.v_max)
    b = (targets - support.v_min) / support.delta
    lower, upper = b.floor().long(), b.ceil().long()
    exact = lower == upper
    lower = torch.where(exact & (lower > 0), lower - 1, lower)
    upper = torch.where((lower == upper) & (upper < atoms - 1), upper + 1, upper)
    offsets = (torch.arange(rows) * atoms).unsqueeze(-1)
    projected = torch.zeros(rows * atoms)
    projected.index_add_(0, (lower + offsets).view(-1),
                         (probabilities * (upper.float() - b)).view(-1))
    projected.index_add_(0, (upper + offsets).view(-1),
                         (probabilities * (b - lower.float())).view(-1))
    return projected.view(rows, atoms)


def test_the_support_is_evenly_spaced_on_the_device() -> None:
    assert FIVE.z.tolist() == [-1.0, -0.5, 0.0, 0.5, 1.0]
    assert FIVE.delta == 0.5 and FIVE.z.device == CPU
    with pytest.raises(ValueError, match="2 or more atoms"):
        CategoricalSupport(1, -1.0, 1.0, CPU)
    with pytest.raises(ValueError, match="v_min < v_max"):
        CategoricalSupport(5, 1.0, 1.0, CPU)


@pytest.mark.parametrize(("reward", "discount", "expected", "mean"), [
    # Tz = -0.25, 0, 0.25, 0.5, 0.75: halves to both neighbours, exact hits whole.
    (0.25, 0.5, [0.0, 0.1, 0.4, 0.4, 0.1], 0.25),
    # Every target atom above v_max: all the mass on the top atom.
    (2.0, 0.5, [0.0, 0.0, 0.0, 0.0, 1.0], 1.0),
    # Terminal (discount 0): all atoms at r = 0.3, b = 2.6, split 0.4 / 0.6.
    (0.3, 0.0, [0.0, 0.0, 0.4, 0.6, 0.0], 0.3),
    # Tz = -1.1 .. 0.9: the first clamped to -1, so the mean is -0.08, not -0.1.
    (-0.1, 1.0, [0.24, 0.2, 0.2, 0.2, 0.16], -0.08),
])
def test_the_hand_projections(reward: float, discount: float, expected: list[float],
                              mean: float) -> None:
    projected = project(reward, discount)
    assert projected.shape == (1, 5)
    assert projected[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert projected.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert (projected * FIVE.z).sum().item() == pytest.approx(mean, abs=1e-6)


def random_case(rows: int, atoms: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    probabilities = torch.softmax(3 * torch.randn(rows, atoms, generator=generator), dim=-1)
    rewards = 4 * torch.randn(rows, 1, generator=generator)
    # Discounts of terminal (0), n-step (0.99^2) and one-step rows, and rewards on atoms.
    discounts = torch.tensor([0.0, 0.9801, 0.99, 1.0, 0.5])[
        torch.randint(0, 5, (rows, 1), generator=generator)]
    rewards[::7] = torch.round(rewards[::7])
    return probabilities, rewards, discounts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_projection_is_c51s_l_u_split_scattered_with_index_add(seed: int) -> None:
    support = CategoricalSupport(21, -10.0, 10.0, CPU)
    probabilities, rewards, discounts = random_case(300, 21, seed)
    projected = support.project(probabilities, rewards, discounts)
    reference = reference_projection(support, probabilities, rewards, discounts)
    torch.testing.assert_close(projected, reference, rtol=0, atol=1e-6)
    assert (projected >= 0).all()
    torch.testing.assert_close(projected.sum(-1), torch.ones(300), rtol=0, atol=1e-5)


def test_the_mean_is_r_plus_d_times_the_mean_where_nothing_clamps() -> None:
    support = CategoricalSupport(51, -100.0, 100.0, CPU)
    generator = torch.Generator().manual_seed(0)
    probabilities = torch.softmax(torch.randn(64, 51, generator=generator), dim=-1)
    # |r| <= 5 and d <= 0.9 keep every target atom within [-95, 95].
    rewards = torch.rand(64, 1, generator=generator) * 10 - 5
    discounts = torch.rand(64, 1, generator=generator) * 0.9
    projected = support.project(probabilities, rewards, discounts)
    before = (probabilities * support.z).sum(-1, keepdim=True)
    torch.testing.assert_close((projected * support.z).sum(-1, keepdim=True),
                               rewards + discounts * before, rtol=0, atol=1e-3)


def test_leading_seed_dimensions_project_row_by_row() -> None:
    """(K, B, A) with (K, B, 1) rewards: each seed's rows as projected alone."""
    support = CategoricalSupport(11, -5.0, 5.0, CPU)
    cases = [random_case(8, 11, seed) for seed in range(3)]
    stacked = [torch.stack(parts) for parts in zip(*cases, strict=True)]
    projected = support.project(*stacked)
    assert projected.shape == (3, 8, 11)
    for k, case in enumerate(cases):
        assert torch.equal(projected[k], support.project(*case))


def test_expected_values_are_softmax_weighted_atoms() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]]))
    # 0.1 * -1 + 0.2 * -0.5 + 0 + 0.2 * 0.5 + 0.2 * 1 = 0.1
    assert FIVE.expected(logits).tolist() == pytest.approx([0.1], abs=1e-6)
    assert FIVE.expected(torch.zeros(2, 3, 4, 5)).shape == (2, 3, 4)


def test_the_lowest_member_is_chosen_per_row() -> None:
    """Row 0: member 1 has the lower mean; row 1: member 0; row 2: a tie takes member 0."""
    low, high = torch.tensor([3.0, 2.0, 1.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 1.0, 2.0, 3.0])
    logits = torch.stack([torch.stack([high, low]), torch.stack([low, high]),
                          torch.stack([high, high.clone()])])  # (B=3, E=2, A=5)
    chosen = FIVE.lowest_member(logits)
    assert chosen.shape == (3, 5)
    torch.testing.assert_close(chosen, torch.softmax(torch.stack([low, low, high]), dim=-1))
    # With a leading seed dimension, seed 1's members swapped: the same distributions win.
    seeds = FIVE.lowest_member(torch.stack([logits, logits.flip(1)]))
    assert torch.equal(seeds[0], chosen) and torch.equal(seeds[1], chosen)


def test_the_cross_entropy_is_minus_target_times_log_softmax_per_member() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 0.0],
                            [math.log(4.0), 0.0, 0.0, 0.0, 0.0]]])  # (B=1, E=2, A=5)
    target = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0]])
    loss = CategoricalSupport.cross_entropy(logits, target)
    assert loss.shape == (1, 2)
    # Uniform: -log(1/5); the second: p = (4/8, 1/8, ...), -(0.5 log 0.5 + 0.5 log 0.125).
    assert loss[0].tolist() == pytest.approx(
        [math.log(5.0), -(0.5 * math.log(0.5) + 0.5 * math.log(0.125))], rel=1e-6)
