"""SeedStack: K seeds' networks as one batched module, built as each seed alone builds it,
each seed's outputs and gradients its own, and one line for a module vmap cannot batch."""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
from netfixtures import ACT_SPACE, OBS_SPACE, RESIDUAL_ACTOR, build
from torch import Tensor, nn

from rl_graphstep.algorithms import OFF_POLICY_ALGORITHMS as ALGORITHMS
from rl_graphstep.algorithms.targets import PolyakAverage
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.envs.vector import seed_everything
from rl_graphstep.networks.builtin import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    DeterministicActor,
    EnsembleCritic,
    SquashedGaussianActor,
)
from rl_graphstep.networks.seeds import SeedStack, check_batchable, stack_networks, stack_pairs
from rl_graphstep.run.flags import load_config
from rl_graphstep.run.netspec import make_networks

K, B, OBS, A = 3, 6, 5, 3  # seeds, batch, observation and action sizes
CPU = torch.device("cpu")
LAYERNORM_CRITIC = "examples.layernorm_critic:LayerNormCritic"


def members(cls: type, n: int = K, **kwargs: object) -> list[nn.Module]:
    out = []
    for seed in range(n):
        torch.manual_seed(100 + seed)
        out.append(cls(OBS_SPACE, ACT_SPACE, hidden_sizes=(16, 16), **kwargs))
    return out


def observations(n: int = K, seed: int = 7) -> Tensor:
    return torch.randn(n, B, OBS, generator=torch.Generator().manual_seed(seed))


def actions(n: int = K, seed: int = 8) -> Tensor:
    return torch.rand(n, B, A, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def same_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[key], sb[key]) for key in sa)


# --------------------------------------------------------------------------------------------
# What it holds
# --------------------------------------------------------------------------------------------


def test_parameters_and_buffers_are_stacked_under_the_members_names() -> None:
    nets = members(SquashedGaussianActor)
    stack = SeedStack(nets)
    names = [name for name, _ in nets[0].named_parameters()]
    assert [name for name, _ in stack.named_parameters()] == [f"stacked.{n}" for n in names]
    for name, parameter in stack.stacked.named_parameters():
        assert isinstance(parameter, nn.Parameter) and parameter.requires_grad
        for k, net in enumerate(nets):
            assert torch.equal(parameter[k], net.get_parameter(name))
    # An optimizer over the stack holds every seed's parameters, one tensor per name.
    optimizer = torch.optim.Adam(stack.parameters())
    assert sum(p.numel() for p in optimizer.param_groups[0]["params"]) == K * sum(
        p.numel() for p in nets[0].parameters())
    assert set(stack.state_dict()) == {f"stacked.{key}" for key in nets[0].state_dict()}


def test_the_stack_is_a_copy_and_its_state_dict_round_trips() -> None:
    nets = members(DeterministicActor)
    stack = SeedStack(nets)
    with torch.no_grad():
        nets[0].net[0].weight.add_(1.0)
    assert not torch.equal(stack.stacked.net[0].weight[0], nets[0].net[0].weight)
    other = SeedStack(members(DeterministicActor))
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    other.load_state_dict(stack.state_dict())
    assert same_state(other, stack)


def test_the_stack_mirrors_what_the_code_reads_from_a_network() -> None:
    actor = SeedStack(members(SquashedGaussianActor))
    critic = SeedStack(members(EnsembleCritic, num_critics=2))
    assert (actor.num_seeds, actor.observation_size, actor.action_size) == (K, OBS, A)
    assert critic.num_critics == 2 and not hasattr(actor, "num_critics")
    assert callable(actor.sample) and callable(actor.deterministic_action)
    # SAC's exploration_noise_size reads the signature for a noise argument.
    assert "noise" in inspect.signature(actor.sample).parameters
    assert "observations" in inspect.signature(actor.deterministic_action).parameters
    # A method the member lacks, the stack lacks: netcheck's and SAC's getattr tests hold.
    assert getattr(critic, "sample", None) is None
    assert not hasattr(critic, "deterministic_action")
    with pytest.raises(AttributeError):
        _ = actor.no_such_method


def test_modules_of_other_classes_or_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="of one class"):
        SeedStack([*members(DeterministicActor, 1), *members(SquashedGaussianActor, 1)])
    wide = DeterministicActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(8,))
    with pytest.raises(ValueError, match="same parameters"):
        SeedStack([*members(DeterministicActor, 1), wide])
    with pytest.raises(ValueError, match="at least one"):
        SeedStack([])


# --------------------------------------------------------------------------------------------
# One seed out of the stack, one seed into it
# --------------------------------------------------------------------------------------------


def test_member_is_a_standalone_copy_of_that_seed() -> None:
    nets = members(SquashedGaussianActor)
    stack = SeedStack(nets)
    for k, net in enumerate(nets):
        member = stack.member(k)
        assert type(member) is SquashedGaussianActor and same_state(member, net)
        assert all(p.requires_grad for p in member.parameters())
    member = stack.member(-1)
    assert same_state(member, nets[-1])
    with torch.no_grad():
        member.mean.weight.add_(1.0)
    assert torch.equal(stack.stacked.mean.weight[-1], nets[-1].mean.weight)
    with pytest.raises(IndexError):
        stack.member(K)


def test_tied_parameters_stay_tied() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x: Tensor) -> Tensor:
            return self.b(self.a(x))

    stack = SeedStack([Tied(), Tied()])
    assert stack.stacked.a.weight is stack.stacked.b.weight
    member = stack.member(1)
    assert member.a.weight is member.b.weight
    x = torch.randn(2, 3, 4)
    expected = torch.stack([stack.member(k)(x[k]) for k in range(2)])
    torch.testing.assert_close(stack(x), expected)


def test_load_member_state_dict_sets_only_that_seed() -> None:
    nets = members(EnsembleCritic, num_critics=2)
    stack = SeedStack(nets)
    single = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(16, 16))
    stack.load_member_state_dict(1, single.state_dict())
    assert same_state(stack.member(1), single)
    assert same_state(stack.member(0), nets[0]) and same_state(stack.member(2), nets[2])
    with pytest.raises(RuntimeError, match="Missing key"):
        stack.load_member_state_dict(0, {})
    wrong = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(8, 16))
    with pytest.raises(RuntimeError, match="size mismatch"):
        stack.load_member_state_dict(0, wrong.state_dict())
    assert same_state(stack.member(0), nets[0])


# --------------------------------------------------------------------------------------------
# Each seed's outputs are its member's
# --------------------------------------------------------------------------------------------


def per_member(nets: list[nn.Module], method: str, *inputs: Tensor, **kwargs: Tensor) -> object:
    """``method`` of each member on its own slice of the inputs, stacked like the stack's."""
    outs = [getattr(net, method)(*(x[k] for x in inputs),
                                 **{key: v[k] for key, v in kwargs.items()})
            for k, net in enumerate(nets)]
    if isinstance(outs[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*outs, strict=True))
    return torch.stack(outs)


def test_ensemble_critic_outputs_match_each_members_forward() -> None:
    nets = members(EnsembleCritic, num_critics=2)
    stack = SeedStack(nets)
    obs, act = observations(), actions()
    q = stack(obs, act)
    assert q.shape == (K, B, 2)
    torch.testing.assert_close(q, per_member(nets, "__call__", obs, act))


@pytest.mark.parametrize("spec", [RESIDUAL_ACTOR, LAYERNORM_CRITIC])
def test_the_example_networks_batch(spec: str) -> None:
    nets = []
    for seed in range(K):
        torch.manual_seed(seed)
        nets.append(build(spec))
    stack = SeedStack(nets)
    inputs = (observations(),) if "actor" in spec else (observations(), actions())
    if "actor" in spec:  # forward draws noise: compare the noise-free paths
        torch.testing.assert_close(stack.deterministic_action(*inputs),
                                   per_member(nets, "deterministic_action", *inputs))
    else:
        torch.testing.assert_close(stack(*inputs), per_member(nets, "__call__", *inputs))


def test_layer_norm_networks_outputs_match_each_members() -> None:
    """--layer-norm's networks under vmap: the critic's per-member affine parameters and the
    actors' nn.LayerNorms, (K, ...) each, give each seed its own network's outputs."""
    critics = members(EnsembleCritic, num_critics=2, layer_norm=True)
    with torch.no_grad():  # each seed's LayerNorm parameters its own
        for critic in critics:
            for weight in critic.norm_weights:
                weight.uniform_(0.5, 1.5)
    stack = SeedStack(critics)
    assert tuple(stack.stacked.norm_weights[0].shape) == (K, 2, 16)
    obs, act = observations(), actions()
    torch.testing.assert_close(stack(obs, act), per_member(critics, "__call__", obs, act))
    actors = members(SquashedGaussianActor, layer_norm=True)
    torch.testing.assert_close(SeedStack(actors).mean_and_log_std(obs),
                               per_member(actors, "mean_and_log_std", obs))
    deterministic = members(DeterministicActor, layer_norm=True)
    torch.testing.assert_close(SeedStack(deterministic)(obs),
                               per_member(deterministic, "__call__", obs))


def test_deterministic_actor_outputs_match_each_members_forward() -> None:
    nets = members(DeterministicActor)
    stack = SeedStack(nets)
    obs = observations()
    torch.testing.assert_close(stack(obs), per_member(nets, "__call__", obs))
    torch.testing.assert_close(stack.deterministic_action(obs),
                               per_member(nets, "deterministic_action", obs))


def test_squashed_gaussian_methods_match_each_members() -> None:
    nets = members(SquashedGaussianActor)
    stack = SeedStack(nets)
    obs, noise = observations(), torch.randn(K, B, A)
    torch.testing.assert_close(stack.sample(obs, noise=noise),
                               per_member(nets, "sample", obs, noise=noise))
    torch.testing.assert_close(stack.call("sample", obs, noise),
                               per_member(nets, "sample", obs, noise))
    torch.testing.assert_close(stack.deterministic_action(obs),
                               per_member(nets, "deterministic_action", obs))
    torch.testing.assert_close(stack.mean_and_log_std(obs),
                               per_member(nets, "mean_and_log_std", obs))


def test_forward_draws_each_seeds_noise_and_its_log_probability() -> None:
    nets = members(SquashedGaussianActor)
    stack = SeedStack(nets)
    obs = observations()
    torch.manual_seed(3)
    acted, log_probs = stack(obs)
    assert acted.shape == (K, B, A) and log_probs.shape == (K, B)
    # vmap's "different" randomness draws the (K, B, A) noise in one call.
    torch.manual_seed(3)
    noise = torch.randn(K, B, A)
    torch.testing.assert_close(acted, per_member(nets, "sample", obs, noise=noise))
    with torch.no_grad():
        _, log_std = per_member(nets, "mean_and_log_std", obs)
    gaussian = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    expected = (gaussian - torch.log(1 - acted.pow(2) + 1e-6)).sum(-1)
    torch.testing.assert_close(log_probs, expected)
    assert LOG_STD_MIN <= float(log_std.min()) <= float(log_std.max()) <= LOG_STD_MAX


def test_seeds_with_one_network_and_one_input_draw_different_noise() -> None:
    net = members(SquashedGaussianActor, 1)[0]
    stack = SeedStack([net] * K)
    sampled = stack(observations(1).expand(K, B, OBS))[0]
    for k in range(1, K):
        assert not torch.equal(sampled[0], sampled[k])


def test_tensor_keywords_are_split_and_other_values_shared() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(OBS, A)

        def forward(self, x: Tensor, scale: float = 1.0, offset: Tensor | None = None) -> Tensor:
            y = self.linear(x) * scale
            return y if offset is None else y + offset

    nets = [Scaled() for _ in range(K)]
    stack = SeedStack(nets)
    obs, offset = observations(), torch.randn(K, B, A)
    torch.testing.assert_close(stack(obs, 2.0, offset=offset), torch.stack(
        [net(obs[k], 2.0, offset=offset[k]) for k, net in enumerate(nets)]))
    torch.testing.assert_close(stack(obs, scale=3.0, offset=None), torch.stack(
        [net(obs[k], 3.0) for k, net in enumerate(nets)]))


def test_batchnorm_keeps_each_seeds_running_statistics() -> None:
    def bn_net(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(OBS, 4), nn.BatchNorm1d(4))

    nets = [bn_net(k) for k in range(K)]
    stack = SeedStack([copy.deepcopy(n) for n in nets])
    obs = observations()
    torch.testing.assert_close(stack(obs), per_member(nets, "__call__", obs))
    for k, net in enumerate(nets):
        member = stack.member(k).state_dict()
        for key, value in net.state_dict().items():
            torch.testing.assert_close(member[key], value)
    assert int(stack.stacked[1].num_batches_tracked[0]) == 1


# --------------------------------------------------------------------------------------------
# Gradients: each seed's own, nothing of one seed reaches another
# --------------------------------------------------------------------------------------------


def critic_gradients(stack: SeedStack, obs: Tensor, act: Tensor) -> dict[str, Tensor]:
    stack.zero_grad()
    q = stack(obs, act)
    (q.pow(2).mean(dim=(1, 2)) * torch.arange(1.0, K + 1)).sum().backward()
    return {name: p.grad.clone() for name, p in stack.named_parameters()}


def test_a_loss_summed_over_seeds_gives_each_seed_its_own_gradient() -> None:
    nets = members(EnsembleCritic, num_critics=2)
    stack = SeedStack(nets)
    obs, act = observations(), actions()
    grads = critic_gradients(stack, obs, act)
    for k, net in enumerate(nets):
        net.zero_grad()
        ((k + 1) * net(obs[k], act[k]).pow(2).mean()).backward()
        for name, p in net.named_parameters():
            torch.testing.assert_close(grads[f"stacked.{name}"][k], p.grad)


def test_changing_one_seeds_inputs_leaves_the_other_seeds_bit_for_bit() -> None:
    stack = SeedStack(members(EnsembleCritic, num_critics=2))
    obs, act = observations(), actions()
    before = critic_gradients(stack, obs, act)
    obs[0] += 1.0
    act[0] = -act[0]
    after = critic_gradients(stack, obs, act)
    for name, grad in before.items():
        assert not torch.equal(grad[0], after[name][0])
        assert torch.equal(grad[1:], after[name][1:]), name


def test_actor_steps_of_seeds_stay_apart_bit_for_bit() -> None:
    """One Adam step on the summed SAC-shaped actor loss: perturb seed 0's observations and
    every other seed's parameters after the step are identical to the bit."""

    def step(obs: Tensor) -> list[Tensor]:
        torch.manual_seed(0)
        actor = SeedStack(members(SquashedGaussianActor))
        critic = SeedStack(members(EnsembleCritic, num_critics=2))
        optimizer = torch.optim.Adam(actor.parameters(), lr=1e-2)
        torch.manual_seed(1)
        acted, log_pi = actor(obs)
        detached = {name: t.detach() for name, t in critic.named_parameters()}
        min_q = torch.func.functional_call(critic, detached, (obs, acted)).min(dim=-1).values
        (0.2 * log_pi - min_q).mean(dim=1).sum().backward()
        assert all(p.grad is None for p in critic.parameters())
        optimizer.step()
        return [p.detach().clone() for p in actor.parameters()]

    obs = observations()
    before = step(obs)
    obs[0] *= -1
    after = step(obs)
    # Adam's first step is about lr * sign(gradient): seed 0 moves in some tensors, not all.
    assert not all(torch.equal(b[0], a[0]) for b, a in zip(before, after, strict=True))
    assert all(torch.equal(b[1:], a[1:]) for b, a in zip(before, after, strict=True))


def test_a_deep_copied_stack_is_a_target_network_polyak_averages() -> None:
    stack = SeedStack(members(EnsembleCritic, num_critics=2))
    target = copy.deepcopy(stack).requires_grad_(False)
    with torch.no_grad():
        for p in stack.parameters():
            p.add_(1.0)
    PolyakAverage([(target, stack)], tau=0.5)()
    obs, act = observations(), actions()
    for k in range(K):
        torch.testing.assert_close(target.stacked.weights[0][k],
                                   stack.stacked.weights[0][k] - 0.5)
    assert target(obs, act).shape == (K, B, 2)


# --------------------------------------------------------------------------------------------
# Built as each seed alone builds it
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer_norm", [[], ["--layer-norm"]], ids=["plain", "layer-norm"])
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_each_seed_is_the_network_a_single_run_of_that_seed_builds(
        algo: str, layer_norm: list[str]) -> None:
    cfg = load_config(["--env", "Pendulum-v1", "--algo", algo, "--hidden-sizes", "16", "16",
                       *layer_norm])
    algorithm = ALGORITHMS[algo]

    def build_pair(seed: int) -> tuple[nn.Module, nn.Module]:
        return make_networks(algorithm, cfg, OBS_SPACE, ACT_SPACE, CPU)

    seeds = [3, 1, 7]
    actors, critics = stack_pairs(build_pair, seeds, observation_size=OBS, action_size=A)
    for k, seed in enumerate(seeds):
        seed_everything(seed)  # a single run: seed, then the actor, then the critic
        actor, critic = make_networks(algorithm, cfg, OBS_SPACE, ACT_SPACE, CPU)
        assert same_state(actors.member(k), actor) and same_state(critics.member(k), critic)
    assert not same_state(actors.member(0), actors.member(1))


def test_stack_networks_seeds_each_build() -> None:
    stack = stack_networks(lambda seed: DeterministicActor(OBS_SPACE, ACT_SPACE, (8,)), [5, 6])
    for k, seed in enumerate([5, 6]):
        torch.manual_seed(seed)
        assert same_state(stack.member(k), DeterministicActor(OBS_SPACE, ACT_SPACE, (8,)))
    with pytest.raises(ConfigError, match="at least one seed"):
        stack_networks(lambda seed: DeterministicActor(OBS_SPACE, ACT_SPACE, (8,)), [])


# --------------------------------------------------------------------------------------------
# A module vmap cannot batch: one line at build time
# --------------------------------------------------------------------------------------------


class _Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(OBS, A)


class ItemActor(_Base):
    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.linear(x))
        return y * y.abs().max().item()


class BranchingActor(_Base):
    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.linear(x))
        if y.sum() > 0:
            return y
        return -y


class MaskingActor(_Base):
    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.linear(x))
        return y * (y[y > 0].sum())


class DistributionActor(_Base):
    def forward(self, x: Tensor) -> Tensor:
        mean = self.linear(x)
        return torch.tanh(torch.distributions.Normal(mean, torch.ones_like(mean)).rsample())


class GoodForwardBadSample(_Base):
    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.linear(x))

    def sample(self, x: Tensor, noise: Tensor | None = None) -> Tensor:
        return self.forward(x) + float(x.sum())


@pytest.mark.parametrize(("cls", "cause"), [
    (ItemActor, "calling .item()"),
    (BranchingActor, "data-dependent control flow"),
    (MaskingActor, "boolean mask"),
    (DistributionActor, "randomness"),
    (GoodForwardBadSample, "in sample: vmap"),
])
def test_a_module_that_cannot_be_batched_is_one_line(cls: type, cause: str) -> None:
    stack = SeedStack([cls() for _ in range(K)])
    with pytest.raises(ConfigError) as info:
        check_batchable(stack, "actor", (observations(),))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"actor {cls.__name__} cannot be batched over seeds (")
    assert message.endswith("); train with --num-seeds 1")
    assert cause in message


def test_stack_pairs_checks_both_roles() -> None:
    def build_pair(seed: int) -> tuple[nn.Module, nn.Module]:
        return DeterministicActor(OBS_SPACE, ACT_SPACE, (8,)), BranchingCritic()

    class BranchingCritic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(OBS + A, 2)

        def forward(self, obs: Tensor, act: Tensor) -> Tensor:
            q = self.linear(torch.cat([obs, act], -1))
            return q if bool(q.mean() > 0) else q * 2

    with pytest.raises(ConfigError, match="^critic BranchingCritic cannot be batched"):
        stack_pairs(build_pair, [1, 2], observation_size=OBS, action_size=A)


def test_the_check_leaves_buffers_and_random_streams_as_they_were() -> None:
    nets = [nn.Sequential(nn.Linear(OBS, 4), nn.BatchNorm1d(4)) for _ in range(K)]
    stack = SeedStack(nets)
    actor = SeedStack(members(SquashedGaussianActor))
    before = copy.deepcopy(stack.state_dict())
    state = torch.get_rng_state()
    check_batchable(stack, "actor", (observations(),))
    check_batchable(actor, "actor", (observations(),))
    assert torch.equal(torch.get_rng_state(), state)
    after = stack.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)
