"""SAC on the GPU: captured steps match the eager ones, and Pendulum is learned with graphs."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.buffer import ReplayBuffer
from rl_graphstep.config import Config, load_config
from rl_graphstep.graphstep import CudaGraphAdaptationStep, EagerAdaptationStep
from rl_graphstep.networks import EnsembleCritic, SquashedGaussianActor
from rl_graphstep.train import train

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")
OBS = gym.spaces.Box(-1.0, 1.0, (17,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)


def agent(use_graph: bool) -> SAC:
    torch.manual_seed(0)
    return SAC(SquashedGaussianActor(OBS, ACT), EnsembleCritic(OBS, ACT), Config(),
               observation_size=17, action_size=6, device=DEVICE, use_graph=use_graph)


def test_captured_sac_matches_eager_for_100_updates() -> None:
    buffer = ReplayBuffer(5000, 17, 6, DEVICE)
    rng = np.random.default_rng(0)
    buffer.add(rng.normal(size=(5000, 17)), rng.uniform(-1, 1, (5000, 6)),
               rng.normal(size=5000), rng.normal(size=(5000, 17)), rng.random(5000) < 0.05)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    batches = [buffer.storage[torch.randint(0, 5000, (256,), device=DEVICE, generator=g)]
               for _ in range(100)]
    results = {}
    for use_graph in (True, False):
        sac = agent(use_graph)
        torch.manual_seed(7)  # the actor's noise: the same draws in graph and eager
        losses = [sac.update(rows)["losses/critic"] for rows in batches]
        kind = CudaGraphAdaptationStep if use_graph else EagerAdaptationStep
        assert isinstance(sac.critic_step, kind) and isinstance(sac.actor_step, kind)
        results[use_graph] = (sac, torch.stack(losses))
    (graph, graph_losses), (eager, eager_losses) = results[True], results[False]
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-4, atol=1e-5)
    for name in ("actor", "critic", "target_critic"):
        for p, q in zip(getattr(graph, name).parameters(), getattr(eager, name).parameters(),
                        strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(graph.log_alpha, eager.log_alpha)
    assert graph.updates == 100 and graph_losses[-1] != graph_losses[0]


def test_sac_learns_pendulum_with_graphs(tmp_path: Path) -> None:
    cfg = load_config(["--env", "Pendulum-v1", "--seed", "0", "--device", "cuda", "--graph",
                       "on", "--log-dir", str(tmp_path), "--no-progress"])
    summary = train(cfg)
    assert summary["graph"] is True
    assert summary["mean_return_last_10"] >= -300, summary
