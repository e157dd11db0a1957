"""GPU tests of the off-policy learner: captured updates (sampling, steps, the fused update)
match eager ones on the same seed, the fused graphs match the separate ones bit for bit,
compiled steps learn as plain ones, and a resumed state reaches the captured graphs."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import assert_same_learning_state

from rl_graphstep.algorithms import OFF_POLICY_ALGORITHMS as ALGORITHMS
from rl_graphstep.algorithms.base import OffPolicyAlgorithm
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.graphstep import CudaGraphAdaptationStep, EagerAdaptationStep
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import RunPlan

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")
OBS = gym.spaces.Box(-1.0, 1.0, (17,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)


def filled_buffer(rows: int = 3000) -> ReplayBuffer:
    buffer = ReplayBuffer(5000, 17, 6, DEVICE)
    rng = np.random.default_rng(0)
    buffer.add(rng.normal(size=(rows, 17)), rng.uniform(-1, 1, (rows, 6)), rng.normal(size=rows),
               rng.normal(size=(rows, 17)), rng.random(rows) < 0.05)
    return buffer


# The large-batch recipe's network and optimizer settings (--layer-norm --weight-decay).
RECIPE = {"layer_norm": True, "weight_decay": 0.01}


def algorithm(algo: str = "sac", **settings: object) -> OffPolicyAlgorithm:
    torch.manual_seed(0)
    cfg = Config(algo=algo, **settings)
    kind = ALGORITHMS[algo]
    return kind(kind.default_actor(OBS, ACT, cfg), kind.default_critic(OBS, ACT, cfg), cfg,
                action_size=6, device=DEVICE)


def learner(buffer: ReplayBuffer, graphs: bool, compile: bool = False, algo: str = "sac", *,
            state: dict | None = None, fuse: bool = True, **settings: object
            ) -> tuple[OffPolicyLearner, MetricSums]:
    """A built learner (of ``state`` where given, with the config ``settings``) and the sums
    its updates add into."""
    agent = algorithm(algo, **settings)
    plan = RunPlan(device=DEVICE, graphs=graphs, compile=compile, action_stream=False,
                   vec_env="sync", tf32=False)
    made = OffPolicyLearner(agent, buffer, agent.cfg, plan)
    if state is not None:
        made.load_state_dict(state)
    sums = MetricSums()
    made.build(sums, fuse=fuse)
    return made, sums


def critic_losses(made: OffPolicyLearner, sums: MetricSums, updates: int) -> torch.Tensor:
    """Each update's critic loss (a take per update: its mean over one update)."""
    losses = []
    for _ in range(updates):
        made.update()
        losses.append(sums.take()["losses/critic"])
    return torch.tensor(losses)


def assert_close_networks(a: OffPolicyLearner, b: OffPolicyLearner, algo: str) -> None:
    # The target networks each algorithm has (CrossQ: none).
    names = ["actor", "critic"] + [name for name in ("target_critic", "target_actor")
                                   if getattr(a.algorithm, name, None) is not None]
    for name in names:
        for p, q in zip(getattr(a.algorithm, name).parameters(),
                        getattr(b.algorithm, name).parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
    if algo in ("sac", "crossq"):
        torch.testing.assert_close(a.algorithm.log_alpha, b.algorithm.log_alpha)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_captured_updates_match_eager_for_100_updates(algo: str) -> None:
    buffer = filled_buffer(5000)
    results = {}
    for graphs in (True, False):
        made, sums = learner(buffer, graphs, algo=algo)
        kind = CudaGraphAdaptationStep if graphs else EagerAdaptationStep
        assert isinstance(made.critic_step, kind) and isinstance(made.actor_step, kind)
        torch.manual_seed(7)  # the draws and the noise: the same in graph and eager
        results[graphs] = (made, critic_losses(made, sums, 100))
    (graph, graph_losses), (eager, eager_losses) = results[True], results[False]
    assert graph.fused is not None and eager.fused is None
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-4, atol=1e-5)
    assert_close_networks(graph, eager, algo)
    assert graph.updates == 100 and graph_losses[-1] != graph_losses[0]


# CrossQ's networks normalise by batch renormalisation and its critic gives Q values: it
# refuses --layer-norm and --critic-atoms.
LAYER_NORM_AND_C51_ALGOS = [algo for algo in sorted(ALGORITHMS) if algo != "crossq"]


@pytest.mark.parametrize("algo", LAYER_NORM_AND_C51_ALGOS)
def test_layer_norm_adamw_captured_updates_match_eager(algo: str) -> None:
    """--layer-norm --weight-decay 0.01: the captured updates (fused AdamW, LayerNorm
    kernels) against the same updates run eagerly, from the same seed."""
    buffer = filled_buffer(5000)
    results = {}
    for graphs in (True, False):
        made, sums = learner(buffer, graphs, algo=algo, **RECIPE)
        for optimizer in (made.critic_optimizer, made.actor_optimizer):
            assert type(optimizer) is torch.optim.AdamW
            assert optimizer.param_groups[0]["weight_decay"] == 0.01
            assert optimizer.param_groups[0]["capturable"] and optimizer.param_groups[0]["fused"]
        assert hasattr(made.algorithm.critic, "norm_weights")
        torch.manual_seed(7)
        results[graphs] = (made, critic_losses(made, sums, 100))
    (graph, graph_losses), (eager, eager_losses) = results[True], results[False]
    assert isinstance(graph.critic_step, CudaGraphAdaptationStep) and graph.fused is not None
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-4, atol=1e-5)
    assert_close_networks(graph, eager, algo)
    norm = graph.algorithm.critic.norm_weights[0]
    assert not torch.equal(norm, torch.ones_like(norm))  # the LayerNorm scales learn


def test_compiled_layer_norm_adamw_steps_use_the_masked_step_and_learn_as_plain_ones(
        ) -> None:
    """Compiled, the AdamW step is the masked one (core/maskedadam.py): compared by outcome
    with the uncompiled fused AdamW, as compiled and plain runs draw differently."""
    buffer = filled_buffer()
    final = {}
    for compile in (False, True):
        made, sums = learner(buffer, True, compile, **RECIPE)
        assert made.critic_step._body._masked_step  # AdamW qualifies; compiled, it runs
        assert made.critic_step._body.uncompiled_parts == []
        torch.manual_seed(3)
        losses = critic_losses(made, sums, 300)
        final[compile] = losses[-50:].mean().item()
        assert losses[-50:].mean() < losses[:50].mean()
    assert final[True] == pytest.approx(final[False], rel=0.25)


@pytest.mark.parametrize("compile", [False, True], ids=["plain", "compiled"])
def test_updates_from_the_buffer_graph_match_eager(compile: bool) -> None:
    """The whole fast path (captured sampling + captured steps + the fused update, compiled
    or not) against the same code run eagerly, from the same seed, over 50 updates."""
    buffer = filled_buffer()
    learners, losses = {}, {}
    for graphs in (True, False):
        made, sums = learner(buffer, graphs, compile)
        # One update first: the eager twin's first call runs uncompiled (it creates the
        # optimizer state), so the compiled code paths are compared from the second on.
        made.update()
        sums.take()
        torch.manual_seed(11)
        losses[graphs] = critic_losses(made, sums, 50)
        learners[graphs] = made
    graph, eager = learners[True], learners[False]
    assert isinstance(graph.critic_step, CudaGraphAdaptationStep)
    assert graph.sampler.graph is not None
    assert len(graph.fused.phases) == 2  # the default policy_frequency 2
    assert isinstance(eager.critic_step, EagerAdaptationStep)
    assert graph.plan.compile is compile
    assert graph.critic_step._body.uncompiled_parts == []
    if compile:
        # Compiled code draws its random numbers differently when captured than when run
        # eagerly (inductor seeds its own generator from the default one), so the two runs
        # see different noise from the first update: compare them as samples.
        relative = ((losses[True] - losses[False]).abs() / losses[False].abs())
        print(f"compiled graph vs eager: max relative difference {relative.max():.4f}, "
              f"means {losses[True].mean():.5f} vs {losses[False].mean():.5f}")
        assert relative.max() < 0.05
        torch.testing.assert_close(losses[True].mean(), losses[False].mean(), rtol=0.01, atol=0)
        return
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-4, atol=1e-5)
    for p, q in zip(graph.algorithm.actor.parameters(), eager.algorithm.actor.parameters(),
                    strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(graph.algorithm.log_alpha, eager.algorithm.log_alpha)


@pytest.mark.parametrize("compile", [False, True], ids=["plain", "compiled"])
def test_fused_update_graphs_match_the_separate_graphs_bit_for_bit(compile: bool) -> None:
    """One graph per update (sampling, critic, target update, actor steps when due) runs the
    separate graphs' kernels in their order, drawing the same random numbers; it adds the
    metrics into the sums inside the graph, the separate replays after each update.

    Compiled, the two agree to float32 rounding rather than to the bit: on the H200 the actor
    loss of one update in 50 came out one unit in the last place apart in some runs of the GPU
    suite (and not in others, nor alone), as a compiled reduction whose order is not fixed
    would."""
    buffer = filled_buffer()
    learners, per_update, interval = {}, {}, {}
    for fuse in (False, True):
        made, sums = learner(buffer, True, compile, fuse=fuse)
        torch.manual_seed(11)
        history = []
        for _ in range(40):
            made.update()
            history.append(sums.take())
        for _ in range(10):
            made.update()
        learners[fuse], per_update[fuse], interval[fuse] = made, history, sums.take()
    assert learners[False].fused is None and len(learners[True].fused.phases) == 2
    assert len(per_update[True][0]) == 6 and len(per_update[True][1]) == 2  # actor: even ones
    assert len(interval[True]) == 6
    if not compile:
        assert per_update[True] == per_update[False]
        assert interval[True] == interval[False]
        assert_same_learning_state(learners[True], learners[False])
        return
    close = {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(per_update[True], per_update[False], **close)
    torch.testing.assert_close(interval[True], interval[False], **close)
    assert_same_learning_state(learners[True], learners[False], **close)


def test_compiled_steps_learn_the_same_as_plain_ones() -> None:
    """Compiled kernels round differently and draw their noise differently, so compiled and
    plain runs are compared by outcome: a critic fitted on the same data reaches a similar
    loss."""
    buffer = filled_buffer()
    final = {}
    for compile in (False, True):
        made, sums = learner(buffer, True, compile)
        torch.manual_seed(3)
        losses = critic_losses(made, sums, 300)
        final[compile] = losses[-50:].mean().item()
        assert losses[-50:].mean() < losses[:50].mean()
    assert final[True] == pytest.approx(final[False], rel=0.25)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_resumed_state_reaches_the_captured_graphs(algo: str) -> None:
    """The same state resumed with graphs and eagerly: if a restored value did not reach
    the graphs (captured from the values before it), the two would part at once."""
    buffer = filled_buffer()
    trained, _ = learner(buffer, True, algo=algo)
    torch.manual_seed(1)
    for _ in range(50):
        trained.update()
    state = copy.deepcopy(trained.state_dict())  # as a checkpoint file holds it
    resumed = {}
    for graphs in (True, False):
        # A copy each, as two checkpoint loads give: Adam's load_state_dict keeps tensors
        # already on the device, so one shared state would carry the first run's updates.
        made, sums = learner(buffer, graphs, algo=algo, state=copy.deepcopy(state))
        assert made.updates == 50
        torch.manual_seed(3)
        resumed[graphs] = (made, critic_losses(made, sums, 50))
    (graph, graph_losses), (eager, eager_losses) = resumed[True], resumed[False]
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-4, atol=1e-5)
    assert_close_networks(graph, eager, algo)
    assert graph.updates == eager.updates == 100
    fresh, _ = learner(buffer, True, algo=algo)
    assert not torch.equal(next(fresh.algorithm.critic.parameters()),
                           next(graph.algorithm.critic.parameters()))


@pytest.mark.parametrize("fuse", [True, False])
def test_a_captured_update_reads_the_observation_statistics_as_they_are_now(fuse: bool
                                                                             ) -> None:
    """--obs-norm: the sampled batch's observations and next observations reach the steps
    normalised by the statistics of the moment: changed in place between replays, the
    captured update reads the new ones (the eager normalisation of the same rows)."""
    from rl_graphstep.data.normalizer import ObservationNormalizer

    normalizer = ObservationNormalizer(1, 17, DEVICE)
    buffer = ReplayBuffer(5000, 17, 6, DEVICE, normalizer=normalizer)
    rng = np.random.default_rng(0)
    obs, next_obs = rng.normal(3.0, 5.0, (1, 17)), rng.normal(-2.0, 4.0, (1, 17))
    # Every row the same transition: whatever the sample draws, its rows are known.
    buffer.add(obs.repeat(300, 0), np.zeros((300, 6)), np.zeros(300), next_obs.repeat(300, 0),
               np.zeros(300, bool))
    made, _ = learner(buffer, graphs=True, fuse=fuse)
    assert (made.fused is not None) == fuse
    raw = torch.tensor(obs, dtype=torch.float32, device=DEVICE)
    raw_next = torch.tensor(next_obs, dtype=torch.float32, device=DEVICE)
    for scale in (1.0, 10.0, 0.5):
        normalizer.update(rng.normal(1.0, scale, (64, 17)))
        made.update()
        torch.cuda.synchronize()
        expected = normalizer.normalize(raw).expand(256, 17)
        assert torch.equal(made.critic_step.static_inputs[:, :17], expected)
        assert torch.equal(made.actor_step.static_inputs, expected)
        assert torch.equal(made.critic_step.static_targets[:, 2:],
                           normalizer.normalize(raw_next).expand(256, 17))


# ---------------------------------------------------------------- the distributional critic

# --critic-atoms 51 on [-10, 10]: the buffer's rewards are standard normal draws.
C51 = {"critic_atoms": 51, "v_min": -10.0, "v_max": 10.0}


@pytest.mark.parametrize("algo", LAYER_NORM_AND_C51_ALGOS)
def test_c51_captured_updates_match_eager(algo: str) -> None:
    """--critic-atoms: the captured updates (the projection, the cross-entropy, the actor on
    expected values) against the same updates run eagerly, from the same seed."""
    buffer = filled_buffer(5000)
    results = {}
    for graphs in (True, False):
        made, sums = learner(buffer, graphs, algo=algo, **C51)
        assert made.algorithm.support is not None and made.algorithm.critic.atoms == 51
        torch.manual_seed(7)
        results[graphs] = (made, critic_losses(made, sums, 100))
    (graph, graph_losses), (eager, eager_losses) = results[True], results[False]
    assert isinstance(graph.critic_step, CudaGraphAdaptationStep) and graph.fused is not None
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-4, atol=1e-5)
    assert_close_networks(graph, eager, algo)
    assert graph_losses[-10:].mean() < graph_losses[:10].mean()  # it learns


def test_compiled_c51_steps_learn_as_plain_ones() -> None:
    """Compiled (the projection's sum fused), compared by outcome with the plain graphs, as
    compiled and plain runs draw differently."""
    buffer = filled_buffer()
    final = {}
    for compile in (False, True):
        made, sums = learner(buffer, True, compile, **C51)
        assert made.critic_step._body.uncompiled_parts == []
        torch.manual_seed(3)
        losses = critic_losses(made, sums, 300)
        final[compile] = losses[-50:].mean().item()
        assert losses[-50:].mean() < losses[:50].mean()
    assert final[True] == pytest.approx(final[False], rel=0.1)


def group_learner(seeds: int, fuse: bool, **settings: object
                  ) -> tuple[OffPolicyLearner, MetricSums]:
    """SAC of ``seeds`` seeds (one: a single run) over 3000 rows of each, built with CUDA
    graphs, fused or not, from the same seeds every call."""
    from rl_graphstep.run.netspec import make_seed_networks

    cfg = Config(algo="sac", num_seeds=seeds, **settings)
    kind = ALGORITHMS["sac"]
    torch.manual_seed(0)
    actors, critics = make_seed_networks(kind, cfg, tuple(range(1, seeds + 1)), OBS, ACT,
                                         DEVICE)
    algorithm = kind(actors, critics, cfg, action_size=6, device=DEVICE, seeds=seeds)
    buffer = ReplayBuffer(3000, 17, 6, DEVICE, seeds=seeds)
    rng, n = np.random.default_rng(0), 3000 * seeds
    buffer.add(rng.normal(size=(n, 17)), rng.uniform(-1, 1, (n, 6)), rng.normal(size=n),
               rng.normal(size=(n, 17)), rng.random(n) < 0.05)
    plan = RunPlan(device=DEVICE, graphs=True, compile=False, action_stream=False,
                   vec_env="sync", tf32=False)
    made = OffPolicyLearner(algorithm, buffer, cfg, plan)
    sums = MetricSums(shape=(seeds,) if seeds > 1 else ())
    made.build(sums, fuse=fuse)
    return made, sums


@pytest.mark.parametrize("seeds", [1, 3])
def test_c51_fused_update_graphs_match_the_separate_graphs_bit_for_bit(seeds: int) -> None:
    """The projection sums over atoms with no atomic adds: the fused graph and the separate
    ones compute the same bits, with one seed and with three."""
    learners, per_update = {}, {}
    for fuse in (False, True):
        made, sums = group_learner(seeds, fuse, **C51)
        torch.manual_seed(11)
        history = []
        for _ in range(40):
            made.update()
            history.append(sums.take() if seeds == 1 else sums.take_rows())
        learners[fuse], per_update[fuse] = made, history
    assert learners[False].fused is None and len(learners[True].fused.phases) == 2
    assert per_update[True] == per_update[False]
    assert_same_learning_state(learners[True], learners[False])
    last = [v for k, v in learners[True].algorithm.critic.state_dict().items()
            if k.endswith("weights.2")]
    assert len(last) == 1 and last[0].shape[-1] == 51
