"""Checks of a built actor or critic on an example batch: the examples and defaults pass, each
way of being wrong is one line naming the class, and a host sync names the user's line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from netfixtures import (
    ACT_SPACE,
    LAYERNORM_CRITIC_FILE,
    OBS_SPACE,
    RESIDUAL_ACTOR,
    ROOT,
    SIZES,
    build,
    line_of,
    write_bad_networks,
)
from torch import nn

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.core.netcheck import check_actor, check_critic, describe_host_sync
from rl_graphstep.networks.builtin import (
    Critic,
    DeterministicActor,
    EnsembleCritic,
    SACActor,
    SquashedGaussianActor,
)
from rl_graphstep.networks.custom import build_network, load_class


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    return write_bad_networks(tmp_path)


# --------------------------------------------------------------------------------------------
# check_actor / check_critic: the examples and the defaults pass
# --------------------------------------------------------------------------------------------


def test_examples_pass_the_checks_and_have_the_right_shapes() -> None:
    actor = build(RESIDUAL_ACTOR, width=64, blocks=2)
    check_actor(actor, kind="stochastic", **SIZES)
    obs = torch.randn(17, 5) * 50
    actions, log_probs = actor(obs)
    assert actions.shape == (17, 3) and log_probs.shape == (17,)
    assert actions.abs().max() <= 1 and torch.isfinite(log_probs).all()
    deterministic = actor.deterministic_action(obs)
    assert deterministic.shape == (17, 3) and deterministic.abs().max() <= 1
    assert isinstance(actor, SACActor)

    critic = build_network(f"{LAYERNORM_CRITIC_FILE}:LayerNormCritic", OBS_SPACE, ACT_SPACE,
                           {"hidden_sizes": [32, 32], "dropout": 0.01}, role="critic")
    check_critic(critic, min_members=2, **SIZES)
    assert critic(obs, torch.rand(17, 3)).shape == (17, 2)
    assert critic.observation_size == 5
    assert isinstance(critic, Critic)
    assert sum(isinstance(m, nn.LayerNorm) for m in critic.modules()) == 2 * 2


def test_defaults_pass_the_checks() -> None:
    check_actor(SquashedGaussianActor(OBS_SPACE, ACT_SPACE, (16,)), kind="stochastic", **SIZES)
    check_actor(DeterministicActor(OBS_SPACE, ACT_SPACE, (16,)), kind="deterministic", **SIZES)
    check_critic(EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,)), min_members=2, **SIZES)
    check_critic(EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,), num_critics=1), min_members=1,
                 **SIZES)


def test_residual_actor_log_prob_matches_torch_distributions() -> None:
    actor = build(RESIDUAL_ACTOR, width=32, blocks=2)
    obs = torch.randn(10, 5)
    torch.manual_seed(3)
    actions, log_probs = actor(obs)
    mean, log_std = actor.mean_and_log_std(obs)
    torch.manual_seed(3)
    pre_tanh = mean + log_std.exp() * torch.randn(10, 3)
    torch.testing.assert_close(actions, torch.tanh(pre_tanh))
    normal = torch.distributions.Normal(mean, log_std.exp()).log_prob(pre_tanh)
    want = (normal - torch.log(1 - torch.tanh(pre_tanh) ** 2)).sum(-1)
    torch.testing.assert_close(log_probs, want, rtol=1e-4, atol=1e-4)
    assert ((log_std >= -5) & (log_std <= 2)).all()


def test_residual_actor_gradients_reach_every_parameter() -> None:
    actor = build(RESIDUAL_ACTOR, width=16, blocks=2)
    actions, log_probs = actor(torch.randn(8, 5))
    (actions.sum() + log_probs.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())


def test_layernorm_critic_members_are_independent() -> None:
    critic = build_network(small_layernorm_critic(), OBS_SPACE, ACT_SPACE, None, role="critic")
    obs, act = torch.randn(6, 5), torch.rand(6, 3)
    q = critic(obs, act)
    torch.testing.assert_close(q[:, 1], critic.members[1](torch.cat([obs, act], 1))[:, 0])
    assert not torch.equal(q[:, 0], q[:, 1])


def small_layernorm_critic() -> nn.Module:
    cls = load_class(f"{LAYERNORM_CRITIC_FILE}:LayerNormCritic")
    return cls(OBS_SPACE, ACT_SPACE, hidden_sizes=(16,), num_critics=2)


def test_checks_consume_no_random_numbers(bad_file: Path) -> None:
    actor = build(f"{bad_file}:DrawsNoise")
    critic = EnsembleCritic(OBS_SPACE, ACT_SPACE, (8,))
    torch.manual_seed(0)
    want = torch.rand(4)
    torch.manual_seed(0)
    check_actor(actor, kind="stochastic", **SIZES)
    check_critic(critic, min_members=2, **SIZES)
    torch.testing.assert_close(torch.rand(4), want)


def test_kind_must_be_known() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        check_actor(DeterministicActor(OBS_SPACE, ACT_SPACE, (8,)), kind="gaussian", **SIZES)


# --------------------------------------------------------------------------------------------
# check_actor / check_critic: each way of being wrong is one line naming the class
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("WrongShape", "stochastic",
         r"WrongShape.forward returned action shape \(256, 1\), expected \(256, 3\)"),
        ("NoTuple", "stochastic",
         r"NoTuple.forward returned a tensor, expected a tuple \(action, log_prob\)"),
        ("TupleOfThree", "stochastic",
         r"TupleOfThree.forward returned a tuple of 3, expected a tuple \(action, log_prob\)"),
        ("OutOfRange", "stochastic",
         r"OutOfRange.forward returned actions in \[-?\d[\d.e+-]*, \d[\d.e+-]*\], expected "
         r"\[-1, 1\] \(squash with tanh\)"),
        ("NaNs", "stochastic",
         r"NaNs.forward returned 256 non-finite log_prob values \(NaN or inf\) of 256 on a "
         r"random batch"),
        ("Float64", "stochastic",
         r"Float64.forward returned action dtype torch.float64, expected torch.float32"),
        ("KeepDimLogProb", "stochastic",
         r"KeepDimLogProb.forward returned log_prob shape \(256, 1\), expected \(256,\) "
         r"\(sum the log-probabilities over the action dimension, no keepdim\)"),
        ("DeterministicTuple", "deterministic",
         r"DeterministicTuple.forward returned a tuple, expected a tensor action \(256, 3\) "
         r"\(a deterministic actor returns only the action\)"),
        ("DeterministicWide", "deterministic",
         r"DeterministicWide.forward returned shape \(256, 6\), expected \(256, 3\)"),
    ],
)
def test_actor_errors(bad_file: Path, name: str, kind: str, message: str) -> None:
    actor = build(f"{bad_file}:{name}")
    with pytest.raises(ConfigError) as info:
        check_actor(actor, kind=kind, **SIZES)
    assert re.fullmatch(message, str(info.value)), str(info.value)


def test_out_of_range_message_gives_the_actual_range(bad_file: Path) -> None:
    actor = build(f"{bad_file}:OutOfRange")
    torch.manual_seed(0)
    with pytest.raises(ConfigError) as info:
        check_actor(actor, kind="stochastic", **SIZES)
    low, high = map(float, re.findall(r"\[(\S+), (\S+)\], expected", str(info.value))[0])
    # The example batch is the first draw after the seed: the check forks the RNG from here.
    torch.manual_seed(0)
    with torch.no_grad():
        actions = actor.linear(torch.randn(256, 5)) * 100 + 50
    assert low == pytest.approx(actions.min().item(), rel=1e-5)
    assert high == pytest.approx(actions.max().item(), rel=1e-5)


@pytest.mark.parametrize(
    ("name", "min_members", "message"),
    [
        ("OneQ", 2, r"OneQ.forward returned shape \(256, 1\), expected \(256, E\) with "
                    r"E >= 2 Q values per row"),
        ("FlatQ", 1, r"FlatQ.forward returned shape \(256,\), expected \(256, E\) with "
                     r"E >= 1 Q values per row"),
        ("InfQ", 2, r"InfQ.forward returned 256 non-finite Q values \(NaN or inf\) of 512 "
                    r"on a random batch"),
        ("LiesAboutMembers", 2, r"LiesAboutMembers.forward returned 2 Q values per row, but its "
                                r"num_critics is 3"),
    ],
)
def test_critic_errors(bad_file: Path, name: str, min_members: int, message: str) -> None:
    critic = build_network(f"{bad_file}:{name}", OBS_SPACE, ACT_SPACE, None, role="critic")
    with pytest.raises(ConfigError) as info:
        check_critic(critic, min_members=min_members, **SIZES)
    assert re.fullmatch(message, str(info.value)), str(info.value)


def test_ddpg_takes_a_single_q_critic(bad_file: Path) -> None:
    critic = build_network(f"{bad_file}:OneQ", OBS_SPACE, ACT_SPACE, None, role="critic")
    check_critic(critic, min_members=1, **SIZES)


class Logits(nn.Module):
    """A custom critic returning ``shape`` (B first) of zeros, with num_critics 2."""

    num_critics = 2

    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.shape = shape
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], *self.shape) * self.scale


def test_a_distributional_critic_returns_logits_per_member_and_atom() -> None:
    check_critic(EnsembleCritic(OBS_SPACE, ACT_SPACE, (8,), atoms=7), min_members=2, atoms=7,
                 **SIZES)
    check_critic(Logits(2, 7), min_members=2, atoms=7, **SIZES)


@pytest.mark.parametrize(("critic", "min_members", "message"), [
    (Logits(2), 2, r"Logits.forward returned shape \(256, 2\), expected \(256, E, 7\) with "
                   r"E >= 2 members of 7 logits each \(--critic-atoms 7: the logits over each "
                   r"member's atoms\)"),
    (Logits(2, 5), 2, r"Logits.forward returned shape \(256, 2, 5\), expected \(256, E, 7\) "
                      r"with .*"),
    (Logits(1, 7), 2, r"Logits.forward returned shape \(256, 1, 7\), expected \(256, E, 7\) "
                      r"with E >= 2 members .*"),
    (Logits(3, 7), 1, r"Logits.forward returned 3 members per row, but its num_critics is 2"),
])
def test_a_critic_that_does_not_fit_the_atoms_is_refused(critic: nn.Module, min_members: int,
                                                         message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_critic(critic, min_members=min_members, atoms=7, **SIZES)
    assert re.fullmatch(message, str(info.value)), str(info.value)


def test_logits_where_q_values_are_expected_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^Logits.forward returned shape \(256, 2, 7\), "
                                          r"expected \(256, E\) with E >= 2 Q values per row$"):
        check_critic(Logits(2, 7), min_members=2, **SIZES)


def test_parameters_on_the_wrong_device() -> None:
    actor = DeterministicActor(OBS_SPACE, ACT_SPACE, (8,))
    with pytest.raises(ConfigError, match=r"^DeterministicActor net\.0\.weight is on cpu, "
                                          r"expected meta \(register"):
        check_actor(actor, kind="deterministic", observation_size=5, action_size=3,
                    device=torch.device("meta"))


def test_a_crashing_forward_names_the_users_line(bad_file: Path) -> None:
    actor = build(f"{bad_file}:Crashes")
    with pytest.raises(ConfigError) as info:
        check_actor(actor, kind="deterministic", **SIZES)
    message = str(info.value)
    assert message.startswith("Crashes.forward raised RuntimeError: mat1 and mat2 shapes")
    assert f"bad_networks.py:{line_of(bad_file, 'CRASH-LINE')} " in message
    assert message.endswith("(on a random batch of shape (256, 5))")
    assert "\n" not in message


def test_a_sync_error_from_forward_becomes_the_graph_message(bad_file: Path) -> None:
    actor = build(f"{bad_file}:FakeSync")
    with pytest.raises(ConfigError) as info:
        check_actor(actor, kind="stochastic", **SIZES)
    message = str(info.value)
    assert message.startswith("FakeSync.forward calls a synchronizing CUDA operation at ")
    assert f"bad_networks.py:{line_of(bad_file, 'SYNC-LINE')} (`raise RuntimeError(" in message
    assert message.endswith("which cannot run inside a CUDA graph: keep tensors on the device "
                            "(torch.where instead of if) or use --graph off")


# --------------------------------------------------------------------------------------------
# describe_host_sync on real tracebacks
# --------------------------------------------------------------------------------------------


class ItemInForward(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.sum(dim=1).item()  # ITEM-LINE: several elements, so .item() raises


class BranchInForward(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x:  # IF-LINE: a multi-element tensor has no truth value
            return x
        return -x


class ErrorInsideTorch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x, (7,))  # TORCH-LINE: the error comes from torch


def raised_by(module: nn.Module) -> BaseException:
    try:
        module(torch.ones(4, 5))  # called through nn.Module.__call__, so torch frames surround it
    except Exception as error:
        return error
    raise AssertionError("expected an error")


THIS_FILE = Path(__file__).resolve()


@pytest.mark.parametrize(
    ("module", "marker", "what"),
    [
        (ItemInForward(), "ITEM-LINE", "calls .item()"),
        (BranchInForward(), "IF-LINE", "calls a Python `if` on a tensor"),
        (ErrorInsideTorch(), "TORCH-LINE", "calls a synchronizing CUDA operation"),
    ],
)
def test_describe_host_sync_names_this_file_and_line(
    module: nn.Module, marker: str, what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # paths below the current directory are shown relative to it
    message = describe_host_sync(raised_by(module), "MyActor")
    line = line_of(THIS_FILE, marker)
    source = THIS_FILE.read_text().splitlines()[line - 1].strip()
    assert message == (
        f"MyActor.forward {what} at tests/core/test_netcheck.py:{line} (`{source}`), which cannot "
        "run inside a CUDA graph: keep tensors on the device (torch.where instead of if) or use "
        "--graph off"
    )


def test_describe_host_sync_skips_library_frames() -> None:
    # layer_norm raises inside torch/nn/functional.py; the line named is ours, not torch's.
    error = raised_by(ErrorInsideTorch())
    message = describe_host_sync(error, "Net", method="deterministic_action")
    assert message.startswith("Net.deterministic_action calls ")
    assert f"test_netcheck.py:{line_of(THIS_FILE, 'TORCH-LINE')}" in message
    assert "functional.py" not in message and "module.py" not in message


def test_describe_host_sync_without_a_user_frame() -> None:
    message = describe_host_sync(RuntimeError("called a synchronizing CUDA operation"), "Net")
    assert message == ("Net.forward calls a synchronizing CUDA operation, which cannot run "
                       "inside a CUDA graph: keep tensors on the device (torch.where instead "
                       "of if) or use --graph off")
