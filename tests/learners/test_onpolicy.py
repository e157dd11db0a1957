"""The on-policy learner on the CPU (eager twins): minibatches partition the rollout each
epoch, K seeds learn independently, a bandit is learned, the target-KL stop freezes a seed
for the rest of the update with no host sync, and a checkpoint resumes exactly."""

from __future__ import annotations

import copy
import dataclasses
import itertools

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

from rl_graphstep.core import compiling, guards
from rl_graphstep.core.errors import CaptureError
from rl_graphstep.core.gatedadam import GatedAdam
from rl_graphstep.learners import onpolicy, rolloutacting
from rl_graphstep.networks.policies import ActionEvaluation


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def differs(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return any(not torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("seeds", [1, 2])
def test_each_epoch_partitions_the_rollout_into_its_minibatches(seeds: int) -> None:
    learner, _ = make_learner(seeds, update_epochs=3)
    rollout = learner.rollout
    rows = rollout.num_steps * rollout.num_envs
    fill_bandit(learner, seed=1)
    # Each row's observation column 0 becomes its index in the flat rollout.
    rollout.rows[..., 0] = torch.arange(rows, dtype=torch.float32).view(
        rollout.num_steps, rollout.num_envs)
    gathered = []
    gather = learner._gather

    def recording_gather() -> None:
        gather()
        gathered.append(learner.batch[..., 0].clone())

    learner._gather = recording_gather  # type: ignore[method-assign]
    learner.update(next_values(learner))
    assert len(gathered) == 3 * 4 and gathered[0].shape == (seeds, rows // 4)
    epochs = [torch.cat(gathered[e * 4:(e + 1) * 4], dim=1) for e in range(3)]
    for epoch in epochs:
        for k in range(seeds):  # every row exactly once, in each seed
            assert sorted(epoch[k].long().tolist()) == list(range(rows))
    assert not torch.equal(epochs[0], epochs[1])  # a fresh permutation per epoch
    if seeds == 2:
        assert not torch.equal(epochs[0][0], epochs[0][1])  # and per seed


def test_a_change_in_one_seeds_rollout_changes_no_other_seeds_update() -> None:
    results = []
    for scale in (1.0, 5.0):
        learner, _ = make_learner(2)
        fill_bandit(learner, seed=3, reward_scale=torch.tensor([1.0, scale]))
        torch.manual_seed(7)
        learner.update(next_values(learner))
        results.append([p.detach().clone() for p in parameters(learner)])
    same, changed = results
    assert_same([p[0] for p in same], [p[0] for p in changed])  # seed 0, bit for bit
    assert differs([p[1] for p in same], [p[1] for p in changed])  # seed 1 saw other rewards


def test_the_learner_learns_the_bandit() -> None:
    learner, sums = make_learner()
    rewards = []
    for iteration in range(20):
        rewards.append(fill_bandit(learner, seed=100 + iteration))
        learner.update(next_values(learner))
    metrics = sums.take()
    # E[-(a - o)^2] with a ~ N(mean, 1) starts near -(1 + E[o^2]) = -1.33; the mean moves
    # onto o and the std shrinks.
    assert rewards[0] < -1.0
    assert sum(rewards[-3:]) / 3 > -0.5
    assert learner.updates == 20
    assert set(metrics) >= {"losses/policy_loss", "losses/value_loss", "losses/entropy",
                            "losses/approx_kl", "losses/old_approx_kl", "losses/clipfrac",
                            "losses/explained_variance", "charts/learning_rate",
                            "losses/actor_grad_norm", "losses/critic_grad_norm"}
    # the rate annealed over the 40 rollouts of the run: the mean of updates 0..19's
    assert metrics["charts/learning_rate"] == pytest.approx(3e-3 * (1 - 9.5 / 40))


def test_the_learner_learns_a_discrete_bandit_with_a_categorical_actor() -> None:
    """Three actions, reward 1 for action 2 alone: its probability grows from a third."""
    learner, _ = make_learner(discrete=3, learning_rate=1e-2)
    rollout, shares = learner.rollout, []
    for update in range(10):
        torch.manual_seed(update)
        for _ in range(rollout.num_steps):
            observations = torch.rand(rollout.num_envs, 2)
            actions, log_probs, values = learner.act(observations)
            rewards = (actions[:, 0] == 2).float()
            done, zeros = torch.ones(rollout.num_envs), torch.zeros(rollout.num_envs)
            rollout.add(observations, actions, log_probs, values, rewards, done, zeros, zeros)
        shares.append(rollout.actions.eq(2).float().mean().item())
        learner.update(next_values(learner))
    assert shares[0] < 0.5
    assert sum(shares[-3:]) / 3 > 0.8


def epoch_snapshots(target_kl: float | None, monkeypatch: pytest.MonkeyPatch | None = None
                    ) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]], object]:
    """The parameters and optimizer state before the update and after each of 4 epochs."""
    learner, _ = make_learner(update_epochs=4, target_kl=target_kl)
    fill_bandit(learner, seed=1)
    snapshots, states = [parameters(learner)], [optimizer_state(learner)]
    minibatch = learner._minibatch
    count = 0

    def counting_minibatch() -> None:
        nonlocal count
        minibatch()
        count += 1
        if count % learner.cfg.num_minibatches == 0:  # an epoch's last
            snapshots.append(parameters(learner))
            states.append(optimizer_state(learner))

    learner._minibatch = counting_minibatch  # type: ignore[method-assign]
    if monkeypatch is not None:
        forbid_host_syncs(monkeypatch)
    learner.update(next_values(learner))
    return snapshots, states, learner


@pytest.mark.parametrize("seeds", [1, 2])
def test_the_critic_is_clipped_by_one_norm_over_both_networks_as_cleanrl_does(
        seeds: int) -> None:
    """CleanRL clips the actor's and the critic's gradients by one ``clip_grad_norm_`` over
    both; the critic step, run after the actor step, reads the actor's norm and matches it,
    per seed. The actor, clipped first, by its own norm."""
    learner, _ = make_learner(seeds, num_minibatches=1, update_epochs=1, max_grad_norm=0.05)
    actor, critic = (copy.deepcopy(net) for net in (learner.algorithm.actor,
                                                    learner.algorithm.critic))
    fill_bandit(learner, seed=2)
    learner.update(next_values(learner))
    assert learner.critic_step is not None and learner.actor_step is not None
    size = learner.rollout.layout.observation_size
    learner.value_loss(critic(learner.critic_step.static_inputs),
                       learner.critic_step.static_targets).sum().backward()
    learner.policy_loss(ActionEvaluation(actor, size)(learner.actor_step.static_inputs),
                        learner.actor_step.static_targets).sum().backward()
    actor_params, critic_params = list(actor.parameters()), list(critic.parameters())
    for k in range(seeds):  # CleanRL's clip on seed k's slices of both networks alone
        pick = (lambda g: g) if seeds == 1 else (lambda g, k=k: g[k])
        both = [torch.zeros_like(pick(p), requires_grad=True)
                for p in actor_params + critic_params]
        for tensor, p in zip(both, actor_params + critic_params, strict=True):
            tensor.grad = pick(p.grad).clone()
        joint = torch.nn.utils.clip_grad_norm_(both, 0.05)
        own = torch.nn.utils.clip_grad_norm_([pick(p.grad).clone().requires_grad_()
                                              for p in critic_params], float("inf"))
        assert joint > 0.05 and own < joint  # the joint clip acts beyond the critic's own
        torch.testing.assert_close(pick(learner.critic_clip.norm), joint)
        for mine, theirs in zip(learner.algorithm.critic.parameters(),
                                both[len(actor_params):], strict=True):
            torch.testing.assert_close(pick(mine.grad), theirs.grad)
        scale = min(1.0, 0.05 / (float(pick(learner.actor_clip.norm)) + 1e-6))
        for mine, raw in zip(learner.algorithm.actor.parameters(), actor_params, strict=True):
            torch.testing.assert_close(pick(mine.grad), pick(raw.grad) * scale)


def test_without_target_kl_every_epoch_changes_the_networks() -> None:
    snapshots, _, learner = epoch_snapshots(None)
    assert not isinstance(learner.actor_optimizer, GatedAdam)
    for before, after in itertools.pairwise(snapshots):
        assert differs(before, after)


def test_the_target_kl_stop_holds_the_remaining_epochs() -> None:
    """Epoch 1 ends with approx_kl above the (tiny) target: its updates stand, and the 3
    epochs after it leave parameters and Adam moments exactly as they are; the logged means
    count epoch 1's minibatches alone."""
    snapshots, states, learner = epoch_snapshots(1e-9)
    assert isinstance(learner.actor_optimizer, GatedAdam)
    assert differs(snapshots[0], snapshots[1])
    for later, later_state in zip(snapshots[2:], states[2:], strict=True):
        assert_same(snapshots[1], later)
        assert_same(states[1], later_state)
    assert learner.gate is not None and learner.gate.item() == 0.0
    assert learner._counted.item() == learner.cfg.num_minibatches


def forbid_host_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way a tensor's value reaches Python raises: the CPU's stand-in for CUDA's sync
    check. The guard's CPU-only shortcut (``bool(keep.all())``, eager CPU alone) is set as
    it is on the GPU, where it never runs."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a tensor's value was read on the host")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    monkeypatch.setattr(guards, "_nothing_to_undo", lambda keep: False)


def test_the_target_kl_path_reads_nothing_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The update with the stop (GAE, epochs, the gate, the metrics) reads no tensor's value:
    Tensor.item, tolist, bool, float, int and numpy raise throughout it."""
    snapshots, _, learner = epoch_snapshots(1e-9, monkeypatch)
    monkeypatch.undo()
    assert learner.gate is not None and learner.gate.item() == 0.0
    assert_same(snapshots[1], snapshots[-1])


def test_the_stop_is_per_seed() -> None:
    """A seed whose approx_kl exceeds the target stops; the other goes on stepping."""
    learner, _ = make_learner(2, target_kl=0.01)
    fill_bandit(learner, seed=2)
    learner.rollout.compute_advantages(next_values(learner), 0.99, 0.95)
    learner.policy_loss.values["losses/approx_kl"].copy_(torch.tensor([0.5, 0.001]))
    learner._check_kl(0.01)
    assert learner.gate is not None and learner.gate.tolist() == [0.0, 1.0]
    before = parameters(learner)
    learner._draw_permutation()
    learner._minibatch()
    after = parameters(learner)
    assert_same([p[0] for p in before], [p[0] for p in after])
    assert differs([p[1] for p in before], [p[1] for p in after])


def test_a_resumed_learner_continues_exactly() -> None:
    straight, _ = make_learner()
    for update in range(2):
        fill_bandit(straight, seed=update)
        torch.manual_seed(50 + update)
        straight.update(next_values(straight))

    first, _ = make_learner()
    fill_bandit(first, seed=0)
    torch.manual_seed(50)
    first.update(next_values(first))
    resumed, _ = make_learner(state=first.state_dict())
    assert resumed.updates == 1
    # The annealing still reaches both optimizers: they read the learner's rate tensor.
    for optimizer in (resumed.actor_optimizer, resumed.critic_optimizer):
        assert optimizer.param_groups[0]["lr"] is resumed.lr
    fill_bandit(resumed, seed=1)
    torch.manual_seed(51)
    resumed.update(next_values(resumed))
    assert resumed.lr.item() == pytest.approx(3e-3 * (1 - 1 / 40))
    assert_same(parameters(straight), parameters(resumed))
    assert_same(optimizer_state(straight), optimizer_state(resumed))


def test_state_loads_only_before_build() -> None:
    learner, _ = make_learner()
    with pytest.raises(RuntimeError, match="before its steps are built"):
        learner.load_state_dict(learner.state_dict())


@pytest.mark.parametrize(("seeds", "discrete"), [(1, 0), (3, 0), (2, 3)],
                         ids=["one", "seeds", "discrete"])
def test_acting_fills_the_rows_with_what_it_returns(seeds: int, discrete: int) -> None:
    check_acting(make_learner(seeds, discrete=discrete)[0])


@pytest.mark.parametrize("seeds", [1, 2])
def test_acting_brings_the_statistics_it_normalises_with(seeds: int) -> None:
    check_staged_statistics(make_learner(seeds, obs_norm=True)[0])


def compiled_acting(learner: onpolicy.OnPolicyLearner) -> bool:
    return learner._act_on_device != learner._act_and_write


@pytest.mark.parametrize(("seeds", "discrete"), [(1, 0), (2, 0), (2, 3)],
                         ids=["one", "seeds", "discrete"])
def test_compiled_acting_fills_the_rows_with_what_it_returns(seeds: int, discrete: int) -> None:
    learner = make_learner(seeds, discrete=discrete, compile=True)[0]
    assert compiled_acting(learner)
    check_acting(learner)


@pytest.mark.parametrize("seeds", [1, 2])
def test_compiled_acting_brings_the_statistics_it_normalises_with(seeds: int) -> None:
    learner = make_learner(seeds, obs_norm=True, compile=True)[0]
    assert compiled_acting(learner)
    check_staged_statistics(learner)


def test_compiled_acting_is_compiled_once() -> None:
    """Built as it is called (without gradients): a rollout of actions compiles nothing more."""
    learner = make_learner(seeds=2, obs_norm=True, compile=True)[0]
    with torch._dynamo.config.patch(error_on_recompile=True):
        check_staged_statistics(learner)


def test_compiling_the_acting_draws_nothing_and_resets_the_step_counter() -> None:
    """The compiler's one call samples and writes a row: the generator comes back to where
    an uncompiled build leaves it, and the step counter to the first row."""
    learner = make_learner(compile=True)[0]
    compiled_state = torch.get_rng_state()
    plain = make_learner()[0]
    assert compiled_acting(learner) and not compiled_acting(plain)
    assert torch.equal(compiled_state, torch.get_rng_state())
    assert int(learner.rollout.position) == 0


def test_acting_the_compiler_fails_on_runs_uncompiled_with_one_warning(monkeypatch) -> None:
    def failing(function):
        def call(*args):
            raise RuntimeError("backend exploded")
        return call

    monkeypatch.setattr(compiling, "compile_static", failing)
    with pytest.warns(UserWarning, match=r"torch.compile failed on PPO's acting "
                                         r"\(RuntimeError: backend exploded\)"):
        learner = make_learner(compile=False)[0]
        learner.plan = dataclasses.replace(learner.plan, compile=True)
        learner._build_acting()
    assert not compiled_acting(learner)
    check_acting(learner)


def test_compiled_acting_that_will_not_capture_is_captured_uncompiled(monkeypatch) -> None:
    """Where the compiled kernels cannot be captured, the plain ones are, with one warning
    that says so (the capture itself is faked: this runs on the CPU)."""
    learner = make_learner(compile=True)[0]
    sentinel = object()

    def capture(function, device, *, what, **kwargs):
        if compiled_acting(learner):
            raise CaptureError(f"{what} could not be captured: a fake failure")
        return sentinel, None

    monkeypatch.setattr(rolloutacting, "capture_graph", capture)
    learner.plan = dataclasses.replace(learner.plan, graphs=True)
    with pytest.warns(UserWarning) as warned:
        learner._build_acting()
    assert [str(w.message) for w in warned] == [
        "PPO's acting could not be captured: a fake failure; capturing it uncompiled"]
    assert learner.acting_graph is sentinel and not compiled_acting(learner)
