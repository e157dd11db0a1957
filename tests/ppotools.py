"""A small PPO learner and its rollouts, shared by the CPU and GPU tests of the on-policy
learner: a one-step bandit whose reward is highest for the action that equals the first
observation."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rl_graphstep.algorithms.ppo import PPO
from rl_graphstep.data.normalizer import CLEANRL_FORM, ObservationNormalizer
from rl_graphstep.data.rollout import Rollout
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.learners.onpolicy import OnPolicyLearner
from rl_graphstep.networks.policies import CategoricalActor, GaussianActor, ValueNetwork
from rl_graphstep.networks.seeds import SeedStack
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import RunPlan

OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
SETTINGS = {"num_steps": 16, "num_envs": 4, "num_minibatches": 4, "update_epochs": 3,
            "total_timesteps": 64 * 40, "hidden_sizes": (16, 16), "learning_rate": 3e-3,
            # the off-policy cross-checks, out of PPO's way
            "learning_starts": 0, "batch_size": 8}


def make_learner(seeds: int = 1, device: str = "cpu", graphs: bool = False, *,
                 fuse: bool = True, state: dict | None = None, discrete: int = 0,
                 obs_norm: bool = False, compile: bool = False, **settings: object
                 ) -> tuple[OnPolicyLearner, MetricSums]:
    """A built learner with networks made from torch seed 0 (one per seed, stacked);
    ``discrete`` > 0: a categorical actor over that many actions; ``obs_norm``: its rollout
    normalises observations in PPO's form; ``compile``: the plan compiles."""
    cfg = Config(**{**SETTINGS, "num_seeds": seeds, **settings})
    torch.manual_seed(0)
    actors = [CategoricalActor(OBS, gym.spaces.Discrete(discrete), cfg.hidden_sizes)
              if discrete else GaussianActor(OBS, ACT, cfg.hidden_sizes) for _ in range(seeds)]
    critics = [ValueNetwork(OBS, hidden_sizes=cfg.hidden_sizes) for _ in range(seeds)]
    actor, critic = ((actors[0], critics[0]) if seeds == 1
                     else (SeedStack(actors), SeedStack(critics)))
    target = torch.device(device)
    algorithm = PPO(actor, critic, cfg, device=target, seeds=seeds)
    normalizer = (ObservationNormalizer(seeds, 2, target, form=CLEANRL_FORM) if obs_norm
                  else None)
    rollout = Rollout(cfg.num_steps, cfg.num_envs, 2, 1, target, seeds=seeds,
                      normalizer=normalizer)
    plan = RunPlan(device=target, graphs=graphs, compile=compile, action_stream=False,
                   vec_env="sync", tf32=False)
    learner = OnPolicyLearner(algorithm, rollout, cfg, plan)
    if state is not None:
        learner.load_state_dict(state)
    sums = MetricSums(() if seeds == 1 else (seeds,))
    learner.build(sums, fuse=fuse)
    return learner, sums


def lead(learner: OnPolicyLearner) -> tuple[int, ...]:
    return learner.seed_shape


def fill_bandit(learner: OnPolicyLearner, seed: int, reward_scale: Tensor | None = None
                ) -> float:
    """Fill the rollout with one-step episodes of the bandit, acting with the learner's
    actor (observations and actions drawn from torch seed ``seed``); returns the mean
    reward. ``reward_scale`` (K,): each seed's rewards times it."""
    rollout, device = learner.rollout, learner.device
    envs, shape = rollout.num_envs, lead(learner)
    generator = torch.Generator(device=device).manual_seed(seed)
    torch.manual_seed(seed)
    rewards = []
    for _ in range(rollout.num_steps):
        observations = torch.rand(*shape, envs, 2, generator=generator, device=device) * 2 - 1
        actions, log_probs, values = learner.act(observations)
        reward = -(actions[..., 0] - observations[..., 0]).pow(2)
        if reward_scale is not None:
            reward = reward * reward_scale.view(-1, 1)
        rewards.append(reward.mean())
        done = torch.ones(*shape, envs, device=device)
        zeros = torch.zeros(*shape, envs, device=device)
        rollout.add(observations, actions, log_probs, values, reward, done, zeros, zeros)
    return torch.stack(rewards).mean().item()


def next_values(learner: OnPolicyLearner) -> Tensor:
    return torch.zeros(*lead(learner), learner.rollout.num_envs, device=learner.device)


def parameters(learner: OnPolicyLearner) -> list[Tensor]:
    """Copies of the actor's and the critic's parameters."""
    algorithm = learner.algorithm
    return [p.detach().clone() for net in (algorithm.actor, algorithm.critic)
            for p in net.parameters()]


def optimizer_state(learner: OnPolicyLearner) -> list[Tensor]:
    return [value.detach().clone()
            for optimizer in (learner.actor_optimizer, learner.critic_optimizer)
            for state in optimizer.state.values() for value in state.values()]


def check_acting(learner: OnPolicyLearner) -> None:
    """``start_acting`` and ``actions`` for a whole rollout of random host observations:
    the actions returned are the ones the rollout's rows got, each row holds its step's
    observations, the log-probability the actor gives its action and the critic's value,
    every step draws fresh actions (a replayed graph samples anew), and the device's step
    count has come round to the first row again."""
    rollout, seeds, envs = learner.rollout, learner.seeds, learner.rollout.num_envs
    steps = rollout.num_steps
    rng = np.random.default_rng(0)
    returned = []
    for _ in range(steps):
        observations = rng.uniform(-1, 1, (seeds * envs, 2))
        learner.start_acting(observations)
        returned.append((observations, learner.actions().copy()))
        rollout.record(np.zeros(seeds * envs), np.zeros(seeds * envs), np.zeros(seeds * envs),
                       None)
    assert rollout.full and int(rollout.position) == 0
    actor, critic = learner.algorithm.actor, learner.algorithm.critic
    rows = rollout.rows[:, :steps].cpu()  # (K, t, N, W)
    layout = rollout.layout
    for t, (observations, actions) in enumerate(returned):
        row = rows[:, t].reshape(seeds * envs, -1)
        np.testing.assert_allclose(row[:, layout.observations].numpy(), observations,
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(row[:, layout.actions].numpy(), actions)
        shape = (*learner.seed_shape, envs)
        on_device = row.to(learner.device)
        with torch.no_grad():
            log_probs, _ = actor.log_prob_and_entropy(
                on_device[:, layout.observations].reshape(*shape, 2),
                on_device[:, layout.actions].reshape(*shape, -1))
            values = critic(on_device[:, layout.observations].reshape(*shape, 2))
        torch.testing.assert_close(row[:, layout.log_probs], log_probs.reshape(-1).cpu(),
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(row[:, layout.values], values.reshape(-1).cpu(),
                                   rtol=1e-5, atol=1e-5)
    assert not np.array_equal(returned[0][1], returned[1][1])


def check_staged_statistics(learner: OnPolicyLearner) -> None:
    """Under ``--obs-norm`` the acting brings the statistics to the device with the
    observations: after every acting the normaliser's ``stats`` equal, to the bit, those a
    host normaliser uploads after counting the same rows, and each row stored is the step's
    observations normalised by them (a seed with a non-finite row counts it out)."""
    rollout, seeds, envs = learner.rollout, learner.seeds, learner.rollout.num_envs
    normalizer = rollout.normalizer
    assert normalizer is not None
    reference = ObservationNormalizer(seeds, 2, "cpu", form=CLEANRL_FORM)
    rng = np.random.default_rng(1)
    for step in range(rollout.num_steps):
        observations = rng.normal(3.0, 2.0, (seeds * envs, 2))
        keep = np.ones(seeds * envs, dtype=bool)
        if step == 3:
            keep[0] = False  # seed 0's first env: a row the collector keeps out
        normalizer.observe(observations, keep)
        reference.update(observations, keep)
        learner.start_acting(observations)
        learner.actions()
        torch.testing.assert_close(normalizer.stats.cpu(), reference.stats, rtol=0, atol=0)
        stored = rollout.rows[:, step, :, rollout.layout.observations].cpu()
        expected = reference.normalize(torch.as_tensor(observations, dtype=torch.float32)
                                       .view(seeds, envs, 2))
        torch.testing.assert_close(stored, expected, rtol=0, atol=0)
        rollout.record(np.zeros(seeds * envs), np.zeros(seeds * envs), np.zeros(seeds * envs),
                       None)
    assert reference.count.tolist() == [rollout.num_steps * envs - (k == 0)
                                        for k in range(seeds)]
