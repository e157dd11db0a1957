"""Batch renormalisation (networks/batchrenorm.py): hand-computed outputs and running
statistics during and after the warm-up, the clip limits, torch's BatchNorm1d during the
warm-up, inference mode, each ensemble member's and each stacked seed's own statistics, a
finite gradient through a constant feature, and the state saved and restored exactly."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from rl_graphstep.networks.batchrenorm import (
    BatchRenorm,
    BatchRenormSettings,
    InTrainingMode,
    renorm_blocks,
    training_mode,
)
from rl_graphstep.networks.seeds import SeedStack

EPS = 1e-3
# Two rows, two features: batch mean (2, 4), biased batch variance (1, 4).
X = torch.tensor([[1.0, 2.0], [3.0, 6.0]], dtype=torch.float64)


def layer(warmup: int, width: int = 2, groups: tuple[int, ...] = ()) -> BatchRenorm:
    return BatchRenorm(width, groups, BatchRenormSettings(warmup=warmup)).double()


def test_warm_up_is_batch_norm_with_hand_values() -> None:
    brn = layer(warmup=10)
    y = brn(X)
    expected = torch.tensor([[-1 / math.sqrt(1.001), -2 / math.sqrt(4.001)],
                             [1 / math.sqrt(1.001), 2 / math.sqrt(4.001)]], dtype=torch.float64)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    # The running statistics move 1% of the way to the batch's (biased) ones.
    torch.testing.assert_close(brn.running_mean, torch.tensor([0.02, 0.04], dtype=torch.float64))
    torch.testing.assert_close(brn.running_var, torch.tensor([1.0, 1.03], dtype=torch.float64))
    assert brn.steps.item() == 1 and brn.steps.dtype == torch.int64


def test_after_the_warm_up_r_and_d_correct_the_batch_statistics() -> None:
    brn = layer(warmup=0)  # renormalising from the first call: running mean 0, variance 1
    y = brn(X)
    mean, var = torch.tensor([2.0, 4.0], dtype=torch.float64), torch.tensor([1.0, 4.0],
                                                                            dtype=torch.float64)
    running_std = math.sqrt(1 + EPS)
    r = torch.sqrt(var + EPS) / running_std  # (1, 1.9993): inside [1/3, 3]
    d = mean / running_std  # (1.999, 3.998): inside [-5, 5]
    renorm_mean = mean - d * var.sqrt() / r
    renorm_var = var / r**2
    torch.testing.assert_close(y, (X - renorm_mean) / torch.sqrt(renorm_var + EPS),
                               rtol=1e-12, atol=1e-12)
    # Up to eps, that is Ioffe's x_hat * r + d.
    x_hat = (X - mean) / var.sqrt()
    torch.testing.assert_close(y, x_hat * r + d, rtol=2e-3, atol=2e-3)
    # The running statistics move towards the batch's, whatever the warm-up.
    torch.testing.assert_close(brn.running_mean, 0.01 * mean)


def test_r_and_d_are_clipped_to_r_max_and_d_max() -> None:
    brn = layer(warmup=0)
    with torch.no_grad():
        brn.running_var.fill_(1e-4)  # sigma = sqrt(0.0011): r and d far beyond the limits
    y = brn(X)
    mean = torch.tensor([2.0, 4.0], dtype=torch.float64)
    var = torch.tensor([1.0, 4.0], dtype=torch.float64)
    r, d = 3.0, 5.0
    expected = (X - (mean - d * var.sqrt() / r)) / torch.sqrt(var / r**2 + EPS)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_the_warm_up_ends_after_warmup_training_calls() -> None:
    brn, plain = layer(warmup=2), layer(warmup=10**6)
    outputs = [(brn(X + k), plain(X + k)) for k in range(3)]
    assert torch.equal(outputs[0][0], outputs[0][1]) and torch.equal(outputs[1][0], outputs[1][1])
    assert not torch.allclose(outputs[2][0], outputs[2][1])  # the third call renormalises
    assert brn.steps.item() == 3


def test_warm_up_matches_torch_batch_norm() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 5) * 3 + 1
    brn = BatchRenorm(5)
    bn = nn.BatchNorm1d(5, eps=EPS, momentum=0.01)
    with torch.no_grad():
        brn.weight.uniform_(0.5, 2)
        brn.bias.uniform_(-1, 1)
        bn.weight.copy_(brn.weight)
        bn.bias.copy_(brn.bias)
    torch.testing.assert_close(brn(x), bn(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(brn.running_mean, bn.running_mean)
    # BatchNorm1d moves its running variance towards the unbiased one, the original (Flax)
    # towards the biased one.
    biased = x.var(dim=0, unbiased=False)
    torch.testing.assert_close(brn.running_var, 0.99 + 0.01 * biased)
    torch.testing.assert_close(bn.running_var, 0.99 + 0.01 * biased * 64 / 63)


def test_inference_mode_uses_the_running_statistics_and_moves_nothing() -> None:
    brn = layer(warmup=0)
    with torch.no_grad():
        brn.running_mean.copy_(torch.tensor([1.0, -1.0]))
        brn.running_var.copy_(torch.tensor([4.0, 0.25]))
        brn.weight.copy_(torch.tensor([2.0, 1.0]))
        brn.bias.copy_(torch.tensor([0.5, 0.0]))
    brn.eval()
    y = brn(X)
    expected = torch.stack([(X[:, 0] - 1) / math.sqrt(4 + EPS) * 2 + 0.5,
                            (X[:, 1] + 1) / math.sqrt(0.25 + EPS)], dim=1)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    assert brn.steps.item() == 0
    assert brn.running_mean.tolist() == [1.0, -1.0]


def test_each_ensemble_member_keeps_its_own_statistics() -> None:
    torch.manual_seed(1)
    x = torch.randn(3, 16, 4, dtype=torch.float64) * torch.tensor([1.0, 2.0, 5.0],
                                                                  dtype=torch.float64).view(3, 1, 1)
    ensemble = layer(warmup=1, width=4, groups=(3,))
    members = [layer(warmup=1, width=4) for _ in range(3)]
    for _ in range(3):  # the warm-up call, then two renormalised ones
        y = ensemble(x)
        for e, member in enumerate(members):
            torch.testing.assert_close(y[e], member(x[e]), rtol=1e-12, atol=1e-12)
    assert ensemble.running_mean.shape == (3, 4)
    for e, member in enumerate(members):
        torch.testing.assert_close(ensemble.running_var[e], member.running_var)


def test_stacked_seeds_each_update_their_own_statistics() -> None:
    torch.manual_seed(2)
    seeds = [renorm_blocks([3, 8], BatchRenormSettings(warmup=1)) for _ in range(2)]
    alone = [copy.deepcopy(m) for m in seeds]  # each run alone on its seed's batch
    stack = SeedStack(seeds)
    x = torch.randn(2, 32, 3)
    x[1] = x[1] * 4 + 2
    for _ in range(2):
        out = stack(x)
        for k in range(2):
            torch.testing.assert_close(out[k], alone[k](x[k]))
    state = stack.state_dict()
    for k in range(2):
        for name, value in alone[k].state_dict().items():
            torch.testing.assert_close(state[f"stacked.{name}"][k], value)
    assert state["stacked.0.steps"].tolist() == [2, 2]
    assert not torch.allclose(state["stacked.0.running_mean"][0],
                              state["stacked.0.running_mean"][1])


def test_a_constant_feature_keeps_the_gradient_finite() -> None:
    brn = BatchRenorm(2, settings=BatchRenormSettings(warmup=1))
    for _ in range(2):  # in the warm-up and after it
        x = torch.tensor([[1.0, 0.0], [3.0, 0.0]], requires_grad=True)  # feature 1: constant
        brn(x).pow(2).sum().backward()
        assert torch.isfinite(x.grad).all() and torch.isfinite(brn.weight.grad).all()


def test_the_state_saves_and_restores_exactly() -> None:
    brn = layer(warmup=1)
    for k in range(3):
        brn(X * (k + 1))
    again = layer(warmup=1)
    again.load_state_dict(brn.state_dict())
    assert set(brn.state_dict()) == {"weight", "bias", "running_mean", "running_var", "steps"}
    assert again.steps.item() == 3
    assert torch.equal(again(X), brn(X))
    assert torch.equal(again.running_var, brn.running_var)


def test_training_mode_switches_and_restores_a_network() -> None:
    net = renorm_blocks([2, 4], BatchRenormSettings()).eval()
    with training_mode(net, True):
        assert all(m.training for m in net.modules())
    assert not any(m.training for m in net.modules())
    wrapped = InTrainingMode(net)
    wrapped(torch.randn(8, 2))
    assert net[0].steps.item() == 1 and not net[0].training
    assert next(n for n, _ in wrapped.named_buffers()) == "module.0.running_mean"


@pytest.mark.parametrize("width", [1, 7])
def test_extra_repr_names_the_settings(width: int) -> None:
    assert f"({width},), momentum=0.01, warmup=100000, r_max=3.0, d_max=5.0" in repr(
        BatchRenorm(width))
