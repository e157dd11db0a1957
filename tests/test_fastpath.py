"""The training loop's fast path on the CPU: sampling straight into the steps' static buffers,
the action pipe, several updates per step, async envs and the new flags."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import (
    ROWS,
    FixedActor,
    FixedDeterministicActor,
    LinearCritic,
    assert_same_learning_state,
)

from rl_graphstep.acting import ActionPipe
from rl_graphstep.algorithms import base
from rl_graphstep.algorithms.base import ActorCritic
from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.algorithms.td3 import TD3
from rl_graphstep.buffer import BatchSampler, ReplayBuffer
from rl_graphstep.compiling import (
    COMPILE_SECONDS,
    SAVED_SECONDS_PER_UPDATE,
    compile_pays,
    updates_ahead,
)
from rl_graphstep.config import Config
from rl_graphstep.envs import EnvStepper, EpisodeStatistics, make_vec_env, scale_action
from rl_graphstep.errors import CaptureError, ConfigError
from rl_graphstep.flags import load_config
from rl_graphstep.graphstep import EagerAdaptationStep
from rl_graphstep.metrics import MetricSums
from rl_graphstep.train import main, resolve_compile, train

CPU = torch.device("cpu")


def filled_buffer(rows: int = 50) -> ReplayBuffer:
    buffer = ReplayBuffer(100, 2, 1, CPU)
    index = np.arange(rows, dtype=np.float32)
    buffer.add(np.stack([index, -index], 1), index[:, None] / 100, index, np.stack(
        [index + 0.5, index - 0.5], 1), index % 7 == 0)
    return buffer


def test_sampler_writes_column_slices_of_buffer_rows() -> None:
    buffer = filled_buffer()
    head, tail = torch.zeros(64, 3), torch.zeros(64, 4)
    sampler = BatchSampler(buffer, 64, [(head, slice(0, 3)), (tail, slice(3, None))])
    sampler()
    rows = torch.cat([head, tail], 1)
    # Every sampled row is a stored row, whole (the two outputs come from the same draw).
    index = rows[:, 0].long()
    assert index.min() >= 0 and index.max() < 50
    torch.testing.assert_close(rows, buffer.storage[index])
    first = rows.clone()
    sampler()
    assert not torch.equal(torch.cat([head, tail], 1), first)  # a fresh draw each call


def test_sampler_reads_the_current_fill_level() -> None:
    buffer = filled_buffer(rows=10)
    out = torch.zeros(512, 1)
    sampler = BatchSampler(buffer, 512, [(out, slice(0, 1))])
    sampler()
    assert out.max() <= 9
    index = np.arange(10, 60, dtype=np.float32)
    buffer.add(np.stack([index, -index], 1), np.zeros((50, 1)), index, np.zeros((50, 2)),
               np.zeros(50, bool))
    sampler()
    assert out.max() > 9 and out.max() < 60  # rows added after the sampler was built


def test_sampler_refuses_mismatched_outputs_and_empty_buffers() -> None:
    with pytest.raises(ValueError, match=r"shape \(8, 2\) on cpu does not match its columns, "
                                         r"\(8, 3\)"):
        BatchSampler(filled_buffer(), 8, [(torch.zeros(8, 2), slice(0, 3))])
    with pytest.raises(RuntimeError, match="empty replay buffer"):
        BatchSampler(ReplayBuffer(10, 2, 1, CPU), 8, [(torch.zeros(8, 3), slice(0, 3))])


def make_sac(compile: bool | None = False, **overrides: object) -> SAC:
    cfg = Config(**{"alpha": 0.5, "gamma": 0.9, "tau": 0.1, "batch_size": 2, **overrides})
    return SAC(FixedActor(), LinearCritic(), cfg, observation_size=2, action_size=1,
               device=CPU, compile=compile)


def test_update_from_a_buffer_equals_update_on_the_same_rows() -> None:
    """The fast path (sample into the static buffers, replay) and the general one (copy the
    given rows in, replay) run the same update."""
    buffer = ReplayBuffer(2, 2, 1, CPU)
    buffer.add(ROWS[:, :2], ROWS[:, 2:3], ROWS[:, 3], ROWS[:, 5:], 1 - ROWS[:, 4])
    fast, general = make_sac(), make_sac()
    fast.build(buffer)
    # Steer the draw to the rows in order: the sampler then feeds exactly ROWS.
    fast.sampler.buffer.sample = lambda n, out: out.copy_(buffer.storage)
    for _ in range(3):
        torch.manual_seed(0)
        a = fast.update_from(buffer)
        torch.manual_seed(0)
        b = general.update(buffer.storage.clone())
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key])
    for p, q in zip(fast.critic.parameters(), general.critic.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    assert fast.updates == general.updates == 3


class ReplayedCall:
    """A stand-in for a captured graph on the CPU: each replay runs the recorded call with
    the agent's update count at its capture-time value (what the captured kernels saw), and
    updates the metrics dict it returned at capture."""

    def __init__(self, agent: ActorCritic, function: Callable[[], dict[str, torch.Tensor]]
                 ) -> None:
        self.agent, self.function, self.phase = agent, function, agent.updates
        self.metrics: dict[str, torch.Tensor] = {}

    def replay(self) -> None:
        updates, self.agent.updates = self.agent.updates, self.phase
        try:
            self.metrics.update(self.function())
        finally:
            self.agent.updates = updates


@pytest.mark.parametrize(("kind", "overrides", "phases"), [
    (SAC, {}, 2),
    (SAC, {"policy_frequency": 1, "target_network_frequency": 3}, 3),
    (TD3, {"policy_frequency": 3}, 3),
])
def test_fused_updates_run_each_phase_of_the_schedule_like_separate_replays(
        kind: type[ActorCritic], overrides: dict[str, int], phases: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = filled_buffer()
    cfg = Config(**{"gamma": 0.9, "tau": 0.1, "batch_size": 4, **overrides})
    actor = FixedActor if kind is SAC else FixedDeterministicActor
    agents = [kind(actor(), LinearCritic(), cfg, observation_size=2, action_size=1, device=CPU)
              for _ in range(2)]
    for agent in agents:
        agent.build(buffer)
    separate, fused = agents
    # What build does with CUDA graphs, recorded calls standing in for the graphs.
    calls: list[ReplayedCall] = []

    def capture(function: Callable, device: torch.device, **_: object) -> tuple:
        calls.append(ReplayedCall(fused, function))
        return calls[-1], calls[-1].metrics

    monkeypatch.setattr(base, "capture_graph", capture)
    fused.fused_updates = fused._capture_fused_updates(fused.update_period())
    assert [c.phase for c in calls] == list(range(phases)) and fused.updates == 0
    for update in range(2 * phases + 1):
        metrics = []
        for agent in agents:
            torch.manual_seed(update)
            metrics.append({k: v.clone() for k, v in agent.update_from(buffer).items()})
        assert metrics[0].keys() == metrics[1].keys(), f"update {update}"
        for key in metrics[0]:
            torch.testing.assert_close(metrics[1][key], metrics[0][key], rtol=0, atol=0)
    assert separate.updates == fused.updates == 2 * phases + 1
    assert_same_learning_state(fused, separate)


def test_fused_updates_add_their_metrics_into_the_bound_sums_as_separate_replays_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound sums: the separate replays add each update's metrics after it, the fused
    graphs add them inside (recorded once a first capture has named them) and only count on
    the host; the interval means come out the same, to the bit."""
    buffer = filled_buffer()
    cfg = Config(gamma=0.9, tau=0.1, batch_size=4)
    agents = [SAC(FixedActor(), LinearCritic(), cfg, observation_size=2, action_size=1,
                  device=CPU) for _ in range(2)]
    sums = [MetricSums(), MetricSums()]
    for agent, bound in zip(agents, sums, strict=True):
        agent.build(buffer, metrics=bound)
    separate, fused = agents

    def capture(function: Callable, device: torch.device, **_: object) -> tuple:
        # A real capture records without running; here the call runs once for its metrics,
        # and everything it changed is put back.
        parts = {name: copy.deepcopy(part if isinstance(part, torch.Tensor)
                                     else part.state_dict())
                 for name, part in fused.checkpointed().items()}
        totals = {k: t.clone() for k, t in sums[1]._sums.items()}
        rng = torch.get_rng_state()
        call = ReplayedCall(fused, function)
        call.replay()
        torch.set_rng_state(rng)
        for name, part in fused.checkpointed().items():
            if isinstance(part, torch.Tensor):
                part.detach().copy_(parts[name])
            else:
                part.load_state_dict(parts[name])
        for key, total in totals.items():
            sums[1]._sums[key].copy_(total)
        return call, call.metrics

    monkeypatch.setattr(base, "capture_graph", capture)
    fused.fused_updates = fused._capture_fused_updates(fused.update_period())
    assert [f.adds_into for f in fused.fused_updates] == [sums[1], sums[1]]
    assert [len(f.keys) for f in fused.fused_updates] == [6, 2]  # actor metrics in phase 0
    for interval in range(3):
        for update in range(5):
            for agent in agents:
                torch.manual_seed(10 * interval + update)
                agent.update_from(buffer)
        means = [bound.take() for bound in sums]
        assert means[1] == means[0] and len(means[0]) == 6, f"interval {interval}"
    assert_same_learning_state(fused, separate)


def test_a_fused_update_that_cannot_be_captured_leaves_the_separate_graphs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = filled_buffer()
    sac = make_sac(batch_size=4)
    sac.build(buffer)
    # As if on CUDA (the steps stay the eager twins here), with the fused capture failing.
    sac.use_graph, sac.sampler = True, None
    monkeypatch.setattr(base, "BatchSampler", lambda *args, use_graph: BatchSampler(*args))

    def fails(function: Callable, device: torch.device, *, what: str, **_: object) -> None:
        raise CaptureError(f"could not capture {what}: RuntimeError: boom")

    monkeypatch.setattr(base, "capture_graph", fails)
    with pytest.warns(UserWarning, match=r"could not capture the fused update \(phase 0\): "
                                         "RuntimeError: boom; replaying the separate step "
                                         "graphs instead"):
        sac.build(buffer)
    assert sac.fused_updates is None and sac.sampler is not None
    assert "losses/critic" in sac.update_from(buffer) and sac.updates == 1


def test_update_checks_the_batch_size() -> None:
    sac = make_sac()
    sac.update(ROWS)
    with pytest.raises(ValueError, match="rows has 3 rows, the steps were built for 2"):
        sac.update(torch.cat([ROWS, ROWS[:1]]))


def test_build_runs_no_update_and_consumes_no_random_numbers() -> None:
    buffer = filled_buffer()
    sac = make_sac(batch_size=8)
    critic = [p.detach().clone() for p in sac.critic.parameters()]
    torch.manual_seed(3)
    expected = torch.rand(())
    torch.manual_seed(3)
    sac.build(buffer)
    assert torch.rand(()) == expected
    assert sac.updates == 0
    assert all(torch.equal(p, q) for p, q in zip(sac.critic.parameters(), critic, strict=True))
    assert isinstance(sac.critic_step, EagerAdaptationStep)


def test_action_pipe_returns_the_policy_actions_and_their_env_scaling() -> None:
    space = gym.spaces.Box(np.array([-2.0]), np.array([6.0]), dtype=np.float32)
    pipe = ActionPipe(lambda obs: (obs[:, :1] * 0.5).clamp(-1, 1), 3, 2, space, CPU)
    observations = np.array([[1.0, 0.0], [2.0, 0.0], [-1.5, 0.0]], np.float32)
    pipe.request(observations)
    actions, env_actions = pipe.wait()
    np.testing.assert_array_equal(actions, [[0.5], [1.0], [-0.75]])
    np.testing.assert_allclose(env_actions, [[4.0], [6.0], [-1.0]])
    # The scaling is the host's scale_action, to the last bit.
    np.testing.assert_array_equal(env_actions, scale_action(actions, space.low, space.high))
    pipe.request(observations * 0)
    np.testing.assert_array_equal(actions, [[0.5], [1.0], [-0.75]])  # copies, not views
    np.testing.assert_array_equal(pipe.wait()[0], np.zeros((3, 1)))
    with pytest.raises(RuntimeError, match=r"wait\(\) without a request"):
        pipe.wait()


class NoisyFixedActor(FixedActor):
    """FixedActor with a ``sample`` that takes its standard normal noise from the caller."""

    def sample(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        noise = torch.randn(len(obs), 1) if noise is None else noise
        return torch.tanh(self.w * obs[:, :1] + noise)


def test_action_pipe_draws_the_noise_on_the_host_and_acts_one_round_behind() -> None:
    """With a refreshed copy each action reads the actor as it was at the previous request
    (the first, as it was when the pipe was made), and the noise comes from numpy."""
    sac = SAC(NoisyFixedActor(), LinearCritic(), Config(batch_size=2), observation_size=2,
              action_size=1, device=CPU)
    assert sac.exploration_noise_size() == 1
    sac.actor.w.grad = torch.ones(())  # as a built step leaves it
    refresh = sac.separate_behaviour_actor()
    assert sac.behaviour_actor is not sac.actor and refresh == sac.separate_behaviour_actor()
    assert not any(t.requires_grad or t.grad is not None for t in refresh[0])
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    pipe = ActionPipe(sac.explore, 3, 2, space, CPU, noise_size=1, refresh=refresh)
    assert pipe.side_stream is None  # no graph: it acts in line
    observations = np.random.default_rng(0).normal(size=(3, 2)).astype(np.float32)
    at_requests = []
    for update in range(4):
        at_requests.append(sac.actor.w.item())
        np.random.seed(update)
        pipe.request(observations)
        np.random.seed(update)  # the noise it drew, from numpy's global generator
        noise = torch.from_numpy(np.random.standard_normal((3, 1)).astype(np.float32))
        w = at_requests[max(update - 1, 0)]  # the actor at the previous request
        want = torch.tanh(w * torch.from_numpy(observations[:, :1]) + noise)
        np.testing.assert_array_equal(pipe.wait()[0], want.numpy())
        with torch.no_grad():
            sac.actor.w.add_(0.25)  # an update: the action after next sees it
    assert at_requests == [0.5, 0.75, 1.0, 1.25]
    assert [t.item() for t in pipe.staged_actor()] == [1.25]  # what the next action reads


def test_a_resumed_pipe_acts_from_the_staged_actor_it_was_given() -> None:
    """The staged actor a checkpoint keeps makes a new pipe's actions those the old pipe
    would have taken; a staged actor of another shape is one clear error."""
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    observations = np.ones((3, 2), np.float32)
    pipes, actions = [], []
    for _ in range(2):
        sac = SAC(NoisyFixedActor(), LinearCritic(), Config(batch_size=2), observation_size=2,
                  action_size=1, device=CPU)
        staged = pipes[0].staged_actor() if pipes else None
        pipes.append(ActionPipe(sac.explore, 3, 2, space, CPU, noise_size=1,
                                refresh=sac.separate_behaviour_actor(), staged=staged))
        if not staged:  # the first pipe acts once, then the actor moves on
            pipes[0].request(observations)
            pipes[0].wait()
            with torch.no_grad():
                sac.actor.w.fill_(3.0)
            np.random.seed(1)
            pipes[0].request(observations)  # stages w = 3.0, acts from w = 0.5
            pipes[0].wait()
        np.random.seed(2)
        pipes[-1].request(observations)
        actions.append(pipes[-1].wait()[0])
    np.testing.assert_array_equal(actions[1], actions[0])
    np.random.seed(2)
    noise = np.random.standard_normal((3, 1)).astype(np.float32)
    np.testing.assert_allclose(actions[0], np.tanh(3.0 * observations[:, :1] + noise), rtol=1e-6)
    sac = SAC(NoisyFixedActor(), LinearCritic(), Config(batch_size=2), observation_size=2,
              action_size=1, device=CPU)
    with pytest.raises(ValueError, match="do not match this actor's"):
        ActionPipe(sac.explore, 3, 2, space, CPU, noise_size=1,
                   refresh=sac.separate_behaviour_actor(), staged=[torch.zeros(2)])


def test_action_pipe_beside_the_updates_acts_then_stages_the_actor_anew(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The side-stream path's order, with stand-ins for the graph, streams and events (the
    GPU tests check the concurrency itself): the action's stream waits until the actor staged
    at the last request is written, copies it and marks that, launches and marks the action
    ready; the updates' stream waits for that copy only, then stages the actor anew and marks
    it; the host waits for the action alone."""
    sac = SAC(NoisyFixedActor(), LinearCritic(), Config(batch_size=2), observation_size=2,
              action_size=1, device=CPU)
    refresh = sac.separate_behaviour_actor()
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    pipe = ActionPipe(sac.explore, 3, 2, space, CPU, noise_size=1, refresh=refresh)
    log: list[str] = []
    current = ["updates"]

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_event(self, event: Event) -> None:
            log.append(f"{self.name} waits {event.name}")

    class Event:
        def __init__(self, name: str) -> None:
            self.name = name

        def record(self, stream: Stream) -> None:
            log.append(f"{self.name} on {stream.name}")

        def synchronize(self) -> None:
            log.append(f"host waits {self.name}")

    class Graph:
        def replay(self) -> None:
            log.append(f"replay on {current[0]}")
            pipe._copy_act_copy()

    class StreamContext:
        def __init__(self, stream: Stream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            current.insert(0, self.stream.name)

        def __exit__(self, *_: object) -> None:
            current.pop(0)

    copy_ = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_",
                        lambda *a, **k: log.append(f"refresh on {current[0]}") or copy_(*a, **k))
    monkeypatch.setattr(torch.cuda, "stream", StreamContext)
    pipe.graph, pipe.copies_in_graph = Graph(), True
    pipe.side_stream, pipe._stream = Stream("action stream"), Stream("updates")
    pipe._staged_ready, pipe._staged_taken = Event("staged"), Event("taken")
    pipe._ready = Event("ready")
    observations = np.ones((3, 2), np.float32)
    with torch.no_grad():
        sac.actor.w.fill_(2.0)  # the learned actor moved on since the copy was made
    np.random.seed(5)
    pipe.request(observations)
    actions, _ = pipe.wait()
    assert log == ["action stream waits staged", "refresh on action stream",
                   "taken on action stream", "replay on action stream", "ready on action stream",
                   "updates waits taken", "refresh on updates", "staged on updates",
                   "host waits ready"]
    np.random.seed(5)
    noise = np.random.standard_normal((3, 1)).astype(np.float32)
    # The actor as it was when the pipe was made (w = 0.5); the next action reads w = 2.0.
    np.testing.assert_allclose(actions, np.tanh(0.5 * observations[:, :1] + noise), rtol=1e-6)
    assert [t.item() for t in pipe.staged_actor()] == [2.0]


@pytest.mark.parametrize("seed", range(4))
def test_action_pipe_scaling_is_scale_action_to_the_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    low = (-rng.lognormal(0.0, 3.0, 6)).astype(np.float32)
    high = (low + rng.lognormal(0.0, 3.0, 6)).astype(np.float32)
    space = gym.spaces.Box(low, high, dtype=np.float32)
    actions = np.concatenate([rng.uniform(-1, 1, (500, 6)), [[-1.0] * 6, [1.0] * 6]])
    actions = actions.astype(np.float32)
    pipe = ActionPipe(lambda obs: obs, 502, 6, space, CPU)
    pipe.request(actions)
    returned, env_actions = pipe.wait()
    np.testing.assert_array_equal(returned, actions)
    np.testing.assert_array_equal(env_actions, scale_action(actions, low, high))


def test_episode_statistics_count_every_step_of_each_env() -> None:
    stats = EpisodeStatistics(2)
    no = np.array([False, False])
    assert stats.update(np.array([1.0, 2.0]), no, no) == []
    assert stats.update(np.array([1.0, 2.0]), np.array([True, False]), no) == [(2.0, 2)]
    assert stats.update(np.array([5.0, 2.0]), no, np.array([False, True])) == [(6.0, 3)]
    state = stats.state_dict()
    other = EpisodeStatistics(2)
    other.load_state_dict(state)
    assert other.update(np.array([1.0, 1.0]), np.array([True, True]), no) == [(6.0, 2),
                                                                              (1.0, 1)]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_stepper_steps_in_two_halves(asynchronous: bool) -> None:
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=4, asynchronous=asynchronous)
    reference = make_vec_env("Pendulum-v1", num_envs=2, seed=4)
    try:
        stepper = EnvStepper(envs)
        assert stepper.asynchronous is asynchronous
        envs.reset(seed=4)
        reference.reset(seed=4)
        actions = np.full((2, 1), 0.5, np.float32)
        stepper.start(actions)
        observations, rewards, *_ = stepper.finish()
        expected, expected_rewards, *_ = reference.step(actions)
        np.testing.assert_allclose(observations, expected)
        np.testing.assert_allclose(rewards, expected_rewards)
        if not asynchronous:
            with pytest.raises(RuntimeError, match=r"finish\(\) without start\(\)"):
                stepper.finish()
    finally:
        envs.close()
        reference.close()


def test_compile_auto_only_for_graphs_of_runs_long_enough_to_pay_it_back() -> None:
    auto, long_run, short_run = Config(compile="auto"), 1_000_000, 14_000
    assert resolve_compile(auto, use_graph=None, updates=long_run)[0] is None
    assert resolve_compile(auto, use_graph=True, updates=long_run)[0] is None
    assert resolve_compile(auto, use_graph=False, updates=long_run) == (False, "")
    # The README's Pendulum run: 14,000 updates save ~6 s, against ~30 s of compiling.
    compiled, note = resolve_compile(auto, use_graph=None, updates=short_run)
    assert compiled is False
    assert note == ("compile auto: off, 14,000 updates would save about 6 s, less than the "
                    "~30 s compilation takes")
    assert resolve_compile(Config(compile="on"), use_graph=False, updates=0) == (True, "")
    assert resolve_compile(Config(compile="off"), use_graph=True, updates=long_run) == (False, "")


def test_updates_ahead_counts_rounds_from_learning_starts_or_the_resumed_step() -> None:
    assert updates_ahead(15_000, 0, 1_000, num_envs=1, updates_per_step=1) == 14_000
    assert updates_ahead(15_000, 9_000, 1_000, num_envs=1, updates_per_step=1) == 6_000
    assert updates_ahead(15_000, 0, 1_000, num_envs=4, updates_per_step=2) == 7_000
    assert updates_ahead(1_000, 2_000, 500, num_envs=1, updates_per_step=1) == 0


def test_compile_pays_back_at_the_measured_break_even() -> None:
    break_even = int(COMPILE_SECONDS / SAVED_SECONDS_PER_UPDATE)
    assert compile_pays(break_even + 1)[0] and not compile_pays(break_even)[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["--updates-per-step", "0"], "--updates-per-step must be a positive int, got 0"),
    (["--compile", "maybe"], "--compile must be one of auto, on, off, got 'maybe'"),
])
def test_new_flags_are_checked(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(argv)


SHORT = ["--env", "Pendulum-v1", "--total-timesteps", "300", "--learning-starts", "100",
         "--batch-size", "32", "--hidden-sizes", "16", "--no-progress", "--device", "cpu"]


def test_updates_per_step_and_the_loop_summary(tmp_path: Path) -> None:
    summary = train(load_config([*SHORT, "--updates-per-step", "3", "--total-timesteps", "150",
                                 "--log-dir", str(tmp_path)]))
    from rl_graphstep.checkpoint import load_checkpoint

    agent = load_checkpoint(next(tmp_path.iterdir()))["agent"]
    assert agent["updates"] == 3 * 50  # 50 learning iterations, 3 updates each
    assert summary["learning_sps"] > 0 and summary["host_us_per_iteration"] > 0
    assert summary["compile"] is False and summary["graph"] is False


def test_async_envs_train(tmp_path: Path) -> None:
    assert main([*SHORT, "--num-envs", "2", "--vec-env", "async", "--log-dir", str(tmp_path)]) == 0
    from rl_graphstep.checkpoint import load_checkpoint

    state = load_checkpoint(next(tmp_path.iterdir()))
    assert state["config"]["vec_env"] == "async" and state["global_step"] == 300
    assert state["envs"] is None  # AsyncVectorEnv's subprocesses do not pickle; sync ones do


def test_compiled_eager_step_matches_the_uncompiled_one() -> None:
    """torch.compile of the step bodies fuses kernels; the update it computes is the same."""
    def run(compile: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                     torch.nn.Linear(8, 1))
        optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
        inputs, targets = torch.randn(16, 4), torch.randn(16, 1)
        step = EagerAdaptationStep.capture(
            module, optimizer, inputs, targets, torch.nn.functional.mse_loss,
            gradient_transform=lambda: torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0),
            skip_nonfinite=True, compile=compile)
        losses = [step(inputs, targets) for _ in range(4)]
        return [*losses, *module.parameters()]

    for a, b in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def failing_compile(function, **_: object):
    def compiled(*args: object) -> None:
        raise RuntimeError("the compiler gave up")
    return compiled


def test_a_part_the_compiler_fails_on_runs_uncompiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", failing_compile)
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    inputs, targets = torch.randn(8, 3), torch.randn(8, 1)
    step = EagerAdaptationStep.capture(module, optimizer, inputs, targets,
                                       torch.nn.functional.mse_loss, compile=True)
    before = module.weight.detach().clone()
    step(inputs, targets)  # the first call is uncompiled anyway
    with pytest.warns(UserWarning) as warned:
        step(inputs, targets)
    assert [str(w.message) for w in warned] == [
        f"torch.compile failed on the {part} of Linear (RuntimeError: the compiler gave up); "
        "that part runs uncompiled"
        for part in ("forward and loss", "gradient transform and optimizer step")]
    assert step._body.uncompiled_parts == ["forward and loss",
                                           "gradient transform and optimizer step"]
    assert not torch.equal(module.weight, before)
    assert optimizer.state[module.weight]["step"] == 2  # two updates, none doubled


def test_the_agent_runs_uncompiled_when_compiling_fails(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    import rl_graphstep.algorithms.base as base

    real = base.make_adaptation_step

    def refusing(*args: object, compile: bool, **kwargs: object):
        if compile:
            raise base.CompileError("could not compile the update of Critic: boom")
        return real(*args, compile=compile, **kwargs)

    monkeypatch.setattr(base, "make_adaptation_step", refusing)
    sac = make_sac(compile=None)
    assert sac.compile is True  # None: try to compile
    with pytest.warns(UserWarning, match="boom; running the updates uncompiled instead"):
        sac.update(ROWS)
    assert sac.compile is False and sac.updates == 1
    strict = make_sac(compile=True)
    with pytest.raises(base.CaptureError, match="boom"):
        strict.update(ROWS)


def polyak_pair(seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A source network and its target, which differ (as after some training)."""
    torch.manual_seed(seed)
    source = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    target = copy.deepcopy(source).requires_grad_(False)
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(torch.randn_like(parameter))
    return target, source


def test_a_compiled_target_update_averages_as_the_lerp_does() -> None:
    target, source = polyak_pair(0)
    reference = copy.deepcopy(target)
    compiled = base.PolyakAverage([(target, source)], tau=0.05)
    eager = base.PolyakAverage([(reference, source)], tau=0.05)
    compiled.compile()
    assert compiled._compiled is not None
    for t, r in zip(target.parameters(), reference.parameters(), strict=True):
        assert torch.equal(t, r)  # compiling it moved no target
    for _ in range(3):
        compiled()
        eager()
    start = polyak_pair(0)[0].parameters()
    for t, r, s in zip(target.parameters(), reference.parameters(), start, strict=True):
        torch.testing.assert_close(t, r, rtol=1e-6, atol=1e-7)
        assert not torch.equal(t, s)  # the three averages moved every tensor


def test_a_target_update_the_compiler_fails_on_runs_uncompiled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", failing_compile)
    target, source = polyak_pair(1)
    reference = copy.deepcopy(target)
    average = base.PolyakAverage([(target, source)], tau=0.05)
    with pytest.warns(UserWarning) as warned:
        average.compile()
    assert [str(w.message) for w in warned] == [
        "torch.compile failed on the target update (RuntimeError: the compiler gave up); "
        "it runs uncompiled"]
    average()
    torch._foreach_lerp_(list(reference.parameters()), list(source.parameters()), 0.05)
    for t, r in zip(target.parameters(), reference.parameters(), strict=True):
        assert torch.equal(t, r)


@pytest.mark.parametrize("kind", [SAC, TD3])
@pytest.mark.parametrize("compile", [True, False])
def test_an_agent_compiles_its_target_updates_with_its_steps(
        kind: type[ActorCritic], compile: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any graph could record them: the fused update graphs record the average."""
    real = torch.compile
    # The eager backend traces as the real one does but generates no code: fast on a CPU.
    monkeypatch.setattr(torch, "compile", lambda function, **_: real(function, backend="eager"))
    actor = FixedActor if kind is SAC else FixedDeterministicActor
    agent = kind(actor(), LinearCritic(), Config(gamma=0.9, tau=0.1, batch_size=2),
                 observation_size=2, action_size=1, device=CPU, compile=compile)
    averages = agent.target_averages()
    assert len(averages) == 1 and all(a._compiled is None for a in averages)
    agent.capture(ROWS)
    assert [a._compiled is not None for a in averages] == [compile]


def test_a_capture_failure_falls_back_to_eager_and_uncompiled(monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """A step that cannot be captured (not a compiler failure) keeps the compile setting
    out of it: with graph and compile both on auto, it runs eagerly and uncompiled."""
    import rl_graphstep.algorithms.base as base

    real = base.make_adaptation_step
    calls = []

    def no_graphs(*args: object, use_graph: bool, compile: bool, **kwargs: object):
        calls.append((use_graph, compile))
        if use_graph:
            raise base.CaptureError("could not capture the update of Critic: a host sync")
        return real(*args, use_graph=use_graph, compile=compile, **kwargs)

    monkeypatch.setattr(base, "make_adaptation_step", no_graphs)
    cfg = Config(alpha=0.5, batch_size=2)
    sac = SAC(FixedActor(), LinearCritic(), cfg, observation_size=2, action_size=1, device=CPU,
              use_graph=None, compile=None)
    sac.use_graph = True  # as on CUDA with --graph auto
    with pytest.warns(UserWarning, match="a host sync; running the updates eagerly instead"):
        sac.update(ROWS)
    assert (sac.use_graph, sac.compile) == (False, False)
    assert calls == [(True, True), (False, False), (False, False)]  # critic, then both eager


def test_every_step_built_in_one_process_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile keeps at most 8 compiled versions of one code object, and all steps run
    the same code guarded on their own optimizer: the tenth step built in a process (a sweep,
    a benchmark, a test session) must still be compiled, not silently run uncompiled."""
    from torch._dynamo.utils import counters

    real = torch.compile
    # The eager backend traces as the real one does but generates no code: fast on a CPU.
    monkeypatch.setattr(torch, "compile", lambda function, **_: real(function, backend="eager"))
    torch._dynamo.reset()
    graphs_per_step = []
    for _ in range(10):
        module = torch.nn.Linear(3, 1)
        optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
        inputs, targets = torch.randn(8, 3), torch.randn(8, 1)
        step = EagerAdaptationStep.capture(module, optimizer, inputs, targets,
                                           torch.nn.functional.mse_loss, compile=True)
        before = counters["stats"]["unique_graphs"]
        for _ in range(3):  # the first call runs uncompiled
            step(inputs, targets)
        graphs_per_step.append(counters["stats"]["unique_graphs"] - before)
    assert graphs_per_step[0] >= 2  # forward + loss, and the optimizer part
    assert graphs_per_step == [graphs_per_step[0]] * 10
