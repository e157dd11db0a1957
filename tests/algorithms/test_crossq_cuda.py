"""CrossQ on a GPU, as the loop builds it (captured steps, the fused update): captured updates
match eager ones, the fused graphs match the separate graphs bit for bit, with one seed and
with three, and batch renormalisation's running statistics and call counts move inside the
replayed graphs, through the end of the warm-up."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import assert_same_learning_state

from rl_graphstep.algorithms.crossq import CrossQ
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.graphstep import CudaGraphAdaptationStep, EagerAdaptationStep
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.run.netspec import make_seed_networks
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import RunPlan

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")
OBS = gym.spaces.Box(-1.0, 1.0, (17,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
# Small widths, and a warm-up that ends within the updates compared.
SETTINGS = {"hidden_sizes": (64, 64), "critic_hidden_sizes": (256, 256),
            "policy_frequency": 3, "batch_renorm_warmup": 10}


def crossq_learner(seeds: int, graphs: bool, *, fuse: bool = True
                   ) -> tuple[OffPolicyLearner, MetricSums]:
    """CrossQ of ``seeds`` seeds (one: a single run) over 3000 rows of each, built with CUDA
    graphs (fused or not) or eagerly, from the same seeds every call."""
    cfg = Config(algo="crossq", num_seeds=seeds, **SETTINGS)
    torch.manual_seed(0)
    actors, critics = make_seed_networks(CrossQ, cfg, tuple(range(1, seeds + 1)), OBS, ACT,
                                         DEVICE)
    algorithm = CrossQ(actors, critics, cfg, action_size=6, device=DEVICE, seeds=seeds)
    buffer = ReplayBuffer(3000, 17, 6, DEVICE, seeds=seeds)
    rng, n = np.random.default_rng(0), 3000 * seeds
    buffer.add(rng.normal(size=(n, 17)), rng.uniform(-1, 1, (n, 6)), rng.normal(size=n),
               rng.normal(size=(n, 17)), rng.random(n) < 0.05)
    plan = RunPlan(device=DEVICE, graphs=graphs, compile=False, action_stream=False,
                   vec_env="sync", tf32=False)
    made = OffPolicyLearner(algorithm, buffer, cfg, plan)
    sums = MetricSums(shape=(seeds,) if seeds > 1 else ())
    made.build(sums, fuse=fuse)
    return made, sums


def run(made: OffPolicyLearner, sums: MetricSums, updates: int) -> list[dict]:
    torch.manual_seed(11)
    history = []
    for _ in range(updates):
        made.update()
        history.append(sums.take() if made.seeds == 1 else sums.take_rows())
    return history


def renorm_state(made: OffPolicyLearner) -> dict[str, torch.Tensor]:
    """Every batch renormalisation buffer of the actor and the critic, by name."""
    return {f"{role}.{name}": value.clone()
            for role in ("actor", "critic")
            for name, value in getattr(made.algorithm, role).state_dict().items()
            if name.rsplit(".", 1)[-1] in ("running_mean", "running_var", "steps")}


@pytest.mark.parametrize("seeds", [1, 3])
def test_captured_updates_match_eager(seeds: int) -> None:
    learners, losses = {}, {}
    for graphs in (True, False):
        made, sums = crossq_learner(seeds, graphs)
        kind = CudaGraphAdaptationStep if graphs else EagerAdaptationStep
        assert isinstance(made.critic_step, kind) and isinstance(made.actor_step, kind)
        losses[graphs] = torch.tensor([u["losses/critic"] for u in run(made, sums, 30)])
        learners[graphs] = made
    graph, eager = learners[True], learners[False]
    assert graph.fused is not None and len(graph.fused.phases) == 3
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-4, atol=1e-5)
    assert_same_learning_state(graph, eager, rtol=1e-4, atol=1e-5)
    assert losses[True][-1].ne(losses[True][0]).all()


@pytest.mark.parametrize("seeds", [1, 3])
def test_fused_update_graphs_match_the_separate_graphs_bit_for_bit(seeds: int) -> None:
    learners, per_update = {}, {}
    for fuse in (False, True):
        made, sums = crossq_learner(seeds, True, fuse=fuse)
        per_update[fuse] = run(made, sums, 30)
        learners[fuse] = made
    assert learners[False].fused is None and learners[True].fused is not None
    assert per_update[True] == per_update[False]
    assert_same_learning_state(learners[True], learners[False])


@pytest.mark.parametrize("seeds", [1, 3])
def test_running_statistics_move_inside_the_replayed_graphs(seeds: int) -> None:
    made, sums = crossq_learner(seeds, True)
    built = renorm_state(made)
    # Building (capture, its warm-up updates) left them as they were.
    assert all(value.eq(0).all() for name, value in built.items() if name.endswith("steps"))
    run(made, sums, 30)
    after = renorm_state(made)
    group = [seeds] if seeds > 1 else []
    counts = {name: value.tolist() for name, value in after.items() if name.endswith("steps")}
    # 30 critic updates, 10 actor updates (every third): one training call each.
    assert counts["critic.stacked.input_renorm.steps" if seeds > 1 else
                  "critic.input_renorm.steps"] == ([30] * seeds if group else 30)
    assert counts["actor.stacked.trunk.0.steps" if seeds > 1 else
                  "actor.trunk.0.steps"] == ([10] * seeds if group else 10)
    for name, value in after.items():
        if not name.endswith("steps"):
            assert not torch.equal(value, built[name]), name
            assert torch.isfinite(value).all(), name
