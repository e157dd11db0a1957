"""The off-policy learner on the CPU: building, updating from the buffer, the schedule run
through real updates, the metrics it adds, its counters, its checkpoint state and the plan's
fallbacks when a step cannot be compiled or captured."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fakes import (
    CPU,
    ROWS,
    FixedActor,
    FixedDeterministicActor,
    LinearCritic,
    assert_same_learning_state,
    buffer_of,
    built_learner,
    counting_buffer,
    cpu_plan,
)

from rl_graphstep.algorithms.base import OffPolicyAlgorithm
from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.algorithms.td3 import TD3
from rl_graphstep.core.errors import CaptureError, CompileError
from rl_graphstep.graphstep import EagerAdaptationStep
from rl_graphstep.learners import offpolicy
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.learners.offpolicy import OffPolicyLearner
from rl_graphstep.settings.config import Config


def make(kind: type[OffPolicyAlgorithm] = SAC, **overrides: object) -> OffPolicyAlgorithm:
    cfg = Config(**{"alpha": 0.5, "gamma": 0.9, "tau": 0.1, "batch_size": 2, **overrides})
    actor = FixedActor() if kind is SAC else FixedDeterministicActor()
    return kind(actor, LinearCritic(), cfg, action_size=1, device=CPU)


def test_build_runs_no_update_and_consumes_no_random_numbers() -> None:
    sac = make(batch_size=8)
    learner = OffPolicyLearner(sac, counting_buffer(), sac.cfg, cpu_plan())
    assert not learner.built
    critic = [p.detach().clone() for p in sac.critic.parameters()]
    torch.manual_seed(3)
    expected = torch.rand(())
    torch.manual_seed(3)
    plan = learner.build(MetricSums())
    assert torch.rand(()) == expected
    assert learner.built and learner.updates == 0 and plan == cpu_plan()
    assert all(torch.equal(p, q) for p, q in zip(sac.critic.parameters(), critic, strict=True))
    assert isinstance(learner.critic_step, EagerAdaptationStep)
    assert isinstance(learner.actor_step, EagerAdaptationStep)
    assert learner.fused is None  # no CUDA graphs: the steps replay one by one


def test_build_needs_a_batch_in_the_buffer() -> None:
    sac = make(batch_size=8)
    learner = OffPolicyLearner(sac, counting_buffer(rows=7), sac.cfg, cpu_plan())
    with pytest.raises(RuntimeError, match=r"the replay buffer holds 7 rows, fewer than one "
                                           r"batch \(8\)"):
        learner.build(MetricSums())
    assert not learner.built


def test_an_update_learns_from_a_replay_sample_of_the_buffer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler writes the drawn rows into the steps' buffers: steered to draw ROWS in
    order, the logged critic loss is the algorithm's loss on ROWS before the update."""
    sac, sums = make(), MetricSums()
    buffer = buffer_of(ROWS)
    learner = built_learner(sac, buffer, sums)
    drawn: list[int] = []

    def in_order(batch_size: int, *, out: torch.Tensor) -> torch.Tensor:
        drawn.append(batch_size)
        return out.copy_(buffer.storage)

    monkeypatch.setattr(buffer, "sample", in_order)
    with torch.no_grad():
        q_values = sac.critic(ROWS[:, :2], ROWS[:, 2:3])
        expected, _ = sac.critic_loss(q_values, buffer.layout.split_targets(ROWS[:, 3:]))
    critic_before = sac.critic.c.detach().clone()
    learner.update()
    assert drawn == [2] and learner.updates == 1
    assert sums.take()["losses/critic"] == pytest.approx(expected.item(), rel=1e-6)
    assert not torch.equal(sac.critic.c, critic_before)
    torch.testing.assert_close(learner.critic_step.static_inputs, ROWS[:, :3], rtol=0, atol=0)
    torch.testing.assert_close(learner.actor_step.static_inputs, ROWS[:, :2], rtol=0, atol=0)


def test_each_update_draws_a_fresh_sample() -> None:
    sac = make(batch_size=8)
    learner = built_learner(sac, counting_buffer())
    samples = []
    for _ in range(3):
        learner.update()
        samples.append(learner.critic_step.static_inputs.clone())
        index = samples[-1][:, 0].long()
        torch.testing.assert_close(samples[-1], learner.buffer.storage[index, :3])
    assert not torch.equal(samples[0], samples[1]) and not torch.equal(samples[1], samples[2])


@pytest.mark.parametrize(("kind", "overrides", "actor_steps"), [
    (SAC, {"policy_frequency": 2}, [2, 0, 2, 0, 2, 0, 2]),
    (SAC, {"policy_frequency": 3, "target_network_frequency": 2}, [3, 0, 0, 3, 0, 0, 3]),
    (TD3, {"policy_frequency": 3}, [1, 0, 0, 1, 0, 0, 1]),
])
def test_the_schedule_runs_through_real_updates(
        kind: type[OffPolicyAlgorithm], overrides: dict[str, int], actor_steps: list[int]
        ) -> None:
    algorithm, sums = make(kind, **overrides), MetricSums()
    learner = built_learner(algorithm, buffer_of(ROWS), sums)
    actor_state, critic_state = (learner.actor_optimizer.state[algorithm.actor.w],
                                 learner.critic_optimizer.state[algorithm.critic.c])
    made = []
    for update in range(len(actor_steps)):
        before = int(actor_state["step"]) if actor_state else 0
        learner.update()
        actor_state = learner.actor_optimizer.state[algorithm.actor.w]
        made.append(int(actor_state["step"]) - before)
        assert ("losses/actor" in sums.take()) is (actor_steps[update] > 0), f"update {update}"
        critic_state = learner.critic_optimizer.state[algorithm.critic.c]
        assert int(critic_state["step"]) == update + 1
    assert made == actor_steps
    assert learner.steps_made(len(actor_steps)) == {"critic": len(actor_steps),
                                                     "actor": sum(actor_steps)}


def test_steps_made_counts_whole_periods_and_the_rest() -> None:
    sac = OffPolicyLearner(make(policy_frequency=2), buffer_of(ROWS), Config(), cpu_plan())
    assert sac.steps_made(0) == {"critic": 0, "actor": 0}
    assert sac.steps_made(5) == {"critic": 5, "actor": 6}
    td3 = OffPolicyLearner(make(TD3, policy_frequency=3), buffer_of(ROWS), Config(), cpu_plan())
    assert td3.steps_made(7) == {"critic": 7, "actor": 3}
    assert td3.steps_made(1_000_000) == {"critic": 1_000_000, "actor": 333_334}


def test_updates_per_step_updates_add_their_metrics_into_the_sums() -> None:
    """One ``update()`` makes updates_per_step updates; each adds its metrics into the bound
    sums, the actor's only on the updates its schedule steps it."""
    sac, sums = make(updates_per_step=3, policy_frequency=2), MetricSums()
    learner = built_learner(sac, counting_buffer(), sums)
    learner.update()
    assert learner.updates == 3
    assert sums._calls == {
        ("losses/critic", "losses/critic_grad_norm", "losses/actor", "charts/alpha",
         "losses/alpha", "losses/actor_grad_norm"): 2,  # updates 0 and 2
        ("losses/critic", "losses/critic_grad_norm"): 1,
    }
    means = sums.take()
    assert set(means) == {"losses/critic", "losses/critic_grad_norm", "losses/actor",
                          "charts/alpha", "losses/alpha", "losses/actor_grad_norm"}
    assert all(np.isfinite(v) for v in means.values())
    assert means["losses/critic_grad_norm"] > 0
    learner.update()  # updates 3, 4, 5: the actor steps on update 4 only
    assert sums._calls[("losses/critic", "losses/critic_grad_norm")] == 2
    assert learner.updates == 6


def test_the_logged_metrics_are_each_updates_values() -> None:
    """The sums receive the update's own values (not the next update's rewrite of them)."""
    sac, sums = make(policy_frequency=1), MetricSums()
    learner = built_learner(sac, counting_buffer(), sums)
    for _ in range(3):
        learner.update()
        means = sums.take()
        assert means["losses/critic"] == learner.critic_step.static_loss.item()
        assert means["losses/actor"] == learner.actor_loss.values["losses/actor"].item()
        assert means["charts/alpha"] == pytest.approx(sac.alpha.item(), rel=1e-2)


def test_skipped_update_counters_count_non_finite_steps() -> None:
    sac = make()
    rows = ROWS.clone()
    rows[:, 3] = float("nan")  # NaN rewards: every critic loss is NaN
    learner = OffPolicyLearner(sac, buffer_of(rows), sac.cfg, cpu_plan())
    total, consecutive = learner.skipped_updates()
    assert (int(total), int(consecutive)) == (0, 0) and learner.skipped_steps() == {
        "critic": 0, "actor": 0}
    learner.build(MetricSums())
    critic = sac.critic.c.detach().clone()
    for _ in range(3):
        learner.update()
    assert learner.skipped_steps() == {"critic": 3, "actor": 0}
    total, consecutive = learner.skipped_updates()
    assert (int(total), int(consecutive)) == (3, 3)
    assert torch.equal(sac.critic.c, critic)  # skipped: the critic is as it was
    assert learner.updates == 3


def test_the_critic_gets_no_gradient_from_the_actor_update() -> None:
    sac = make()
    learner = built_learner(sac, buffer_of(ROWS))
    learner.update()
    critic_grad = sac.critic.c.grad
    critic_grad = None if critic_grad is None else critic_grad.clone()
    actor_before = sac.actor.w.detach().clone()
    learner.actor_step.replay()
    assert not torch.equal(sac.actor.w, actor_before)
    if critic_grad is None:
        assert sac.critic.c.grad is None
    else:
        assert torch.equal(sac.critic.c.grad, critic_grad)


@pytest.mark.parametrize("kind", [SAC, TD3])
def test_the_state_dict_has_the_checkpoint_keys_and_resumes_exactly(
        kind: type[OffPolicyAlgorithm]) -> None:
    buffer = counting_buffer()
    algorithm = make(kind, batch_size=4)
    learner = built_learner(algorithm, buffer)
    for _ in range(3):
        learner.update()
    # Deep-copied, as a checkpoint file holds it: a loaded optimizer would otherwise share
    # the live state tensors.
    state = copy.deepcopy(learner.state_dict())
    expected = {"actor", "critic", "target_critic", "actor_optimizer", "critic_optimizer",
                "updates", *(["log_alpha"] if kind is SAC else ["target_actor"])}
    assert set(state) == expected and state["updates"] == 3
    resumed_algorithm = make(kind, batch_size=4)
    resumed = OffPolicyLearner(resumed_algorithm, buffer, resumed_algorithm.cfg, cpu_plan())
    resumed.load_state_dict(state)
    resumed.build(MetricSums())
    assert_same_learning_state(resumed, learner)
    for each in (learner, resumed):
        torch.manual_seed(5)
        for _ in range(3):
            each.update()
    assert resumed.updates == 6
    assert_same_learning_state(resumed, learner)
    with pytest.raises(RuntimeError, match="before its steps are built"):
        resumed.load_state_dict(state)


def failing_steps(monkeypatch: pytest.MonkeyPatch, setting: str, error: Exception
                  ) -> list[tuple[bool, bool]]:
    """make_adaptation_step raising ``error`` whenever its ``setting`` (``"use_graph"`` or
    ``"compile"``) is on; returns the (use_graph, compile) calls."""
    real = offpolicy.make_adaptation_step
    calls = []

    def failing(*args: object, use_graph: bool, compile: bool, **kwargs: object):
        calls.append((use_graph, compile))
        if {"use_graph": use_graph, "compile": compile}[setting]:
            raise error
        return real(*args, use_graph=use_graph, compile=compile, **kwargs)

    monkeypatch.setattr(offpolicy, "make_adaptation_step", failing)
    return calls


def test_the_learner_runs_uncompiled_when_compiling_fails(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    calls = failing_steps(monkeypatch, "compile",
                          CompileError("could not compile the update of Critic: boom"))
    sac = make()
    learner = OffPolicyLearner(sac, buffer_of(ROWS), sac.cfg,
                               cpu_plan(compile=True, compile_fallback=True))
    with pytest.warns(UserWarning, match="boom; running the updates uncompiled instead"):
        plan = learner.build(MetricSums())
    assert plan.compile is False and learner.plan is plan
    assert calls == [(False, True), (False, False), (False, False)]
    assert sac.polyak._compiled is None  # nothing compiled
    learner.update()
    assert learner.updates == 1
    strict = make()
    learner = OffPolicyLearner(strict, buffer_of(ROWS), strict.cfg, cpu_plan(compile=True))
    with pytest.raises(CaptureError, match="boom"):
        learner.build(MetricSums())


def test_a_capture_failure_falls_back_to_eager_and_uncompiled(monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """A step that cannot be captured (not a compiler failure) keeps the compile setting
    out of it: with graph and compile both automatic, it runs eagerly and uncompiled."""
    calls = failing_steps(monkeypatch, "use_graph",
                          CaptureError("could not capture the update of Critic: a host sync"))
    sac = make()
    # As on CUDA with --graph auto --compile auto for a long run.
    plan = cpu_plan(graphs=True, compile=True, action_stream=True, graph_fallback=True,
                    compile_fallback=True)
    learner = OffPolicyLearner(sac, buffer_of(ROWS), sac.cfg, plan)
    with pytest.warns(UserWarning, match="a host sync; running the updates eagerly instead"):
        plan = learner.build(MetricSums())
    assert (plan.graphs, plan.compile, plan.action_stream) == (False, False, False)
    assert calls == [(True, True), (False, False), (False, False)]  # critic, then both eager
    assert learner.fused is None and learner.sampler.graph is None
    learner.update()
    assert learner.updates == 1
    strict = make()
    learner = OffPolicyLearner(strict, buffer_of(ROWS), strict.cfg, cpu_plan(graphs=True))
    with pytest.raises(CaptureError, match="a host sync"):
        learner.build(MetricSums())


@pytest.mark.parametrize("kind", [SAC, TD3])
@pytest.mark.parametrize("compile", [True, False])
def test_the_learner_compiles_the_target_update_with_its_steps(
        kind: type[OffPolicyAlgorithm], compile: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any graph could record it: the fused update graphs record the average."""
    real = torch.compile
    # The eager backend traces as the real one does but generates no code: fast on a CPU.
    monkeypatch.setattr(torch, "compile", lambda function, **_: real(function, backend="eager"))
    algorithm = make(kind)
    assert algorithm.polyak._compiled is None
    built_learner(algorithm, buffer_of(ROWS), plan=cpu_plan(compile=compile))
    assert (algorithm.polyak._compiled is not None) is compile


def test_adam_is_fused_and_capturable_only_on_cuda() -> None:
    learner = OffPolicyLearner(make(), buffer_of(ROWS), Config(), cpu_plan())
    for optimizer in (learner.actor_optimizer, learner.critic_optimizer):
        group = optimizer.param_groups[0]
        assert group["capturable"] is False and not group["fused"]
    assert [g["lr"] for g in learner.actor_optimizer.param_groups] == [
        Config().policy_lr, Config().q_lr]  # the actor and SAC's temperature



def test_weight_decay_makes_adamw_which_spares_the_temperature() -> None:
    plain = OffPolicyLearner(make(), buffer_of(ROWS), Config(), cpu_plan())
    assert type(plain.critic_optimizer) is torch.optim.Adam
    assert type(plain.actor_optimizer) is torch.optim.Adam
    sac = make(weight_decay=0.01)
    learner = OffPolicyLearner(sac, buffer_of(ROWS), sac.cfg, cpu_plan())
    assert type(learner.critic_optimizer) is torch.optim.AdamW
    assert type(learner.actor_optimizer) is torch.optim.AdamW
    assert [g["weight_decay"] for g in learner.critic_optimizer.param_groups] == [0.01]
    # The actor decayed; SAC's temperature, its second group, not.
    assert [g["weight_decay"] for g in learner.actor_optimizer.param_groups] == [0.01, 0.0]
    assert learner.actor_optimizer.param_groups[1]["params"] == [sac.log_alpha]
    td3 = make(TD3, weight_decay=0.01)
    learner = OffPolicyLearner(td3, buffer_of(ROWS), td3.cfg, cpu_plan())
    assert [g["weight_decay"] for g in learner.actor_optimizer.param_groups] == [0.01]


def test_a_weight_decayed_update_shrinks_the_weights_by_lr_times_decay() -> None:
    """AdamW's step is Adam's from weights first scaled by 1 - lr * wd: from the same
    weights and the same sample, the two first critic steps differ by exactly
    lr * wd * weight (the moments see the same gradient)."""
    results = {}
    for decay in (0.0, 0.5):
        sac = make(weight_decay=decay, q_lr=0.01, policy_frequency=2)
        learner = built_learner(sac, buffer_of(ROWS))
        before = sac.critic.c.detach().clone()  # (1, 2)
        torch.manual_seed(0)
        learner.update()
        results[decay] = sac.critic.c.detach().clone()
    torch.testing.assert_close(results[0.0] - results[0.5], 0.01 * 0.5 * before,
                               rtol=0, atol=1e-6)
    torch.testing.assert_close(results[0.0] - results[0.5], torch.tensor([0.005, 0.01]),
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize(("saved", "resumed"), [(0.01, 0.1), (0.0, 0.1), (0.1, 0.0)])
def test_a_resume_applies_its_own_weight_decay_with_the_checkpoints_moments(
        saved: float, resumed: float) -> None:
    """The config's optimizer settings win over the checkpoint's (its moments and step
    counts are the run's), also between Adam and AdamW."""
    buffer = counting_buffer()
    algorithm = make(batch_size=4, weight_decay=saved)
    learner = built_learner(algorithm, buffer)
    for _ in range(3):
        learner.update()
    state = copy.deepcopy(learner.state_dict())
    again = make(batch_size=4, weight_decay=resumed)
    loaded = OffPolicyLearner(again, buffer, again.cfg, cpu_plan())
    loaded.load_state_dict(copy.deepcopy(state))  # a loaded optimizer shares its tensors
    assert [g["weight_decay"] for g in loaded.critic_optimizer.param_groups] == [resumed]
    assert [g["weight_decay"] for g in loaded.actor_optimizer.param_groups] == [resumed, 0.0]
    for name in ("critic_optimizer", "actor_optimizer"):
        optimizer = getattr(loaded, name)
        moments = [optimizer.state[p] for g in optimizer.param_groups for p in g["params"]]
        saved_moments = [state[name]["state"][i] for i in range(len(moments))]
        for ours, theirs in zip(moments, saved_moments, strict=True):
            assert all(torch.equal(ours[key], theirs[key])
                       for key in ("step", "exp_avg", "exp_avg_sq"))
    loaded.build(MetricSums())
    before = again.critic.c.detach().clone()
    torch.manual_seed(5)
    loaded.update()
    # The next step decays by the resumed value: against the same learner resumed without
    # decay, the weights differ by lr * wd * weight.
    undecayed = make(batch_size=4, weight_decay=0.0)
    reference = OffPolicyLearner(undecayed, buffer, undecayed.cfg, cpu_plan())
    reference.load_state_dict(state)
    reference.build(MetricSums())
    torch.manual_seed(5)
    reference.update()
    torch.testing.assert_close(undecayed.critic.c - again.critic.c,
                               again.cfg.q_lr * resumed * before, rtol=0, atol=1e-7)


def test_the_steps_learn_from_normalised_observations() -> None:
    """--obs-norm on the CPU: each update's batch reaches the steps normalised by the
    statistics as they are at that update; the buffer keeps its rows raw."""
    from rl_graphstep.data.buffer import ReplayBuffer
    from rl_graphstep.data.normalizer import ObservationNormalizer

    normalizer = ObservationNormalizer(1, 2, "cpu")
    buffer = ReplayBuffer(100, 2, 1, "cpu", normalizer=normalizer)
    index = np.arange(50, dtype=np.float32)
    observations = np.stack([index, -3 * index], 1)
    buffer.add(observations, index[:, None] / 100, index, observations + 0.5, index % 7 == 0)
    raw = buffer.storage.clone()
    made = built_learner(make(batch_size=16), buffer)
    for batch in (observations, observations * 4):
        normalizer.update(batch)
        made.update()
        inputs, targets = made.critic_step.static_inputs, made.critic_step.static_targets
        rows = raw[torch.round(inputs[:, 2] * 100).long()]  # the action column: raw index
        assert torch.equal(inputs[:, :2], normalizer.normalize(rows[:, :2]))
        assert torch.equal(targets[:, 2:], normalizer.normalize(rows[:, 5:]))
        assert torch.equal(made.actor_step.static_inputs, inputs[:, :2])
    assert torch.equal(buffer.storage, raw)
