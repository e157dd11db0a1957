"""GPU tests of the fast path: the captured replay sampling and action selection, compiled
steps against their eager twins, the compile fallback, and every loop mode end to end."""

from __future__ import annotations

import copy
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import assert_same_learning_state
from torch import nn

from rl_graphstep import acting
from rl_graphstep.acting import ActionPipe
from rl_graphstep.algorithms import ALGORITHMS
from rl_graphstep.buffer import BatchSampler, ReplayBuffer
from rl_graphstep.config import Config
from rl_graphstep.errors import CaptureError
from rl_graphstep.flags import load_config
from rl_graphstep.graphstep import CudaGraphAdaptationStep, EagerAdaptationStep
from rl_graphstep.metrics import MetricSums
from rl_graphstep.networks import SquashedGaussianActor
from rl_graphstep.train import train

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


def test_captured_sampling_matches_eager_draws_and_reads_the_fill_level() -> None:
    buffer = filled_buffer(rows=10)
    outputs = {kind: torch.zeros(256, 17, device=DEVICE) for kind in ("graph", "eager")}
    graph = BatchSampler(buffer, 256, [(outputs["graph"], slice(0, 17))], use_graph=True)
    eager = BatchSampler(buffer, 256, [(outputs["eager"], slice(0, 17))])
    assert graph.graph is not None and eager.graph is None
    for _ in range(3):
        draws = {}
        for kind, sampler in (("graph", graph), ("eager", eager)):
            torch.manual_seed(5)
            sampler()
            draws[kind] = outputs[kind].clone()
        torch.testing.assert_close(draws["graph"], draws["eager"], rtol=0, atol=0)
        assert len(set(draws["graph"][:, 0].tolist())) <= 10
    # Rows added after capture are drawn: the graph reads the buffer's size tensor.
    rng = np.random.default_rng(1)
    buffer.add(rng.normal(size=(2000, 17)), np.zeros((2000, 6)), np.zeros(2000),
               np.zeros((2000, 17)), np.zeros(2000, bool))
    graph()
    first = outputs["graph"].clone()
    assert len(set(first[:, 0].tolist())) > 200
    graph()
    assert not torch.equal(outputs["graph"], first)


def sac(use_graph: bool, compile: bool = False):
    torch.manual_seed(0)
    cfg = Config(algo="sac")
    kind = ALGORITHMS["sac"]
    return kind(kind.default_actor(OBS, ACT, cfg), kind.default_critic(OBS, ACT, cfg), cfg,
                observation_size=17, action_size=6, device=DEVICE, use_graph=use_graph,
                compile=compile)


@pytest.mark.parametrize("compile", [False, True], ids=["plain", "compiled"])
def test_update_from_buffer_graph_matches_eager(compile: bool) -> None:
    """The whole fast path (captured sampling + captured steps, compiled or not) against the
    same code run eagerly, from the same seed, over 50 updates."""
    buffer = filled_buffer()
    agents, losses = {}, {}
    for use_graph in (True, False):
        agent = sac(use_graph, compile)
        # One update first: the eager twin's first call runs uncompiled (it creates the
        # optimizer state), so the compiled code paths are compared from the second on.
        agent.update_from(buffer)
        torch.manual_seed(11)
        # update_from's metrics are live: copy each before the next update.
        losses[use_graph] = torch.stack([agent.update_from(buffer)["losses/critic"].clone()
                                         for _ in range(50)])
        agents[use_graph] = agent
    kind = CudaGraphAdaptationStep
    assert isinstance(agents[True].critic_step, kind) and agents[True].sampler.graph is not None
    assert len(agents[True].fused_updates) == 2  # the default policy_frequency 2
    assert isinstance(agents[False].critic_step, EagerAdaptationStep)
    assert agents[True].compile is compile
    assert agents[True].critic_step._body.uncompiled_parts == []
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
    for p, q in zip(agents[True].actor.parameters(), agents[False].actor.parameters(),
                    strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(agents[True].log_alpha, agents[False].log_alpha)


@pytest.mark.parametrize("compile", [False, True], ids=["plain", "compiled"])
def test_fused_update_graphs_match_the_separate_graphs_bit_for_bit(compile: bool) -> None:
    """One graph per update (sampling, critic, target update, actor steps when due) runs the
    separate graphs' kernels in their order, drawing the same random numbers."""
    buffer = filled_buffer()
    agents, metrics, means = {}, {}, {}
    for fuse in (False, True):
        agent, sums = sac(True, compile), MetricSums()
        # The fused graphs also add the metrics into the logger's sums; the separate
        # replays add them after each update.
        agent.build(buffer, fuse=fuse, metrics=sums)
        torch.manual_seed(11)
        history, keys = [], None
        for _ in range(50):
            live = agent.update_from(buffer)
            keys = keys or sorted(live)  # the first update's: an actor update's
            history.append(torch.stack([live.get(k, torch.zeros((), device=DEVICE))
                                        for k in keys]).clone())
        metrics[fuse], agents[fuse], means[fuse] = torch.stack(history), agent, sums.take()
    assert agents[False].fused_updates is None and len(agents[True].fused_updates) == 2
    assert all(f.adds_into is not None for f in agents[True].fused_updates)
    torch.testing.assert_close(metrics[True], metrics[False], rtol=0, atol=0)
    assert means[True] == means[False] and len(means[True]) == len(keys)
    assert_same_learning_state(agents[True], agents[False])


def test_compiled_steps_learn_the_same_as_plain_ones() -> None:
    """Compiled kernels round differently and draw their noise differently, so compiled and
    plain runs are compared by outcome: a critic fitted on the same data reaches a similar
    loss."""
    buffer = filled_buffer()
    final = {}
    for compile in (False, True):
        agent = sac(True, compile)
        torch.manual_seed(3)
        losses = torch.stack([agent.update_from(buffer)["losses/critic"].clone()
                              for _ in range(300)])
        final[compile] = losses[-50:].mean().item()
        assert losses[-50:].mean() < losses[:50].mean()
    assert final[True] == pytest.approx(final[False], rel=0.25)


def test_an_action_beside_an_update_sees_the_actor_one_round_behind() -> None:
    """The action runs on its own stream while the updates rewrite the actor: it must read
    the actor as it was at the previous request, exactly, and wait for no update."""
    buffer = filled_buffer()
    agent = sac(True, False)
    agent.build(buffer)
    refresh = agent.separate_behaviour_actor()
    pipe = ActionPipe(agent.explore, 4, 17, ACT, DEVICE, use_graph=True,
                      noise_size=agent.exploration_noise_size(), refresh=refresh)
    assert pipe.side_stream is not None and pipe.copies_in_graph
    observations = np.random.default_rng(0).normal(size=(4, 17)).astype(np.float32)
    at_requests = []
    for update in range(20):
        at_requests.append([t.clone() for t in refresh[1]])  # the learned actor now
        np.random.seed(update)
        pipe.request(observations)
        agent.update_from(buffer)  # queued after the action, on the other stream
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
    buffer = filled_buffer()
    agent = sac(True, False)
    agent.build(buffer)
    pipe = ActionPipe(agent.explore, 4, 17, ACT, DEVICE, use_graph=True,
                      noise_size=agent.exploration_noise_size() if beside else 0,
                      refresh=agent.separate_behaviour_actor() if beside else None)
    assert (pipe.side_stream is not None) is beside
    observations = np.zeros((4, 17), np.float32)
    pipe.request(observations)
    pipe.wait()
    for _ in range(200):
        agent.update_from(buffer)
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
                                           r"\(at tests/test_fastpath_cuda.py:\d+"):
        ActionPipe(syncing, 2, 17, ACT, DEVICE, use_graph=True)
    with pytest.warns(UserWarning, match="selecting actions eagerly instead"):
        pipe = ActionPipe(syncing, 2, 17, ACT, DEVICE, use_graph=None)
    pipe.request(np.ones((2, 17), np.float32))
    np.testing.assert_allclose(pipe.wait()[0], np.ones((2, 6)))
    torch.zeros(1, device=DEVICE).add_(1)  # CUDA still works after the failed capture


class NoisyHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out + torch.randn_like(out)


def test_compiled_graph_noise_is_fresh_on_every_replay() -> None:
    module = NoisyHead().to(DEVICE)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3, capturable=True)
    inputs, targets = torch.randn(32, 4, device=DEVICE), torch.randn(32, 2, device=DEVICE)
    step = CudaGraphAdaptationStep.capture(
        module, optimizer, inputs, targets, lambda p, t: ((p - t) ** 2).mean(), compile=True)
    assert step._body.uncompiled_parts == []
    losses = [step(inputs, targets).item() for _ in range(5)]
    assert len({round(loss, 6) for loss in losses}) == 5


BASE = ["--env", "Pendulum-v1", "--device", "cuda", "--total-timesteps", "400",
        "--learning-starts", "200", "--batch-size", "64", "--no-progress"]


@pytest.mark.parametrize("flags", [
    ["--graph", "on", "--compile", "on"],
    ["--graph", "on"],  # compile auto: off, 200 updates do not pay for compiling
    ["--graph", "on", "--compile", "off"],
    ["--graph", "off"],
    ["--graph", "on", "--compile", "off", "--updates-per-step", "2", "--num-envs", "2",
     "--vec-env", "async"],
], ids=["graph+compile", "graph-auto", "graph", "eager", "k2-async"])
def test_every_loop_mode_runs(flags: list[str], tmp_path: Path) -> None:
    summary = train(load_config([*BASE, *flags, "--log-dir", str(tmp_path)]))
    assert summary["graph"] is (flags[1] == "on")
    assert summary["compile"] is (flags[2:4] == ["--compile", "on"])
    assert summary["learning_sps"] > 0 and summary["host_us_per_iteration"] > 0
    # The default with CUDA graphs (SAC's actor takes host noise); eager acts in line.
    assert summary["action_stream"] is (flags[1] == "on")


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_acting_beside_the_updates_learns_exactly_as_acting_after_them(
        algo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The action stream changes when the action runs, not what it computes: the copy holds
    the actor one round behind on either stream, and the action's
    graph shares no scratch memory with the updates' (compiled, they use cuBLAS workspace:
    when every capture shared one, they corrupted each other's matmuls and SAC stopped
    learning)."""
    from rl_graphstep import train as train_module
    from rl_graphstep.checkpoint import load_checkpoint

    class InLine(ActionPipe):
        """The same pipe (host noise, refreshed copy), launched on the updates' stream."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            assert self.side_stream is not None
            self.side_stream = None

    states = {}
    for name in ("beside", "in-line"):
        with monkeypatch.context() as patch:
            if name == "in-line":
                patch.setattr(train_module, "ActionPipe", InLine)
            summary = train(load_config([*BASE, "--algo", algo, "--graph", "on", "--compile",
                                         "on", "--action-stream", "--log-dir", str(tmp_path),
                                         "--run-name", name]))
        assert summary["action_stream"] is (name == "beside")
        states[name] = load_checkpoint(tmp_path / name)["agent"]
    for part in ("actor", "critic", "target_critic"):
        for key, value in states["beside"][part].items():
            torch.testing.assert_close(value, states["in-line"][part][key],
                                       rtol=0, atol=0, msg=f"{part}.{key}")


def test_a_run_acting_beside_the_updates_resumes_bit_for_bit(tmp_path: Path) -> None:
    """The staged actor the next action reads is in the checkpoint: stopped and resumed, the
    run ends exactly as the run that went straight through."""
    from rl_graphstep.checkpoint import load_checkpoint
    from rl_graphstep.train import main

    args = [*BASE, "--graph", "on", "--compile", "off", "--action-stream", "--save-buffer",
            "--log-dir", str(tmp_path)]
    summary = train(load_config([*args, "--run-name", "straight"]))
    assert summary["action_stream"] is True
    train(load_config([*args, "--total-timesteps", "300", "--run-name", "halves"]))
    assert load_checkpoint(tmp_path / "halves")["staged_actor"]
    assert main(["--resume", str(tmp_path / "halves"), "--total-timesteps", "400"]) == 0
    straight, halves = (load_checkpoint(tmp_path / name) for name in ("straight", "halves"))
    assert straight["global_step"] == halves["global_step"] == 400
    for part in ("actor", "critic", "target_critic"):
        for key, value in straight["agent"][part].items():
            torch.testing.assert_close(value, halves["agent"][part][key], rtol=0, atol=0,
                                       msg=f"{part}.{key}")
    for a, b in zip(straight["staged_actor"], halves["staged_actor"], strict=True):
        assert torch.equal(a, b)
