"""The off-policy learner with K seeds stacked on a leading dimension (CPU): it builds and
updates from a (K, N, row) buffer, its metrics come per seed, and nothing of one seed reaches
another: a change in seed 0's replay data leaves every other seed's learning state identical
to the bit."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import CPU, cpu_plan, flat_state

from rl_graphstep.algorithms import OFF_POLICY_ALGORITHMS as ALGORITHMS
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.networks.seeds import stack_pairs
from rl_graphstep.settings.config import Config

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
SEEDS = (1, 2, 3)

C51 = {"critic_atoms": 11, "v_min": -5.0, "v_max": 5.0}
# Each algorithm with the scalar critic, and the distributional one (--critic-atoms), whose
# projection mixes the atoms of each row: a row of another seed must not reach it. CrossQ's
# critic gives Q values only.
CRITICS = pytest.mark.parametrize(("algo", "settings"), [
    (algo, settings) for algo in sorted(ALGORITHMS) for settings in ({}, C51)
    if not (algo == "crossq" and settings)],
    ids=lambda value: value if isinstance(value, str) else "c51" if value else "mse")


def group_learner(algo: str, rows: dict[str, np.ndarray], **settings: object
                  ) -> tuple[OffPolicyLearner, MetricSums]:
    """A built learner of three seeds (small default networks) over a buffer holding
    ``rows`` (K x n transitions, seed k's rows k*n .. k*n+n-1), with the config
    ``settings``."""
    cfg = Config(algo=algo, num_seeds=len(SEEDS), batch_size=16, hidden_sizes=(8, 8),
                 policy_frequency=2, **settings)
    kind = ALGORITHMS[algo]
    actors, critics = stack_pairs(
        lambda seed: (kind.default_actor(OBS, ACT, cfg), kind.default_critic(OBS, ACT, cfg)),
        SEEDS, observation_size=3, action_size=1)
    algorithm = kind(actors, critics, cfg, action_size=1, device=CPU, seeds=len(SEEDS))
    buffer = ReplayBuffer(200, 3, 1, CPU, seeds=len(SEEDS))
    buffer.add(rows["obs"], rows["act"], rows["rew"], rows["next"], rows["term"])
    learner = OffPolicyLearner(algorithm, buffer, cfg, cpu_plan())
    sums = MetricSums(shape=(len(SEEDS),))
    learner.build(sums)
    return learner, sums


def replay_rows(n: int = 40) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    k = len(SEEDS) * n
    return {"obs": rng.uniform(-1, 1, (k, 3)), "act": rng.uniform(-1, 1, (k, 1)),
            "rew": rng.normal(size=k), "next": rng.uniform(-1, 1, (k, 3)),
            "term": rng.random(k) < 0.1}


@CRITICS
def test_a_group_learns_per_seed_and_reports_per_seed(algo: str, settings: dict) -> None:
    torch.manual_seed(0)
    learner, sums = group_learner(algo, replay_rows(), **settings)
    before = {k: v.clone() for k, v in flat_state(learner).items()}
    for _ in range(6):
        learner.update()
    means = sums.take_rows()
    assert len(means["losses/critic"]) == len(SEEDS)
    assert len(means["losses/actor_grad_norm"]) == len(SEEDS)
    state = flat_state(learner)
    moved = [name for name in state if "critic.stacked" in name
             and not torch.equal(state[name], before[name])]
    assert moved, "the critic did not learn"
    assert learner.updates == 6


@CRITICS
def test_a_change_in_one_seeds_data_reaches_no_other_seed(algo: str, settings: dict) -> None:
    rows = replay_rows()
    changed = {name: value.copy() for name, value in rows.items()}
    n = len(rows["rew"]) // len(SEEDS)
    changed["rew"][:n] += 5.0  # seed 0's rewards only
    changed["obs"][:n] *= -1.0
    states = []
    for data in (rows, changed):
        torch.manual_seed(0)
        learner, _ = group_learner(algo, data, **settings)
        for _ in range(6):
            learner.update()
        states.append(flat_state(learner))
    same, other = states
    per_seed = [name for name, value in same.items() if value.dim() and value.shape[0] == 3
                and "param_groups" not in name]
    assert per_seed
    for name in per_seed:
        assert torch.equal(same[name][1:], other[name][1:]), name
    assert any(not torch.equal(same[name][0], other[name][0]) for name in per_seed)
