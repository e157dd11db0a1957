"""The fused update on the CPU, with stand-ins for the CUDA graphs (the GPU tests check real
ones): one recorded update per phase of the schedule, replayed as the separate steps run,
its metrics added into the sums, and the separate steps kept when it cannot be captured."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from fakes import (
    CPU,
    FixedActor,
    FixedDeterministicActor,
    LinearCritic,
    assert_same_learning_state,
    counting_buffer,
    cpu_plan,
)

from rl_graphstep.algorithms.base import OffPolicyAlgorithm
from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.algorithms.td3 import TD3
from rl_graphstep.core.errors import CaptureError
from rl_graphstep.data.sampler import BatchSampler
from rl_graphstep.learners import fused, offpolicy
from rl_graphstep.learners.fused import FusedUpdate
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.learners.offpolicy import OffPolicyLearner
from rl_graphstep.settings.config import Config


class RecordedCall:
    """A stand-in for a captured graph on the CPU: each replay runs the recorded call."""

    def __init__(self, function: Callable[[], Any]) -> None:
        self.function = function

    def replay(self) -> None:
        self.function()


def as_if_on_cuda(monkeypatch: pytest.MonkeyPatch,
                  capture: Callable[..., tuple[RecordedCall, Any]]) -> None:
    """Build a learner with CUDA graphs on the CPU: the steps and the sampling stay eager,
    and the fused update's captures are ``capture``."""
    real = offpolicy.make_adaptation_step

    def eager_steps(*args: object, use_graph: bool, **kwargs: object):
        return real(*args, use_graph=False, **kwargs)

    monkeypatch.setattr(offpolicy, "make_adaptation_step", eager_steps)
    monkeypatch.setattr(offpolicy, "BatchSampler",
                        lambda *args, use_graph: BatchSampler(*args))
    monkeypatch.setattr(fused, "capture_graph", capture)


def recording_without_effect(learner: list[OffPolicyLearner], sums: MetricSums
                             ) -> Callable[..., tuple[RecordedCall, Any]]:
    """A capture that records the call: a real capture runs none of its kernels, so the
    call runs once for its metrics and everything it changed is put back."""

    def capture(function: Callable[[], Any], device: torch.device, **_: object
                ) -> tuple[RecordedCall, Any]:
        parts = {name: copy.deepcopy(part.detach() if isinstance(part, torch.Tensor)
                                     else part.state_dict())
                 for name, part in learner[0]._learning_state().items()}
        totals = {k: t.clone() for k, t in sums._sums.items()}
        rng = torch.get_rng_state()
        metrics = function()
        torch.set_rng_state(rng)
        for name, part in learner[0]._learning_state().items():
            if isinstance(part, torch.Tensor):
                part.detach().copy_(parts[name])
            else:
                part.load_state_dict(parts[name])
        for key, total in totals.items():
            sums._sums[key].copy_(total)
        return RecordedCall(function), metrics

    return capture


def make(kind: type[OffPolicyAlgorithm], **overrides: object) -> OffPolicyAlgorithm:
    cfg = Config(**{"gamma": 0.9, "tau": 0.1, "batch_size": 4, **overrides})
    actor = FixedActor() if kind is SAC else FixedDeterministicActor()
    return kind(actor, LinearCritic(), cfg, action_size=1, device=CPU)


def fused_and_separate(kind: type[OffPolicyAlgorithm], overrides: dict[str, int],
                       monkeypatch: pytest.MonkeyPatch
                       ) -> tuple[list[OffPolicyLearner], list[MetricSums]]:
    buffer = counting_buffer()
    sums = [MetricSums(), MetricSums()]
    separate_algorithm = make(kind, **overrides)
    separate = OffPolicyLearner(separate_algorithm, buffer, separate_algorithm.cfg, cpu_plan())
    separate.build(sums[0])
    fused_algorithm = make(kind, **overrides)
    learner = OffPolicyLearner(fused_algorithm, buffer, fused_algorithm.cfg,
                               cpu_plan(graphs=True))
    with monkeypatch.context() as patch:
        as_if_on_cuda(patch, recording_without_effect([learner], sums[1]))
        learner.build(sums[1])
    return [separate, learner], sums


@pytest.mark.parametrize(("kind", "overrides", "phases"), [
    (SAC, {}, 2),
    (SAC, {"policy_frequency": 1, "target_network_frequency": 3}, 3),
    (TD3, {"policy_frequency": 3}, 3),
])
def test_fused_updates_run_each_phase_of_the_schedule_like_separate_replays(
        kind: type[OffPolicyAlgorithm], overrides: dict[str, int], phases: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The separate replays add each update's metrics after it; the fused graphs add them
    inside and only count on the host: the means come out the same, to the bit."""
    (separate, learner), sums = fused_and_separate(kind, overrides, monkeypatch)
    assert learner.fused is not None and len(learner.fused.phases) == phases
    assert learner.updates == 0 and separate.fused is None
    assert_same_learning_state(learner, separate)  # capturing made no update
    for update in range(2 * phases + 1):
        for each in (separate, learner):
            torch.manual_seed(update)
            each.update()
        means = [bound.take() for bound in sums]
        assert means[1] == means[0], f"update {update}"
        assert ("losses/actor" in means[0]) is (learner.algorithm.actor_steps(update) > 0)
    assert separate.updates == learner.updates == 2 * phases + 1
    assert_same_learning_state(learner, separate)


def test_the_fused_phases_announce_the_metrics_they_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    (_, learner), _ = fused_and_separate(SAC, {}, monkeypatch)
    keys = [keys for _, keys in learner.fused.phases]
    actor = ("losses/actor", "charts/alpha", "losses/alpha", "losses/actor_grad_norm")
    assert keys == [("losses/critic", "losses/critic_grad_norm", *actor),  # the actor steps
                    ("losses/critic", "losses/critic_grad_norm")]
    assert [tuple(m) for m in learner.fused.metrics] == keys


def test_a_fused_update_that_cannot_be_captured_leaves_the_separate_graphs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sac = make(SAC)
    learner = OffPolicyLearner(sac, counting_buffer(), sac.cfg, cpu_plan(graphs=True))

    def fails(function: Callable, device: torch.device, *, what: str, **_: object) -> None:
        raise CaptureError(f"could not capture {what}: RuntimeError: boom")

    as_if_on_cuda(monkeypatch, fails)
    sums = MetricSums()
    with pytest.warns(UserWarning, match=r"could not capture the fused update \(phase 0\): "
                                         "RuntimeError: boom; replaying the separate step "
                                         "graphs instead"):
        plan = learner.build(sums)
    assert plan.graphs is True  # the separate graphs still run
    assert learner.fused is None and learner.sampler is not None
    learner.update()
    assert "losses/critic" in sums.take() and learner.updates == 1


def test_a_schedule_longer_than_the_fused_phases_replays_the_separate_graphs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sac = make(SAC, policy_frequency=fused.MAX_PHASES + 1)
    learner = OffPolicyLearner(sac, counting_buffer(), sac.cfg, cpu_plan(graphs=True))
    as_if_on_cuda(monkeypatch, recording_without_effect([learner], MetricSums()))
    learner.build(MetricSums())
    assert learner.fused is None


def capture_by_running(function: Callable[[], Any], device: torch.device, **_: object
                       ) -> tuple[RecordedCall, Any]:
    return RecordedCall(function), function()


def test_metrics_other_than_the_announced_ones_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "capture_graph", capture_by_running)
    zero = torch.zeros(())
    with pytest.raises(RuntimeError, match=r"the fused update's metrics \('a', 'b'\) are not "
                                           r"the keys announced for it, \('b', 'a'\)"):
        FusedUpdate(lambda phase: {"a": zero, "b": zero}, lambda phase: {"b": zero, "a": zero},
                    1, MetricSums(), CPU)


def test_replay_runs_the_update_s_phase_and_counts_its_metrics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "capture_graph", capture_by_running)
    ran: list[int] = []
    values = [torch.tensor(float(phase)) for phase in range(3)]

    def record(phase: int) -> dict[str, torch.Tensor]:
        ran.append(phase)
        return {"x": values[phase]} if phase else {"x": values[0], "y": values[0] + 10}

    def announced(phase: int) -> dict[str, torch.Tensor]:
        return {"x": values[0]} if phase else {"x": values[0], "y": values[0]}

    sums = MetricSums()
    update = FusedUpdate(record, announced, 3, sums, CPU)
    assert ran == [0, 1, 2]  # one capture per phase
    for total in sums._sums.values():  # the stand-in capture ran the adds once: undo them
        total.zero_()
    for number in range(7):
        update.replay(number)
    assert ran == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    # x: phases 0, 1, 2, 0, 1, 2, 0; y: phase 0 (three times)
    assert sums.take() == {"x": pytest.approx(6 / 7), "y": pytest.approx(10.0)}
