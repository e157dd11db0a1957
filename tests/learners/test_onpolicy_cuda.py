"""GPU tests of the on-policy learner: the captured minibatch (one graph: gather, critic step,
actor step, metrics) matches its eager twin over a few updates and the separate step graphs
bit for bit, with K seeds and the target-KL gate too, and an update makes no host sync; the
captured acting (compiled or not) fills the rollout with what it returns."""

from __future__ import annotations

import pytest
import torch
from ppotools import (
    check_acting,
    check_staged_statistics,
    fill_bandit,
    make_learner,
    next_values,
    optimizer_state,
    parameters,
)

from rl_graphstep.graphstep import CudaGraphAdaptationStep
from rl_graphstep.learners.onpolicy import OnPolicyLearner

pytestmark = pytest.mark.cuda


def run(updates: int = 3, **settings: object) -> tuple[list[torch.Tensor], dict, object]:
    """``updates`` updates of a learner (``make_learner``'s settings) on the same rollouts
    and random numbers; its parameters, metrics and the learner."""
    learner, sums = make_learner(device="cuda", **settings)
    for update in range(updates):
        fill_bandit(learner, seed=update)
        torch.manual_seed(100 + update)
        learner.update(next_values(learner))
    metrics = sums.take() if learner.seeds == 1 else sums.take_rows()
    return parameters(learner), metrics, learner


@pytest.mark.parametrize("settings", [{}, {"seeds": 2}, {"target_kl": 0.002},
                                      {"seeds": 2, "target_kl": 0.002}],
                         ids=["one", "seeds", "target-kl", "seeds-target-kl"])
def test_the_captured_learner_matches_its_eager_twin(settings: dict) -> None:
    captured, captured_metrics, learner = run(graphs=True, **settings)
    assert isinstance(learner.critic_step, CudaGraphAdaptationStep)
    assert learner.minibatch_graph is not None
    eager, eager_metrics, _ = run(graphs=False, **settings)
    for p, q in zip(captured, eager, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert captured_metrics.keys() == eager_metrics.keys()
    torch.testing.assert_close(torch.tensor(captured_metrics["losses/value_loss"]),
                               torch.tensor(eager_metrics["losses/value_loss"]),
                               rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("settings", [{}, {"seeds": 2, "target_kl": 0.002}],
                         ids=["one", "seeds-target-kl"])
def test_the_minibatch_graph_matches_the_separate_step_graphs_bit_for_bit(settings: dict
                                                                         ) -> None:
    fused, fused_metrics, learner = run(graphs=True, **settings)
    separate, separate_metrics, other = run(graphs=True, fuse=False, **settings)
    assert learner.minibatch_graph is not None and other.minibatch_graph is None
    for p, q in zip(fused, separate, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    for a, b in zip(optimizer_state(learner), optimizer_state(other), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert fused_metrics == separate_metrics


def test_the_target_kl_stop_holds_a_captured_seed() -> None:
    """With a tiny target every seed stops after its first epoch: the later epochs' replays
    change nothing."""
    learner, _ = make_learner(seeds=2, device="cuda", graphs=True, target_kl=1e-9,
                              update_epochs=3)
    fill_bandit(learner, seed=0)
    minibatch, count, snapshots = learner._minibatch, 0, []

    def counting() -> None:
        nonlocal count
        minibatch()
        count += 1
        if count % learner.cfg.num_minibatches == 0:
            snapshots.append(parameters(learner))

    learner._minibatch = counting  # type: ignore[method-assign]
    learner.update(next_values(learner))
    assert learner.gate is not None and learner.gate.tolist() == [0.0, 0.0]
    for later in snapshots[1:]:
        for p, q in zip(snapshots[0], later, strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("settings", [{}, {"seeds": 2, "target_kl": 0.002}],
                         ids=["one", "seeds-target-kl"])
def test_an_update_makes_no_host_sync(settings: dict) -> None:
    learner, _ = make_learner(device="cuda", graphs=True, **settings)
    fill_bandit(learner, seed=0)
    values = next_values(learner)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        learner.update(values)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def captured_acting(learner: OnPolicyLearner, compiled: bool) -> None:
    """The acting is one graph with its copy in, of compiled kernels where asked for."""
    assert learner.acting_graph is not None and learner._copies_in_graph
    assert (learner._act_on_device != learner._act_and_write) == compiled


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
@pytest.mark.parametrize(("seeds", "discrete"), [(1, 0), (2, 0), (2, 3)],
                         ids=["one", "seeds", "discrete"])
def test_captured_acting_fills_the_rows_with_what_it_returns(seeds: int, discrete: int,
                                                             compiled: bool) -> None:
    learner, _ = make_learner(seeds, device="cuda", graphs=True, discrete=discrete,
                              compile=compiled)
    captured_acting(learner, compiled)
    check_acting(learner)


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
@pytest.mark.parametrize("seeds", [1, 2])
def test_captured_acting_brings_the_statistics_it_normalises_with(seeds: int,
                                                                  compiled: bool) -> None:
    learner, _ = make_learner(seeds, device="cuda", graphs=True, obs_norm=True,
                              compile=compiled)
    captured_acting(learner, compiled)
    check_staged_statistics(learner)
