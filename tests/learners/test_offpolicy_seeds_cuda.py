"""On a GPU, the off-policy learner of K seeds as the loop builds it (captured fused update,
compiled or not): a change in one seed's replay data leaves every other seed's learning state
identical to the bit, and a seed whose data is not finite skips its own updates only, while
every parameter of every seed stays finite. HalfCheetah-v5's sizes and the default 256-256
networks, five seeds."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import flat_state

from rl_graphstep.algorithms import OFF_POLICY_ALGORITHMS as ALGORITHMS
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.run.netspec import make_seed_networks
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import RunPlan

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda:0")
OBS_SIZE, ACT_SIZE, SEEDS, ROWS = 17, 6, (1, 2, 3, 4, 5), 600
OBS = gym.spaces.Box(-np.inf, np.inf, (OBS_SIZE,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (ACT_SIZE,), np.float32)
MODES = pytest.mark.parametrize("compile", [False, True], ids=["plain", "compiled"])
# Without and with the large-batch recipe's --layer-norm --weight-decay (AdamW, whose decay
# the masked step of a compiled group skips with the rest of a bad seed's step), and with a
# distributional critic (--critic-atoms), whose projection must keep each seed's rows apart.
SETTINGS = pytest.mark.parametrize("settings", [
    {}, {"layer_norm": True, "weight_decay": 0.01},
    {"critic_atoms": 51, "v_min": -10.0, "v_max": 10.0}], ids=["adam", "layernorm-adamw", "c51"])


def rows_of_seeds(poisoned: int | None = None) -> dict[str, np.ndarray]:
    """K x ROWS transitions (seed k's rows k*ROWS ..); ``poisoned``: that seed's rewards NaN."""
    rng = np.random.default_rng(0)
    n = len(SEEDS) * ROWS
    rows = {"obs": rng.normal(size=(n, OBS_SIZE)), "act": rng.uniform(-1, 1, (n, ACT_SIZE)),
            "rew": rng.normal(size=n), "next": rng.normal(size=(n, OBS_SIZE)),
            "term": rng.random(n) < 0.01}
    if poisoned is not None:
        rows["rew"][poisoned * ROWS:(poisoned + 1) * ROWS] = np.nan
    return rows


def gpu_learner(rows: dict[str, np.ndarray], compile: bool, settings: dict | None = None
                ) -> OffPolicyLearner:
    """SAC of five seeds over ``rows``, built with CUDA graphs (the fused update), compiled or
    not, from the same seeds every call (with the config ``settings``)."""
    cfg = Config(algo="sac", num_seeds=len(SEEDS), **(settings or {}))
    kind = ALGORITHMS["sac"]
    actors, critics = make_seed_networks(kind, cfg, SEEDS, OBS, ACT, DEVICE)
    algorithm = kind(actors, critics, cfg, action_size=ACT_SIZE, device=DEVICE,
                     seeds=len(SEEDS))
    buffer = ReplayBuffer(ROWS, OBS_SIZE, ACT_SIZE, DEVICE, seeds=len(SEEDS))
    buffer.add(rows["obs"], rows["act"], rows["rew"], rows["next"], rows["term"])
    plan = RunPlan(device=DEVICE, graphs=True, compile=compile, action_stream=False,
                   vec_env="sync", tf32=False)
    learner = OffPolicyLearner(algorithm, buffer, cfg, plan)
    learner.build(MetricSums(shape=(len(SEEDS),)))
    assert learner.fused is not None
    return learner


def trained(rows: dict[str, np.ndarray], compile: bool, updates: int = 30,
            settings: dict | None = None) -> OffPolicyLearner:
    learner = gpu_learner(rows, compile, settings)
    torch.manual_seed(11)
    for _ in range(updates):
        learner.update()
    torch.cuda.synchronize()
    return learner


def per_seed(state: dict[str, torch.Tensor]) -> list[str]:
    return [name for name, value in state.items() if value.dim() and
            value.shape[0] == len(SEEDS) and "param_groups" not in name]


@SETTINGS
@MODES
def test_a_change_in_one_seeds_data_reaches_no_other_seed(compile: bool, settings: dict
                                                          ) -> None:
    rows = rows_of_seeds()
    changed = {name: value.copy() for name, value in rows.items()}
    changed["rew"][:ROWS] += 5.0  # seed 0's rewards only
    same, other = (flat_state(trained(data, compile, settings=settings))
                   for data in (rows, changed))
    names = per_seed(same)
    assert names
    for name in names:
        assert torch.equal(same[name][1:], other[name][1:]), name
    assert any(not torch.equal(same[name][0], other[name][0]) for name in names)


@SETTINGS
@MODES
def test_a_seed_with_non_finite_data_skips_alone_and_nothing_goes_non_finite(
        compile: bool, settings: dict) -> None:
    initial = flat_state(gpu_learner(rows_of_seeds(), compile, settings))
    clean, poisoned = (trained(rows_of_seeds(), compile, settings=settings),
                       trained(rows_of_seeds(1), compile, settings=settings))
    for learner in (clean, poisoned):
        for name, value in flat_state(learner).items():
            if value.is_floating_point():
                assert torch.isfinite(value).all(), name
    critic_guard = poisoned.critic_step.guard
    assert critic_guard is not None
    assert critic_guard.skipped.tolist() == [0, 30, 0, 0, 0]
    assert clean.critic_step.guard.skipped.tolist() == [0] * len(SEEDS)
    same, other = flat_state(clean), flat_state(poisoned)
    others = [0, 2, 3, 4]
    for name in per_seed(same):
        assert torch.equal(same[name][others], other[name][others]), name
    # The bad seed's critic never stepped: its parameters are their initial values.
    critic = [name for name in per_seed(same) if name.startswith(".critic.")]
    assert critic
    for name in critic:
        assert torch.equal(other[name][1], initial[name][1]), name
