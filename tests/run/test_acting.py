"""Acting on the CPU: the action pipe's actions and their scaling, host noise, the actor copy
one round behind (and its staging across a resume), the side stream's order with stand-ins,
and the pipe the plan asks for."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import CPU, FixedActor, LinearCritic, NoisyFixedActor, cpu_plan

from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.envs.vector import scale_action
from rl_graphstep.run.acting import ActionPipe, behaviour_copy, policy_pipe
from rl_graphstep.settings.config import Config


def make_sac(actor: torch.nn.Module | None = None) -> SAC:
    return SAC(actor or NoisyFixedActor(), LinearCritic(), Config(batch_size=2), action_size=1,
               device=CPU)


def explorer(sac: SAC) -> tuple[functools.partial, tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """The exploring policy of a copy of ``sac``'s actor, and the copy's refresh pairs."""
    behaviour, refresh = behaviour_copy(sac.actor)
    return functools.partial(sac.explore, behaviour), refresh


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


def test_action_pipe_draws_the_noise_on_the_host_and_acts_one_round_behind() -> None:
    """With a refreshed copy each action reads the actor as it was at the previous request
    (the first, as it was when the pipe was made), and the noise comes from numpy."""
    sac = make_sac()
    assert sac.exploration_noise_size() == 1
    sac.actor.w.grad = torch.ones(())  # as a built step leaves it
    behaviour, refresh = behaviour_copy(sac.actor)
    assert behaviour is not sac.actor
    assert refresh[1] == [sac.actor.w] and [t.item() for t in refresh[0]] == [0.5]
    assert not any(t.requires_grad or t.grad is not None for t in refresh[0])
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    pipe = ActionPipe(functools.partial(sac.explore, behaviour), 3, 2, space, CPU,
                      noise_size=1, refresh=refresh)
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
        sac = make_sac()
        staged = pipes[0].staged_actor() if pipes else None
        policy, refresh = explorer(sac)
        pipes.append(ActionPipe(policy, 3, 2, space, CPU, noise_size=1, refresh=refresh,
                                staged=staged))
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
    sac = make_sac()
    with pytest.raises(ValueError, match="do not match this actor's"):
        ActionPipe(*explorer(sac)[:1], 3, 2, space, CPU, noise_size=1,
                   refresh=explorer(sac)[1], staged=[torch.zeros(2)])


def test_action_pipe_beside_the_updates_acts_then_stages_the_actor_anew(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The side-stream path's order, with stand-ins for the graph, streams and events (the
    GPU tests check the concurrency itself): the action's stream waits until the actor staged
    at the last request is written, copies it and marks that, launches and marks the action
    ready; the updates' stream waits for that copy only, then stages the actor anew and marks
    it; the host waits for the action alone."""
    sac = make_sac()
    policy, refresh = explorer(sac)
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    pipe = ActionPipe(policy, 3, 2, space, CPU, noise_size=1, refresh=refresh)
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


def test_the_behaviour_copy_never_learns_and_pairs_its_tensors_with_the_actor_s() -> None:
    actor = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    actor(torch.randn(4, 2)).sum().backward()
    behaviour, (copies, originals) = behaviour_copy(actor)
    assert originals == [*actor.parameters(), *actor.buffers()]
    assert copies == [*behaviour.parameters(), *behaviour.buffers()]
    assert all(torch.equal(c, o) and c.data_ptr() != o.data_ptr()
               for c, o in zip(copies, originals, strict=True))
    assert not any(p.requires_grad or p.grad is not None for p in behaviour.parameters())
    assert all(p.requires_grad and p.grad is not None for p in actor.parameters())


def test_the_policy_pipe_acts_in_line_from_the_actor_without_the_action_stream() -> None:
    sac = make_sac(FixedActor())
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    pipe = policy_pipe(sac, cpu_plan(), 3, 2, space)
    assert pipe.side_stream is None and pipe.graph is None and pipe.staged_actor() == []
    observations = np.array([[1.0, 0.0], [2.0, 0.0], [-1.5, 0.0]], np.float32)
    with torch.no_grad():
        sac.actor.w.fill_(2.0)  # read at once: no copy stands between
    pipe.request(observations)
    actions, env_actions = pipe.wait()
    np.testing.assert_allclose(actions, np.tanh(2.0 * observations[:, :1]), rtol=1e-6)
    np.testing.assert_allclose(env_actions, 2.0 * actions, rtol=1e-6)


def test_the_policy_pipe_with_the_action_stream_acts_from_a_copy_with_host_noise() -> None:
    sac = make_sac()
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    pipe = policy_pipe(sac, cpu_plan(action_stream=True), 3, 2, space, staged=[torch.tensor(
        1.5)])
    assert [t.item() for t in pipe.staged_actor()] == [1.5]  # the resumed run's
    observations = np.ones((3, 2), np.float32)
    np.random.seed(7)
    pipe.request(observations)
    np.random.seed(7)
    noise = np.random.standard_normal((3, 1)).astype(np.float32)
    np.testing.assert_allclose(pipe.wait()[0], np.tanh(1.5 + noise), rtol=1e-6)
    assert [t.item() for t in pipe.staged_actor()] == [0.5]  # the learned actor, staged
    assert pipe.policy.args[0] is not sac.actor
