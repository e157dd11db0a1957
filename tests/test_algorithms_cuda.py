"""Every algorithm on the GPU: captured steps match the eager ones for 100 updates on the same
seed, Pendulum is learned with graphs, and a custom network that syncs is named clearly."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rl_graphstep.algorithms import ALGORITHMS
from rl_graphstep.buffer import ReplayBuffer
from rl_graphstep.config import Config
from rl_graphstep.errors import CaptureError, ConfigError
from rl_graphstep.flags import load_config
from rl_graphstep.graphstep import CudaGraphAdaptationStep, EagerAdaptationStep
from rl_graphstep.networks import DeterministicActor
from rl_graphstep.train import train

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")
OBS = gym.spaces.Box(-1.0, 1.0, (17,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)


def agent(algo: str, use_graph: bool):
    torch.manual_seed(0)
    cfg = Config(algo=algo)
    kind = ALGORITHMS[algo]
    return kind(kind.default_actor(OBS, ACT, cfg), kind.default_critic(OBS, ACT, cfg), cfg,
                observation_size=17, action_size=6, device=DEVICE, use_graph=use_graph)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_captured_steps_match_eager_for_100_updates(algo: str) -> None:
    buffer = ReplayBuffer(5000, 17, 6, DEVICE)
    rng = np.random.default_rng(0)
    buffer.add(rng.normal(size=(5000, 17)), rng.uniform(-1, 1, (5000, 6)),
               rng.normal(size=5000), rng.normal(size=(5000, 17)), rng.random(5000) < 0.05)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    batches = [buffer.storage[torch.randint(0, 5000, (256,), device=DEVICE, generator=g)]
               for _ in range(100)]
    results = {}
    for use_graph in (True, False):
        sac = agent(algo, use_graph)
        torch.manual_seed(7)  # the noise the steps draw: the same in graph and eager
        losses = [sac.update(rows)["losses/critic"] for rows in batches]
        kind = CudaGraphAdaptationStep if use_graph else EagerAdaptationStep
        assert isinstance(sac.critic_step, kind) and isinstance(sac.actor_step, kind)
        results[use_graph] = (sac, torch.stack(losses))
    (graph, graph_losses), (eager, eager_losses) = results[True], results[False]
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-4, atol=1e-5)
    names = ["actor", "critic", "target_critic"] + (["target_actor"] if algo != "sac" else [])
    for name in names:
        for p, q in zip(getattr(graph, name).parameters(), getattr(eager, name).parameters(),
                        strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    if algo == "sac":
        torch.testing.assert_close(graph.log_alpha, eager.log_alpha)
    assert graph.updates == 100 and graph_losses[-1] != graph_losses[0]


@pytest.mark.parametrize(("algo", "mode"), [
    *((algo, "graph+compile") for algo in sorted(ALGORITHMS)),  # the default: action stream
    ("sac", "graph+compile in line"),
    ("sac", "graph"),  # eager learning is the CPU suite's (the same code, 10x slower)
])
def test_learns_pendulum_on_the_gpu(algo: str, mode: str, tmp_path: Path) -> None:
    flags = {"graph+compile": ["--graph", "on", "--compile", "on"],
             "graph+compile in line": ["--graph", "on", "--compile", "on", "--action-stream",
                                       "off"],
             "graph": ["--graph", "on", "--compile", "off"]}[mode]
    cfg = load_config(["--env", "Pendulum-v1", "--algo", algo, "--seed", "0", "--device",
                       "cuda", *flags, "--log-dir", str(tmp_path), "--no-progress"])
    summary = train(cfg)
    assert summary["graph"] is True
    assert summary["compile"] is mode.startswith("graph+compile")
    # Every algorithm's actor takes host noise, so the action stream is on by default.
    assert summary["action_stream"] is not mode.endswith("in line")
    assert summary["mean_return_last_10"] >= -300, summary


class SyncingActor(DeterministicActor):
    """A custom actor that reads a tensor on the host: fine eagerly, not in a graph."""

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        actions = super().forward(observations)
        if actions.abs().max().item() > 2.0:
            actions = actions * 0.5
        return actions


def test_a_syncing_custom_actor_is_named(tmp_path: Path) -> None:
    cfg = load_config(["--env", "Pendulum-v1", "--algo", "td3", "--device", "cuda",
                       "--graph", "on", "--total-timesteps", "300", "--learning-starts", "100",
                       "--log-dir", str(tmp_path), "--no-progress"])
    with pytest.raises(ConfigError, match=r"SyncingActor.forward calls .* which cannot run "
                                          r"inside a CUDA graph"):
        train(cfg, actor=SyncingActor)


def test_graph_auto_falls_back_to_eager_when_capture_fails(tmp_path: Path) -> None:
    class Unsupported(nn.Module):  # passes the start-up check, fails in capture
        def __init__(self, observation_space, action_space) -> None:
            super().__init__()
            self.inner = DeterministicActor(observation_space, action_space, (32,))

        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            if torch.cuda.is_current_stream_capturing():
                torch.cuda.synchronize()  # a sync only while capturing
            return self.inner(observations)

    base = ["--env", "Pendulum-v1", "--algo", "td3", "--device", "cuda", "--total-timesteps",
            "300", "--learning-starts", "100", "--log-dir", str(tmp_path), "--no-progress",
            "--compile", "off"]  # compiled, the capture-only sync would be traced away
    with pytest.warns(UserWarning, match="running the updates eagerly instead"):
        summary = train(load_config([*base, "--graph", "auto"]), actor=Unsupported)
    assert summary["graph"] is False
    # the failing line is the actor's, reached from the critic loss's target actions
    with pytest.raises(CaptureError, match=r"could not capture the update of EnsembleCritic "
                                           r"\(via StateActionInput\) \(at tests/test_algori"):
        train(load_config([*base, "--graph", "on"]), actor=Unsupported)


def test_resumed_state_reaches_the_captured_graphs(tmp_path: Path) -> None:
    from rl_graphstep.checkpoint import load_checkpoint
    from rl_graphstep.train import main

    base = ["--env", "Pendulum-v1", "--device", "cuda", "--learning-starts", "200",
            "--batch-size", "64", "--log-dir", str(tmp_path), "--no-progress", "--save-buffer",
            "--buffer-size", "5000", "--compile", "off",
            "--action-stream", "off"]  # eager acts in line: so must the graphs, to compare
    train(load_config([*base, "--graph", "on", "--total-timesteps", "400", "--run-name", "a"]))
    checkpoint = tmp_path / "a" / "checkpoints" / "step_000000000400.pt"
    # The same checkpoint resumed with graphs and eagerly: if a restored value did not reach
    # the graphs, the two would part at once.
    finals = {}
    for graph in ("on", "off"):
        assert main(["--resume", str(checkpoint), "--graph", graph, "--total-timesteps", "500",
                     "--run-name", "a"]) == 0
        finals[graph] = load_checkpoint(tmp_path / "a")["agent"]
    for part in ("actor", "critic", "target_critic"):
        for key, value in finals["on"][part].items():
            torch.testing.assert_close(value, finals["off"][part][key], rtol=1e-4, atol=1e-5)
    assert finals["on"]["updates"] == finals["off"]["updates"] == 300
