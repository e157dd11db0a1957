"""Host µs of the single calls the training loop makes every env step, each timed alone in a
tight loop: graph launches (with and without random numbers), copies, events, the env step,
the buffer add. Inside the loop, interleaved with driver calls, they run slower; this gives
their relative sizes.

    python benchmarks/host_costs.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from cli import cli_main

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.envs.vector import EpisodeStatistics, make_vec_env

DEVICE = torch.device("cuda")


def per_call_us(function: Callable[[], object], calls: int = 5000) -> float:
    """Host µs per call; the GPU is synchronised before and after, not in between."""
    for _ in range(50):
        function()
    torch.cuda.synchronize()
    began = time.perf_counter_ns()
    for _ in range(calls):
        function()
    elapsed = time.perf_counter_ns() - began
    torch.cuda.synchronize()
    return elapsed / calls / 1e3


def captured(body: Callable[[], object]) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


@cli_main
def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("host_costs.py times CUDA calls: it needs CUDA")
    x = torch.zeros(256, 256, device=DEVICE)
    pinned = torch.zeros(1, 42, pin_memory=True)
    on_device = torch.zeros(1, 42, device=DEVICE)
    event, stream = torch.cuda.Event(), torch.cuda.current_stream(DEVICE)
    scalars = [torch.zeros((), device=DEVICE) for _ in range(6)]
    fill_level = torch.zeros((), dtype=torch.int64, device=DEVICE)
    plain = captured(lambda: x.add_(1.0))
    random = captured(lambda: x.add_(torch.rand_like(x)))
    rows: list[tuple[str, Callable[[], object]]] = [
        ("graph launch, 1 kernel, no random numbers", plain.replay),
        ("graph launch, 1 kernel drawing random numbers", random.replay),
        ("one kernel launch (x.add_(1))", lambda: x.add_(1.0)),
        ("pinned host -> device copy, 42 floats", lambda: on_device.copy_(pinned,
                                                                          non_blocking=True)),
        ("device -> pinned host copy, 42 floats", lambda: pinned.copy_(on_device,
                                                                       non_blocking=True)),
        ("event.record(cached stream)", lambda: event.record(stream)),
        ("event.record() (looks the stream up)", event.record),
        ("torch.cuda.current_stream(device)", lambda: torch.cuda.current_stream(DEVICE)),
        ("fill_ of a device scalar", lambda: fill_level.fill_(5)),
        ("_foreach_add_ of 6 scalars", lambda: torch._foreach_add_(scalars, scalars)),
    ]
    envs = make_vec_env("HalfCheetah-v5", num_envs=1, seed=0)
    envs.reset(seed=0)
    actions = np.zeros((1, 6), np.float32)
    buffer = ReplayBuffer(100_000, 17, 6, DEVICE)
    observations, rewards, dones = np.zeros((1, 17)), np.zeros(1), np.zeros(1, bool)
    statistics = EpisodeStatistics(1)
    rows += [
        ("HalfCheetah-v5 vector env step", lambda: envs.step(actions)),
        ("replay buffer add, one row", lambda: buffer.add(observations, actions, rewards,
                                                          observations, dones)),
        ("episode statistics update", lambda: statistics.update(rewards, dones, dones)),
    ]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for label, function in rows:
        calls = 2000 if "env step" in label else 5000
        print(f"{label:50s} {per_call_us(function, calls):8.2f} µs")


if __name__ == "__main__":
    raise SystemExit(main())
