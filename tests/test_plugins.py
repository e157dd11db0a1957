"""Tests for custom networks: loading by name and by file, building, the one-line checks, and
naming the user's line in a host-sync error."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rl_graphstep.errors import ConfigError
from rl_graphstep.networks import (
    Critic,
    DeterministicActor,
    EnsembleCritic,
    SACActor,
    SquashedGaussianActor,
)
from rl_graphstep.plugins import (
    build_network,
    check_actor,
    check_critic,
    describe_host_sync,
    load_class,
)

ROOT = Path(__file__).resolve().parents[1]
# `examples` is a folder of the repository, not of the installed package: make it importable
# however pytest was started (`python -m pytest` adds the current directory, `pytest` does not).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
ACT_SPACE = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
CPU = torch.device("cpu")
SIZES = {"observation_size": 5, "action_size": 3, "device": CPU}
RESIDUAL_ACTOR = "examples.residual_actor:ResidualActor"
LAYERNORM_CRITIC_FILE = ROOT / "examples" / "layernorm_critic.py"

# A module of small networks, each wrong in one way; `write_module` puts it in a tmp file.
BAD_NETWORKS = """
import torch
from torch import nn


class Base(nn.Module):
    def __init__(self, observation_space, action_space, scale=1.0):
        super().__init__()
        self.linear = nn.Linear(observation_space.shape[0], action_space.shape[0])
        self.scale = scale

    def action(self, obs):
        return torch.tanh(self.linear(obs)) * self.scale


class WrongShape(Base):
    def forward(self, obs):
        return self.action(obs)[:, :1], torch.zeros(obs.shape[0])


class NoTuple(Base):
    def forward(self, obs):
        return self.action(obs)


class TupleOfThree(Base):
    def forward(self, obs):
        a = self.action(obs)
        return a, a.sum(-1), a


class OutOfRange(Base):
    def forward(self, obs):
        return self.linear(obs) * 100 + 50, torch.zeros(obs.shape[0])


class NaNs(Base):
    def forward(self, obs):
        a = self.action(obs)
        return a, torch.full((obs.shape[0],), float("nan"))


class Float64(Base):
    def forward(self, obs):
        return self.action(obs).double(), torch.zeros(obs.shape[0])


class KeepDimLogProb(Base):
    def forward(self, obs):
        a = self.action(obs)
        return a, torch.zeros(obs.shape[0], 1)


class Crashes(Base):
    def forward(self, obs):
        return self.linear(obs[:, :2])  # CRASH-LINE


class FakeSync(Base):
    def forward(self, obs):
        raise RuntimeError("called a synchronizing CUDA operation")  # SYNC-LINE


class DeterministicTuple(Base):
    def forward(self, obs):
        return self.action(obs), torch.zeros(obs.shape[0])


class DeterministicWide(Base):
    def forward(self, obs):
        return torch.cat([self.action(obs), self.action(obs)], dim=1)


class DrawsNoise(Base):
    def forward(self, obs):
        a = torch.tanh(self.linear(obs) + torch.randn(obs.shape[0], 3))
        return a, torch.randn(obs.shape[0])


class OneQ(nn.Module):
    def __init__(self, observation_space, action_space):
        super().__init__()
        self.q = nn.Linear(observation_space.shape[0] + action_space.shape[0], 1)

    def forward(self, obs, act):
        return self.q(torch.cat([obs, act], -1))


class FlatQ(OneQ):
    def forward(self, obs, act):
        return super().forward(obs, act)[:, 0]


class InfQ(OneQ):
    def forward(self, obs, act):
        q = super().forward(obs, act)
        return torch.cat([q, q + float("inf")], dim=1)


class LiesAboutMembers(OneQ):
    num_critics = 3

    def forward(self, obs, act):
        q = super().forward(obs, act)
        return torch.cat([q, q], dim=1)


class NoSpaces(nn.Module):
    def __init__(self, width):
        super().__init__()


def not_a_class():
    return None


class NotAModule:
    pass
"""


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad_networks.py"
    path.write_text(textwrap.dedent(BAD_NETWORKS))
    return path


def build(spec: str, **kwargs: object) -> nn.Module:
    return build_network(spec, OBS_SPACE, ACT_SPACE, kwargs, role="actor")


def line_of(path: Path, marker: str) -> int:
    """1-based number of the line of `path` holding `marker`."""
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if marker in line)


# --------------------------------------------------------------------------------------------
# load_class
# --------------------------------------------------------------------------------------------


def test_load_by_module_path() -> None:
    cls = load_class(RESIDUAL_ACTOR)
    assert cls.__name__ == "ResidualActor"
    assert cls.__module__ == "examples.residual_actor"


def test_load_by_absolute_and_relative_file_path(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = load_class(f"{LAYERNORM_CRITIC_FILE}:LayerNormCritic")
    assert cls.__name__ == "LayerNormCritic" and issubclass(cls, nn.Module)
    monkeypatch.chdir(ROOT)
    again = load_class("examples/layernorm_critic.py:LayerNormCritic")
    assert again.__name__ == "LayerNormCritic"
    # Each load of a file gets its own module name, so the two never share a sys.modules entry.
    assert again.__module__ != cls.__module__
    # Loaded from its absolute path, so a later chdir cannot break tracebacks into it.
    assert sys.modules[again.__module__].__file__ == str(LAYERNORM_CRITIC_FILE)


def test_spec_without_colon_names_both_forms() -> None:
    with pytest.raises(ConfigError) as info:
        load_class("examples.residual_actor.ResidualActor")
    message = str(info.value)
    assert "'package.module:ClassName' or 'path/to/file.py:ClassName'" in message
    assert "\n" not in message


def test_module_not_importable_names_it_and_the_import_error() -> None:
    with pytest.raises(ConfigError, match=r"cannot import module 'examples\.no_such_thing' for "
                                          r"'examples\.no_such_thing:X': No module named "
                                          r"'examples\.no_such_thing'$"):
        load_class("examples.no_such_thing:X")
    with pytest.raises(ConfigError, match=r"No module named 'nowhere_pkg'; run from the folder"):
        load_class("nowhere_pkg.actor:X")


def test_file_that_fails_to_import_names_the_import_error(tmp_path: Path) -> None:
    path = tmp_path / "needs_missing.py"
    path.write_text("import not_installed_anywhere_xyz\n")
    with pytest.raises(ConfigError, match=r"cannot import .*needs_missing\.py.*No module named "
                                          r"'not_installed_anywhere_xyz'"):
        load_class(f"{path}:X")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"file '.*nope\.py' for '.*nope\.py:X' does not exist"):
        load_class(f"{tmp_path / 'nope.py'}:X")


def test_missing_class_lists_up_to_five_defined(bad_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_class(f"{bad_file}:Missing")
    message = str(info.value)
    assert re.search(r"bad_networks\.py has no class 'Missing'; it defines the classes "
                     r"Base, WrongShape, NoTuple, TupleOfThree, OutOfRange, \.\.\.$", message)
    # Imported names (nn, torch) are not classes the module defines.
    assert "Module" not in message


def test_missing_class_in_a_module_without_classes(tmp_path: Path) -> None:
    path = tmp_path / "empty.py"
    path.write_text("from torch import nn\n")
    with pytest.raises(ConfigError, match=r"has no class 'Actor'; it defines no classes$"):
        load_class(f"{path}:Actor")


def test_not_a_class_and_not_a_module(bad_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"bad_networks\.py:not_a_class is a function, "
                                          r"not a class$"):
        load_class(f"{bad_file}:not_a_class")
    with pytest.raises(ConfigError, match=r"bad_networks\.py:NotAModule is not a "
                                          r"torch\.nn\.Module subclass$"):
        load_class(f"{bad_file}:NotAModule")


# --------------------------------------------------------------------------------------------
# build_network
# --------------------------------------------------------------------------------------------


def test_build_from_spec_class_and_module_with_kwargs() -> None:
    actor = build(RESIDUAL_ACTOR, width=32, blocks=3)
    assert type(actor).__name__ == "ResidualActor"
    assert actor.stem.out_features == 32 and len(actor.blocks) == 3

    critic_cls = load_class(f"{LAYERNORM_CRITIC_FILE}:LayerNormCritic")
    critic = build_network(critic_cls, OBS_SPACE, ACT_SPACE, {"num_critics": 3},
                           role="critic")
    assert critic.num_critics == 3

    built = EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,))
    assert build_network(built, OBS_SPACE, ACT_SPACE, None, role="critic") is built
    assert build_network(built, OBS_SPACE, ACT_SPACE, {}, role="critic") is built


def test_built_module_with_kwargs_is_refused() -> None:
    built = DeterministicActor(OBS_SPACE, ACT_SPACE, (16,))
    with pytest.raises(ConfigError, match=r"^actor: actor_kwargs \['width'\] were given, but "
                                          r"the actor is an already built DeterministicActor"):
        build_network(built, OBS_SPACE, ACT_SPACE, {"width": 3}, role="actor")


def test_constructor_type_error_names_class_and_signature(bad_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        build(RESIDUAL_ACTOR, depth=3)
    message = str(info.value)
    assert message.startswith("actor: cannot build ResidualActor: its constructor must take "
                              "(observation_space, action_space, **kwargs)")
    assert "(given actor_kwargs ['depth']); TypeError: " in message
    assert "unexpected keyword argument 'depth'" in message
    with pytest.raises(ConfigError, match=r"cannot build NoSpaces: .*TypeError: .*argument"):
        build(f"{bad_file}:NoSpaces")


def test_load_errors_carry_the_role() -> None:
    with pytest.raises(ConfigError, match=r"^critic: network spec 'nocolon' must be"):
        build_network("nocolon", OBS_SPACE, ACT_SPACE, None, role="critic")


def test_wrong_kinds_of_objects_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^actor: int is not a torch\.nn\.Module subclass"):
        build_network(int, OBS_SPACE, ACT_SPACE, None, role="actor")
    with pytest.raises(ConfigError, match=r"^critic must be a .* got float$"):
        build_network(1.5, OBS_SPACE, ACT_SPACE, None, role="critic")  # type: ignore[arg-type]


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
        f"MyActor.forward {what} at tests/test_plugins.py:{line} (`{source}`), which cannot run "
        "inside a CUDA graph: keep tensors on the device (torch.where instead of if) or use "
        "--graph off"
    )


def test_describe_host_sync_skips_library_frames() -> None:
    # layer_norm raises inside torch/nn/functional.py; the line named is ours, not torch's.
    error = raised_by(ErrorInsideTorch())
    message = describe_host_sync(error, "Net", method="deterministic_action")
    assert message.startswith("Net.deterministic_action calls ")
    assert f"test_plugins.py:{line_of(THIS_FILE, 'TORCH-LINE')}" in message
    assert "functional.py" not in message and "module.py" not in message


def test_describe_host_sync_without_a_user_frame() -> None:
    message = describe_host_sync(RuntimeError("called a synchronizing CUDA operation"), "Net")
    assert message == ("Net.forward calls a synchronizing CUDA operation, which cannot run "
                       "inside a CUDA graph: keep tensors on the device (torch.where instead "
                       "of if) or use --graph off")


# --------------------------------------------------------------------------------------------
# On a GPU: the real sync debug mode catches the host sync
# --------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_item_in_forward_is_caught_on_cuda(bad_file: Path) -> None:
    device = torch.device("cuda")
    path = bad_file.with_name("syncing_actor.py")
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn


        class SyncingActor(nn.Module):
            def __init__(self, observation_space, action_space):
                super().__init__()
                self.linear = nn.Linear(observation_space.shape[0], action_space.shape[0])

            def forward(self, obs):
                a = torch.tanh(self.linear(obs))
                if a.max().item() > 2.0:  # HOST-SYNC
                    a = a * 0.5
                return a
    """))
    actor = build(f"{path}:SyncingActor").to(device)
    previous = torch.cuda.get_sync_debug_mode()
    with pytest.raises(ConfigError) as info:
        check_actor(actor, kind="deterministic", observation_size=5, action_size=3,
                    device=device)
    assert torch.cuda.get_sync_debug_mode() == previous
    message = str(info.value)
    assert message.startswith("SyncingActor.forward calls .item() at ")
    assert f"syncing_actor.py:{line_of(path, 'HOST-SYNC')} " in message
    check_actor(DeterministicActor(OBS_SPACE, ACT_SPACE, (8,)).to(device), kind="deterministic",
                observation_size=5, action_size=3, device=device)


def test_a_module_spec_is_found_from_the_current_folder_without_it_on_the_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As under the rl-graphstep-train console script, which does not put the current
    folder on sys.path the way python -m does."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(ROOT))])
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)
    cls = load_class("examples.residual_actor:ResidualActor")
    assert cls.__name__ == "ResidualActor"
    assert sys.path[-1] == str(ROOT)
