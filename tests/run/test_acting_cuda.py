"""GPU tests of acting: the captured action selection, the action beside the updates on its
own stream (one round behind, waiting for none of them), and the capture fallbacks."""

from __future__ import annotations

import copy
import dataclasses
import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_graphstep.algorithms import OFF_POLICY_ALGORITHMS as ALGORITHMS
from rl_graphstep.core.errors import CaptureError
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.networks.builtin import SquashedGaussianActor
from rl_graphstep.run import acting
from rl_graphstep.run.acting import ActionPipe, behaviour_copy, policy_pipe
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import RunPlan

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")
OBS = gym.spaces.Box(-1.0, 1.0, (17,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)


def graph_learner() -> OffPolicyLearner:
    """A SAC learner with CUDA graphs, built on 3,000 random transitions."""
    buffer = ReplayBuffer(5000, 17, 6, DEVICE)
    rng = np.random.default_rng(0)
    buffer.add(rng.normal(size=(3000, 17)), rng.uniform(-1, 1, (3000, 6)),
               rng.normal(size=3000), rng.normal(size=(3000, 17)), rng.random(3000) < 0.05)
    torch.manual_seed(0)
    cfg = Config(algo="sac")
    kind = ALGORITHMS["sac"]
    algorithm = kind(kind.default_actor(OBS, ACT, cfg), kind.default_critic(OBS, ACT, cfg), cfg,
                     action_size=6, device=DEVICE)
    plan = RunPlan(device=DEVICE, graphs=True, compile=False, action_stream=True,
                   vec_env="sync", tf32=False)
    learner = OffPolicyLearner(algorithm, buffer, cfg, plan)
    learner.build(MetricSums())
    return learner


def test_an_action_beside_an_update_sees_the_actor_one_round_behind() -> None:
    """The action runs on its own stream while the updates rewrite the actor: it must read
    the actor as it was at the previous request, exactly, and wait for no update."""
    learner = graph_learner()
    agent = learner.algorithm
    behaviour, refresh = behaviour_copy(agent.actor)
    pipe = ActionPipe(functools.partial(agent.explore, behaviour), 4, 17, ACT, DEVICE,
                      use_graph=True, noise_size=agent.exploration_noise_size(),
                      refresh=refresh)
    assert pipe.side_stream is not None and pipe.copies_in_graph
    observations = np.random.default_rng(0).normal(size=(4, 17)).astype(np.float32)
    at_requests = []
    for update in range(20):
        at_requests.append([t.clone() for t in refresh[1]])  # the learned actor now
        np.random.seed(update)
        pipe.request(observations)
        learner.update()  # queued after the action, on the other stream
        actions, _ = pipe.wait()
        np.random.seed(update)
        noise = torch.from_numpy(np.random.standard_normal((4, 6)).astype(np.float32))
        reference = copy.deepcopy(agent.actor)
        with torch.no_grad():
            torch._foreach_copy_([*reference.parameters(), *reference.buffers()],
                                 at_requests[max(update - 1, 0)])
            want = reference.sample(torch.from_numpy(observations).to(DEVICE), noise.to(DEVICE))
        torch.testing.assert_close(torch.from_numpy(actions), want.cpu(), msg=f"update {update}")
    changed = any(not torch.equal(a, b) for a, b in zip(at_requests[0], refresh[1], strict=True))
    assert changed  # the updates did rewrite the actor meanwhile


@pytest.mark.parametrize("beside", [True, False], ids=["action stream", "in line"])
def test_an_action_beside_the_updates_waits_for_none_of_them(beside: bool) -> None:
    """With 200 updates queued (well over 100 ms of GPU work), the action requested after
    them comes back while they still run; in line, it comes back after them."""
    learner = graph_learner()
    plan = dataclasses.replace(learner.plan, action_stream=beside)
    pipe = policy_pipe(learner.algorithm, plan, 4, 17, ACT)
    assert (pipe.side_stream is not None) is beside
    observations = np.zeros((4, 17), np.float32)
    pipe.request(observations)
    pipe.wait()
    for _ in range(200):
        learner.update()
    updates_done = torch.cuda.Event()
    updates_done.record()
    pipe.request(observations)
    pipe.wait()
    assert updates_done.query() is not beside
    torch.cuda.synchronize()


def test_captured_action_selection_matches_eager_and_is_fresh() -> None:
    torch.manual_seed(0)
    actor = SquashedGaussianActor(OBS, ACT, (64, 64)).to(DEVICE)
    policy = lambda obs: actor(obs)[0]  # noqa: E731
    pipes = {g: ActionPipe(policy, 4, 17, ACT, DEVICE, use_graph=g) for g in (True, False)}
    assert pipes[True].graph is not None and pipes[False].graph is None
    assert pipes[True].copies_in_graph
    observations = np.random.default_rng(0).normal(size=(4, 17)).astype(np.float32)
    actions = {}
    for use_graph, pipe in pipes.items():
        torch.manual_seed(9)
        actions[use_graph] = []
        for _ in range(3):
            pipe.request(observations)
            actions[use_graph].append(np.concatenate(pipe.wait(), axis=1))
    np.testing.assert_allclose(np.stack(actions[True]), np.stack(actions[False]), rtol=1e-5,
                               atol=1e-6)
    assert not np.array_equal(actions[True][0], actions[True][1])  # fresh noise per replay


def test_an_action_graph_that_cannot_copy_copies_outside_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    actor = SquashedGaussianActor(OBS, ACT, (64, 64)).to(DEVICE)
    real = acting.capture_graph

    def no_copies(function: object, device: torch.device, *, what: str, **kwargs: object):
        if what.endswith("with its copies"):
            raise CaptureError(f"could not capture {what}: RuntimeError: boom")
        return real(function, device, what=what, **kwargs)

    monkeypatch.setattr(acting, "capture_graph", no_copies)
    observations = np.random.default_rng(0).normal(size=(4, 17)).astype(np.float32)
    with pytest.warns(UserWarning, match="with its copies: RuntimeError: boom; copying "
                                         "outside the graph"):
        pipe = ActionPipe(actor.deterministic_action, 4, 17, ACT, DEVICE, use_graph=True)
    assert pipe.graph is not None and not pipe.copies_in_graph
    pipe.request(observations)
    expected = actor.deterministic_action(torch.as_tensor(observations, device=DEVICE))
    np.testing.assert_allclose(pipe.wait()[0], expected.detach().cpu().numpy(), rtol=1e-6,
                               atol=1e-6)


def test_a_syncing_policy_is_named_or_acted_eagerly() -> None:
    def syncing(observations: torch.Tensor) -> torch.Tensor:
        scale = float(observations.abs().max())  # a host sync
        return observations[:, :6] / scale

    with pytest.raises(CaptureError, match=r"could not capture the policy's action selection "
                                           r"\(at tests/run/test_acting_cuda.py:\d+"):
        ActionPipe(syncing, 2, 17, ACT, DEVICE, use_graph=True)
    with pytest.warns(UserWarning, match="selecting actions eagerly instead"):
        pipe = ActionPipe(syncing, 2, 17, ACT, DEVICE, use_graph=True, graph_fallback=True)
    assert pipe.graph is None
    pipe.request(np.ones((2, 17), np.float32))
    np.testing.assert_allclose(pipe.wait()[0], np.ones((2, 6)))
    torch.zeros(1, device=DEVICE).add_(1)  # CUDA still works after the failed capture


def _normalizer_pipe(refresh: bool):
    """A pipe acting tanh of the first normalised observation entry (noise ignored), of a
    normaliser fed {1, 5} (mean 3, std 2) in its first entry."""
    from rl_graphstep.data.normalizer import ObservationNormalizer

    normalizer = ObservationNormalizer(1, 2, DEVICE)
    normalizer.update(np.array([[1.0, 0.0], [5.0, 0.0]]))  # mean 3, std 2
    stats = normalizer.stats.clone() if refresh else None

    def policy(observations: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        return torch.tanh(normalizer.normalize(observations, stats)[:, :1])

    space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    pipe = ActionPipe(policy, 4, 2, space, DEVICE, use_graph=True,
                      noise_size=1 if refresh else 0,
                      refresh=([stats], [normalizer.stats]) if refresh else None)
    return normalizer, pipe


def test_a_captured_policy_reads_the_observation_statistics_as_they_are_now() -> None:
    normalizer, pipe = _normalizer_pipe(refresh=False)
    assert pipe.graph is not None
    observations = np.full((4, 2), 5.0, np.float32)
    for mean, std in ((3.0, 2.0), (5.0, np.sqrt(6.0))):
        pipe.request(observations)
        actions, _ = pipe.wait()
        np.testing.assert_allclose(actions, np.tanh((5.0 - mean) / (std + 0.01)), rtol=1e-6)
        normalizer.update(np.array([[7.0, 0.0], [7.0, 0.0]]))  # {1, 5, 7, 7}: mean 5, var 6


def test_the_action_beside_the_updates_reads_statistics_one_round_behind() -> None:
    normalizer, pipe = _normalizer_pipe(refresh=True)
    assert pipe.side_stream is not None
    observations = np.full((4, 2), 5.0, np.float32)
    pipe.request(observations)
    first, _ = pipe.wait()
    normalizer.update(np.array([[7.0, 0.0], [7.0, 0.0]]))  # mean 5 from here on
    pipe.request(observations)  # the statistics staged at the first request: mean 3
    second, _ = pipe.wait()
    pipe.request(observations)
    third, _ = pipe.wait()
    np.testing.assert_allclose(first, np.tanh(2 / 2.01), rtol=1e-6)
    np.testing.assert_allclose(second, first)
    np.testing.assert_allclose(third, 0.0, atol=1e-7)
