"""Tests for the default actor and critic: shapes, ranges, and numbers against hand computation."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.networks.builtin import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    Critic,
    DeterministicActor,
    DeterministicPolicy,
    EnsembleCritic,
    SACActor,
    SquashedGaussianActor,
    StateActionInput,
    hidden_blocks,
    mlp,
)
from rl_graphstep.settings.config import Config

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
ACT_SPACE = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_mlp_layers() -> None:
    net = mlp([4, 8, 6, 2])
    kinds = [type(layer) for layer in net]
    assert kinds == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert [(m.in_features, m.out_features) for m in net if isinstance(m, nn.Linear)] == [
        (4, 8),
        (8, 6),
        (6, 2),
    ]
    assert isinstance(mlp([4, 2], activation=nn.Tanh)[0], nn.Linear)
    assert [type(m) for m in mlp([4, 3, 2], activation=nn.Tanh)][1] is nn.Tanh


def test_actor_output_shapes_and_ranges() -> None:
    actor = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 32))
    # Large inputs push some pre-squash values far out, where tanh rounds to ±1.
    observations = torch.randn(64, 5) * 100
    actions, log_probs = actor(observations)
    assert actions.shape == (64, 3)
    assert log_probs.shape == (64,)
    assert actions.abs().max() <= 1.0
    assert torch.isfinite(log_probs).all()
    deterministic = actor.deterministic_action(observations)
    assert deterministic.shape == (64, 3)
    assert deterministic.abs().max() <= 1.0
    assert isinstance(actor, SACActor)


def test_actor_samples_are_fresh_and_reparameterised() -> None:
    actor = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(16,))
    observations = torch.randn(8, 5)
    first, _ = actor(observations)
    second, _ = actor(observations)
    assert not torch.equal(first, second)
    actions, log_probs = actor(observations)
    (actions.sum() + log_probs.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())


def test_actor_log_prob_matches_hand_computation() -> None:
    actor = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(16, 16))
    observations = torch.randn(10, 5)
    torch.manual_seed(123)
    actions, log_probs = actor(observations)

    # Recompute by hand with the same noise: replay the seed and draw eps the same way.
    layers = [actor.trunk[0], actor.trunk[2]]
    h = observations
    for layer in layers:
        h = torch.relu(h @ layer.weight.T + layer.bias)
    mean = h @ actor.mean.weight.T + actor.mean.bias
    raw = h @ actor.log_std.weight.T + actor.log_std.bias
    log_std = -5 + 0.5 * (2 + 5) * (torch.tanh(raw) + 1)
    std = log_std.exp()
    torch.manual_seed(123)
    eps = torch.randn(10, 3)
    pre_tanh = mean + std * eps
    want_actions = torch.tanh(pre_tanh)
    normal_log_density = (
        -((pre_tanh - mean) ** 2) / (2 * std**2) - log_std - 0.5 * math.log(2 * math.pi)
    )
    want = (normal_log_density - torch.log(1 - want_actions**2 + 1e-6)).sum(dim=1)

    torch.testing.assert_close(actions, want_actions)
    torch.testing.assert_close(log_probs, want, rtol=1e-5, atol=1e-4)
    # And against torch.distributions, which the network itself must not use.
    reference = torch.distributions.Normal(mean, std).log_prob(pre_tanh)
    reference = (reference - torch.log(1 - want_actions**2 + 1e-6)).sum(dim=1)
    torch.testing.assert_close(log_probs, reference, rtol=1e-5, atol=1e-4)


def test_actor_sample_is_forwards_draw_to_the_bit_and_sac_acts_with_it() -> None:
    actor = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(16,))
    observations = torch.randn(64, 5)
    torch.manual_seed(4)
    drawn, _ = actor(observations)
    after_forward = torch.rand(())
    torch.manual_seed(4)
    sampled = actor.sample(observations)
    assert torch.equal(sampled, drawn) and torch.rand(()) == after_forward  # same noise used
    cfg = Config()
    sac = SAC(actor, EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,)), cfg, action_size=3,
              device=torch.device("cpu"))
    calls = []
    actor.sample = lambda obs: calls.append(obs) or drawn  # type: ignore[method-assign]
    assert sac.explore(sac.actor, observations) is drawn and calls == [observations]
    del actor.sample
    torch.manual_seed(4)
    assert torch.equal(sac.explore(sac.actor, observations), drawn)


def test_sample_with_given_noise_is_the_draw_that_noise_makes_and_draws_nothing() -> None:
    actor = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(16,))
    observations = torch.randn(64, 5)
    torch.manual_seed(4)
    drawn, _ = actor(observations)
    torch.manual_seed(4)
    noise = torch.randn(64, 3)  # what forward's randn_like drew
    before = torch.get_rng_state()
    assert torch.equal(actor.sample(observations, noise), drawn)
    assert torch.equal(torch.get_rng_state(), before)  # nothing drawn
    sac = SAC(actor, EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,)), Config(), action_size=3,
              device=torch.device("cpu"))
    assert sac.exploration_noise_size() == 3
    assert torch.equal(sac.explore(sac.actor, observations, noise), drawn)


def test_sac_hands_the_noise_to_a_keyword_only_noise_argument() -> None:
    class KeywordNoiseActor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(1.0))  # SAC's optimizer needs one

        def forward(self, observations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.tanh(observations[:, :3]), observations.sum(1)

        def sample(self, observations: torch.Tensor, *, noise: torch.Tensor) -> torch.Tensor:
            return torch.tanh(observations[:, :3] + noise)

    sac = SAC(KeywordNoiseActor(), EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,)), Config(),
              action_size=3, device=torch.device("cpu"))
    observations, noise = torch.randn(4, 5), torch.randn(4, 3)
    assert sac.exploration_noise_size() == 3
    assert torch.equal(sac.explore(sac.actor, observations, noise),
                       torch.tanh(observations[:, :3] + noise))


class SampleWithoutNoiseActor(nn.Module):
    """A custom actor whose ``sample`` draws its own noise: SAC cannot hand it any."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, observations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(observations[:, :3]), observations.sum(1)

    def sample(self, observations: torch.Tensor) -> torch.Tensor:
        return torch.tanh(observations[:, :3] + torch.randn(len(observations), 3))


@pytest.mark.parametrize("actor", ["SampleWithoutNoiseActor", "ForwardOnlyActor"])
def test_sac_draws_on_the_device_for_actors_that_take_no_noise(actor: str) -> None:
    sac = SAC(globals()[actor](), EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,)), Config(),
              action_size=3, device=torch.device("cpu"))
    assert sac.exploration_noise_size() == 0


class ForwardOnlyActor(nn.Module):
    """A custom stochastic actor with no ``sample``: SAC acts with its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, observations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(self.scale * observations[:, :3]), observations.sum(1)


def test_sac_acts_with_forward_when_the_actor_has_no_sample() -> None:
    sac = SAC(ForwardOnlyActor(), EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,)), Config(),
              action_size=3, device=torch.device("cpu"))
    observations = torch.randn(4, 5)
    torch.testing.assert_close(sac.explore(sac.actor, observations),
                               torch.tanh(0.5 * observations[:, :3]))


def test_actor_deterministic_action_is_tanh_of_mean() -> None:
    actor = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(16,))
    observations = torch.randn(4, 5)
    mean, _ = actor.mean_and_log_std(observations)
    torch.testing.assert_close(actor.deterministic_action(observations), torch.tanh(mean))


@pytest.mark.parametrize(("bias", "bound"), [(1e3, LOG_STD_MAX), (-1e3, LOG_STD_MIN)])
def test_actor_log_std_bounds(bias: float, bound: float) -> None:
    actor = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(8,))
    with torch.no_grad():
        actor.log_std.weight.zero_()
        actor.log_std.bias.fill_(bias)
    _, log_std = actor.mean_and_log_std(torch.randn(6, 5))
    assert (LOG_STD_MIN, LOG_STD_MAX) == (-5.0, 2.0)
    torch.testing.assert_close(log_std, torch.full((6, 3), bound))


def test_actor_log_std_midpoint() -> None:
    actor = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(8,))
    with torch.no_grad():
        actor.log_std.weight.zero_()
        actor.log_std.bias.zero_()
    _, log_std = actor.mean_and_log_std(torch.randn(2, 5))
    torch.testing.assert_close(log_std, torch.full((2, 3), -1.5))


def hand_critic(critic: EnsembleCritic, member: int, obs: torch.Tensor, act: torch.Tensor):
    """Member `member` of the ensemble as a plain MLP built from its slice of the weights."""
    h = torch.cat([obs, act], dim=1)
    layers = list(zip(critic.weights, critic.biases, strict=True))
    for i, (weight, bias) in enumerate(layers):
        h = h @ weight[member] + bias[member, 0]
        if i < len(layers) - 1:
            h = torch.relu(h)
    return h[:, 0]


@pytest.mark.parametrize("num_critics", [1, 2, 5])
def test_ensemble_equals_separate_critics(num_critics: int) -> None:
    critic = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 16), num_critics=num_critics)
    obs, act = torch.randn(20, 5), torch.rand(20, 3) * 2 - 1
    q = critic(obs, act)
    assert q.shape == (20, num_critics)
    for e in range(num_critics):
        torch.testing.assert_close(q[:, e], hand_critic(critic, e, obs, act))
    assert isinstance(critic, Critic)


def test_ensemble_matches_nn_linear_critics_loaded_with_its_weights() -> None:
    critic = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(16, 16), num_critics=2)
    obs, act = torch.randn(7, 5), torch.randn(7, 3)
    for e in range(2):
        net = mlp([8, 16, 16, 1])
        linears = [m for m in net if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for linear, weight, bias in zip(linears, critic.weights, critic.biases, strict=True):
                linear.weight.copy_(weight[e].T)
                linear.bias.copy_(bias[e, 0])
        torch.testing.assert_close(critic(obs, act)[:, e], net(torch.cat([obs, act], 1))[:, 0])


def test_ensemble_members_differ_and_init_like_nn_linear() -> None:
    critic = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(256, 256), num_critics=2)
    for weight, bias in zip(critic.weights, critic.biases, strict=True):
        assert not torch.equal(weight[0], weight[1])
        assert not torch.equal(bias[0], bias[1])
        bound = 1 / math.sqrt(weight.shape[1])
        assert weight.abs().max() <= bound and bias.abs().max() <= bound
        # U(-b, b) has standard deviation b / sqrt(3), as nn.Linear's weights do.
        reference = nn.Linear(weight.shape[1], weight.shape[2]).weight
        assert weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
        assert reference.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    q = critic(torch.randn(4, 5), torch.randn(4, 3))
    assert not torch.equal(q[:, 0], q[:, 1])


def test_ensemble_rejects_zero_critics() -> None:
    with pytest.raises(ConfigError, match="num_critics must be at least 1, got 0"):
        EnsembleCritic(OBS_SPACE, ACT_SPACE, num_critics=0)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_a_distributional_ensemble_gives_each_member_its_atoms_logits(layer_norm: bool
                                                                      ) -> None:
    """--critic-atoms 7: the last layer has 7 outputs per member, forward (B, E, 7); the
    hidden layers are those of the scalar critic, and member e's logits are an MLP's."""
    critic = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(16, 8), num_critics=2,
                            layer_norm=layer_norm, atoms=7)
    scalar = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(16, 8), num_critics=2,
                            layer_norm=layer_norm)
    shapes = {name: p.shape for name, p in critic.named_parameters()}
    assert shapes["weights.2"] == (2, 8, 7) and shapes["biases.2"] == (2, 1, 7)
    assert {n: s for n, s in shapes.items() if n not in ("weights.2", "biases.2")} == {
        n: p.shape for n, p in scalar.named_parameters() if n not in ("weights.2", "biases.2")}
    obs, act = torch.randn(20, 5), torch.rand(20, 3) * 2 - 1
    logits = critic(obs, act)
    assert logits.shape == (20, 2, 7)
    if layer_norm:
        return
    x = torch.cat([obs, act], 1)
    for e in range(2):
        h = torch.relu(x @ critic.weights[0][e] + critic.biases[0][e])
        h = torch.relu(h @ critic.weights[1][e] + critic.biases[1][e])
        torch.testing.assert_close(logits[:, e], h @ critic.weights[2][e] + critic.biases[2][e])


def test_the_default_critic_takes_its_atoms_from_the_config() -> None:
    cfg = Config(critic_atoms=11, v_min=-1.0, v_max=1.0, hidden_sizes=(8,))
    critic = SAC.default_critic(OBS_SPACE, ACT_SPACE, cfg)
    assert critic.atoms == 11 and critic(torch.zeros(3, 5), torch.zeros(3, 3)).shape == (3, 2, 11)
    assert SAC.default_critic(OBS_SPACE, ACT_SPACE, Config(hidden_sizes=(8,))).atoms == 0
    with pytest.raises(ConfigError, match="atoms must be 0 \\(Q values\\) or at least 2, got 1"):
        EnsembleCritic(OBS_SPACE, ACT_SPACE, atoms=1)


def test_networks_reject_image_spaces() -> None:
    image = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    with pytest.raises(ConfigError, match="flat"):
        SquashedGaussianActor(image, ACT_SPACE)


def test_state_action_input_equals_critic_and_shares_parameters() -> None:
    critic = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(16,))
    packed_critic = StateActionInput(critic)
    assert packed_critic.observation_size == 5
    obs, act = torch.randn(9, 5), torch.randn(9, 3)
    torch.testing.assert_close(packed_critic(torch.cat([obs, act], 1)), critic(obs, act))
    wrapped = list(packed_critic.parameters())
    own = list(critic.parameters())
    assert len(wrapped) == len(own)
    assert all(a is b for a, b in zip(wrapped, own, strict=True))
    # A gradient step through the wrapper moves the critic itself.
    packed_critic(torch.cat([obs, act], 1)).sum().backward()
    assert all(p.grad is not None for p in own)


def test_state_action_input_needs_an_observation_size() -> None:
    with pytest.raises(ValueError, match="observation_size"):
        StateActionInput(nn.Linear(8, 2))
    assert StateActionInput(nn.Linear(8, 2), observation_size=5).observation_size == 5


def test_deterministic_actor_shapes_and_range() -> None:
    actor = DeterministicActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 32))
    # Large inputs drive tanh into saturation; the actions must still stay in [-1, 1].
    observations = torch.randn(64, 5) * 100
    actions = actor(observations)
    assert actions.shape == (64, 3)
    assert actions.abs().max() <= 1.0
    assert actions.abs().max() > 0.99
    assert isinstance(actor, DeterministicPolicy)
    assert (actor.observation_size, actor.action_size) == (5, 3)


def test_deterministic_actor_is_tanh_of_its_mlp_and_noise_free() -> None:
    actor = DeterministicActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(16,))
    assert [type(m) for m in actor.net] == [nn.Linear, nn.ReLU, nn.Linear]
    observations = torch.randn(6, 5)
    first, second = actor(observations), actor(observations)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, torch.tanh(actor.net(observations)))
    torch.testing.assert_close(actor.deterministic_action(observations), first)


def test_deterministic_actor_gradient_flows_to_every_parameter() -> None:
    actor = DeterministicActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(16, 16))
    actor(torch.randn(8, 5)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())


def test_deterministic_action_follows_a_subclass_forward() -> None:
    class Halved(DeterministicActor):
        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            return 0.5 * super().forward(observations)

    actor = Halved(OBS_SPACE, ACT_SPACE, hidden_sizes=(8,))
    observations = torch.randn(3, 5)
    torch.testing.assert_close(actor.deterministic_action(observations), actor(observations))


def test_deterministic_actor_without_hidden_layers_and_rejects_image_spaces() -> None:
    actor = DeterministicActor(OBS_SPACE, ACT_SPACE, hidden_sizes=())
    assert actor(torch.randn(2, 5)).shape == (2, 3)
    image = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    with pytest.raises(ConfigError, match="flat"):
        DeterministicActor(image, ACT_SPACE)


# --------------------------------------------------------------------------------------------
# --layer-norm: Linear -> LayerNorm -> ReLU in every hidden block
# --------------------------------------------------------------------------------------------


def n_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_mlp_with_layer_norm_puts_one_after_each_hidden_linear() -> None:
    kinds = [type(layer) for layer in mlp([4, 8, 6, 2], layer_norm=True)]
    assert kinds == [nn.Linear, nn.LayerNorm, nn.ReLU, nn.Linear, nn.LayerNorm, nn.ReLU,
                     nn.Linear]
    norms = [m for m in mlp([4, 8, 6, 2], layer_norm=True) if isinstance(m, nn.LayerNorm)]
    assert [m.normalized_shape for m in norms] == [(8,), (6,)]
    assert [type(m) for m in hidden_blocks([4, 8], layer_norm=True)] == [
        nn.Linear, nn.LayerNorm, nn.ReLU]
    assert [type(m) for m in hidden_blocks([4, 8])] == [nn.Linear, nn.ReLU]


def test_actors_with_layer_norm_structure_and_parameter_counts() -> None:
    plain = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 16))
    normed = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 16), layer_norm=True)
    assert [type(m) for m in normed.trunk] == [nn.Linear, nn.LayerNorm, nn.ReLU, nn.Linear,
                                               nn.LayerNorm, nn.ReLU]
    # Linears: 5*32+32 + 32*16+16 + two heads 2*(16*3+3) = 192 + 528 + 102 = 822;
    # LayerNorms: 2*32 + 2*16 = 96.
    assert n_parameters(plain) == 822 and n_parameters(normed) == 822 + 96
    # Off: the module names of older checkpoints.
    assert list(plain.state_dict()) == ["trunk.0.weight", "trunk.0.bias", "trunk.2.weight",
                                        "trunk.2.bias", "mean.weight", "mean.bias",
                                        "log_std.weight", "log_std.bias"]
    plain_td3 = DeterministicActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 16))
    normed_td3 = DeterministicActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 16), layer_norm=True)
    assert [type(m) for m in normed_td3.net] == [nn.Linear, nn.LayerNorm, nn.ReLU, nn.Linear,
                                                 nn.LayerNorm, nn.ReLU, nn.Linear]
    # 192 + 528 + 16*3+3 = 771; LayerNorms 96.
    assert n_parameters(plain_td3) == 771 and n_parameters(normed_td3) == 771 + 96


def test_ensemble_critic_with_layer_norm_parameter_counts_and_init() -> None:
    plain = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 16), num_critics=3)
    normed = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 16), num_critics=3,
                            layer_norm=True)
    # Per member: 8*32+32 + 32*16+16 + 16+1 = 833; LayerNorms 2*(32+16) = 96.
    assert n_parameters(plain) == 3 * 833 and n_parameters(normed) == 3 * (833 + 96)
    assert [tuple(w.shape) for w in normed.norm_weights] == [(3, 32), (3, 16)]
    assert [tuple(b.shape) for b in normed.norm_biases] == [(3, 32), (3, 16)]
    assert all(torch.equal(w, torch.ones_like(w)) for w in normed.norm_weights)
    assert all(torch.equal(b, torch.zeros_like(b)) for b in normed.norm_biases)
    assert not hasattr(plain, "norm_weights")
    assert {k for k in plain.state_dict() if "norm" in k} == set()


def test_layer_norm_of_a_fixed_input_is_f_layer_norm_and_the_hand_value() -> None:
    """[1, 2, 3, 4]: mean 2.5, variance 1.25, so (x - 2.5) / sqrt(1.25 + 1e-5), then each
    member's scale and shift."""
    critic = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(4,), num_critics=2,
                            layer_norm=True)
    with torch.no_grad():
        critic.norm_weights[0].copy_(torch.tensor([[1.0, 1, 1, 1], [2.0, 0.5, -1, 3]]))
        critic.norm_biases[0].copy_(torch.tensor([[0.0, 0, 0, 0], [1.0, -1, 0, 0.5]]))
    h = torch.tensor([1.0, 2.0, 3.0, 4.0]).expand(2, 3, 4)  # (E, B, width)
    out = critic._normalised(h, 0)
    normal = (torch.tensor([1.0, 2.0, 3.0, 4.0]) - 2.5) / math.sqrt(1.25 + 1e-5)
    torch.testing.assert_close(out[0], normal.expand(3, 4))
    torch.testing.assert_close(out[1], (normal * torch.tensor([2.0, 0.5, -1, 3])
                                        + torch.tensor([1.0, -1, 0, 0.5])).expand(3, 4))
    for e in range(2):
        assert torch.equal(out[e], F.layer_norm(h[e], (4,), critic.norm_weights[0][e],
                                                critic.norm_biases[0][e]))
    actor = SquashedGaussianActor(OBS_SPACE, ACT_SPACE, hidden_sizes=(4,), layer_norm=True)
    assert torch.equal(actor.trunk[1](h[0]), F.layer_norm(h[0], (4,)))


def member_as_sequential(critic: EnsembleCritic, e: int) -> nn.Sequential:
    """Member e of ``critic`` as a plain Linear -> LayerNorm -> ReLU MLP with its slices."""
    layers: list[nn.Module] = []
    last = len(critic.weights) - 1
    with torch.no_grad():
        for i, (weight, bias) in enumerate(zip(critic.weights, critic.biases, strict=True)):
            linear = nn.Linear(weight.shape[1], weight.shape[2])
            linear.weight.copy_(weight[e].T)
            linear.bias.copy_(bias[e, 0])
            layers.append(linear)
            if i < last:
                norm = nn.LayerNorm(weight.shape[2])
                norm.weight.copy_(critic.norm_weights[i][e])
                norm.bias.copy_(critic.norm_biases[i][e])
                layers += [norm, nn.ReLU()]
    return nn.Sequential(*layers)


def test_each_layer_norm_ensemble_member_is_a_plain_layer_norm_mlp() -> None:
    """Through the hidden layers to the bit; the last (width -> 1) layer is a batched matmul
    against nn.Linear's matrix-vector product, which sum in another order (the same holds
    without LayerNorm), so the Q values are compared to rounding, and the hidden features
    exactly, through a head that picks one feature at a time."""
    critic = EnsembleCritic(OBS_SPACE, ACT_SPACE, hidden_sizes=(32, 16), num_critics=3,
                            layer_norm=True)
    with torch.no_grad():  # affine parameters away from their init, different per member
        for weight, bias in zip(critic.norm_weights, critic.norm_biases, strict=True):
            weight.normal_()
            bias.normal_()
    obs, act = torch.randn(20, 5), torch.randn(20, 3)
    inputs = torch.cat([obs, act], 1)
    q = critic(obs, act)
    references = [member_as_sequential(critic, e) for e in range(3)]
    for e, reference in enumerate(references):
        torch.testing.assert_close(q[:, e], reference(inputs)[:, 0], rtol=1e-6, atol=1e-6)
    head_weight, head_bias = critic.weights[-1], critic.biases[-1]
    with torch.no_grad():
        head_bias.zero_()
        for j in range(16):
            head_weight.zero_()
            head_weight[:, j, 0] = 1.0
            picked = critic(obs, act)
            for e, reference in enumerate(references):
                assert torch.equal(picked[:, e], reference[:-1](inputs)[:, j])
