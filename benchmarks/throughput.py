"""SAC speed by loop mode, side by side in one process: env steps/s, µs per update, host µs
per env step, kernels per update and the kernel-time floor.

Each mode runs the real training loop (``rl_graphstep.train.train``): one env, one update per
env step, batch 256, 256-256 networks; steps/s and host time count the learning phase only
(capture and compilation are reported apart). Then each mode's update alone is timed (µs per
critic + actor update, synchronised at the end) and profiled: kernels per update and the sum
of their device times, the floor an update with no launch gaps would reach.

The phases run in that order for all modes: every loop, then every timing, then every
profile. The profiler leaves CUDA's profiling interface attached to the process after it
stops (pytorch/pytorch#144455), so that every later CUDA call costs more host time: the likely
reason why a loop run after another mode's profile once measured 45% slower.

    python benchmarks/throughput.py --envs HalfCheetah-v5 --steps 10000 --eager-steps 2000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from rl_graphstep.algorithms import ALGORITHMS
from rl_graphstep.algorithms.base import ActorCritic
from rl_graphstep.buffer import ReplayBuffer
from rl_graphstep.flags import load_config
from rl_graphstep.train import matmul_precision, resolve_compile, resolve_graph, train

# name -> flags; "graph" modes without overlap wait for the updates every env step. Modes
# without "action stream" in their name act in line, on the updates' stream.
IN_LINE = ["--action-stream", "off"]
MODES: dict[str, list[str]] = {
    "eager": ["--graph", "off"],
    "graph": ["--graph", "on", "--compile", "off", "--no-overlap", *IN_LINE],
    "graph+compile": ["--graph", "on", "--compile", "on", "--no-overlap", *IN_LINE],
    "graph+overlap": ["--graph", "on", "--compile", "off", *IN_LINE],
    "graph+compile+overlap": ["--graph", "on", "--compile", "on", *IN_LINE],
    # The default on CUDA: the action on a stream of its own, beside the updates.
    "graph+compile+overlap+action stream (default)": ["--graph", "on", "--compile", "on"],
    "graph+compile+overlap+action stream+tf32": ["--graph", "on", "--compile", "on", "--tf32"],
    # With TF32 tensor-core matmuls.
    "graph+compile+overlap+tf32": ["--graph", "on", "--compile", "on", "--tf32", *IN_LINE],
    # The same with gymnasium's AsyncVectorEnv (a process per env, results pickled).
    "graph+compile+overlap+async envs": ["--graph", "on", "--compile", "on", "--vec-env",
                                         "async", *IN_LINE],
}
DEFAULT_MODES = [m for m in MODES if "async" not in m]


@dataclass
class Row:
    mode: str
    sps: float
    host_us: float
    setup_s: float
    update_us: float
    kernels: float
    floor_us: float


def run_loop(env_id: str, flags: list[str], steps: int, learning_starts: int,
             log_dir: str) -> dict:
    cfg = load_config(["--env", env_id, *flags, "--total-timesteps", str(steps),
                       "--learning-starts", str(learning_starts), "--buffer-size", str(steps),
                       "--log-dir", log_dir, "--no-progress", "--seed", "1"])
    return train(cfg)


def build_update(env_id: str, flags: list[str]) -> tuple[ActorCritic, ReplayBuffer]:
    """The mode's agent with its steps built, over a buffer of 10,000 random rows."""
    cfg = load_config(["--env", env_id, *flags])
    env = gym.make(env_id)
    obs_size, act_size = env.observation_space.shape[0], env.action_space.shape[0]
    device = torch.device("cuda")
    use_graph = resolve_graph(cfg, device)
    kind = ALGORITHMS[cfg.algo]
    torch.manual_seed(0)
    with matmul_precision(cfg):  # a captured graph keeps the kernels chosen here
        agent = kind(kind.default_actor(env.observation_space, env.action_space, cfg),
                     kind.default_critic(env.observation_space, env.action_space, cfg), cfg,
                     observation_size=obs_size, action_size=act_size, device=device,
                     use_graph=use_graph, compile=resolve_compile(cfg, use_graph, updates=0)[0])
        buffer = ReplayBuffer(10_000, obs_size, act_size, device)
        rng = np.random.default_rng(0)
        buffer.add(rng.normal(size=(10_000, obs_size)), rng.uniform(-1, 1, (10_000, act_size)),
                   rng.normal(size=10_000), rng.normal(size=(10_000, obs_size)),
                   np.zeros(10_000, bool))
        for _ in range(20):
            agent.update_from(buffer)
        torch.cuda.synchronize()
    return agent, buffer


def time_updates(agent: ActorCritic, buffer: ReplayBuffer, updates: int) -> float:
    """µs per update over ``updates`` updates, synchronised at the end."""
    with matmul_precision(agent.cfg):  # eager matmuls read it on every call
        began = time.perf_counter()
        for _ in range(updates):
            agent.update_from(buffer)
        torch.cuda.synchronize()
    return (time.perf_counter() - began) / updates * 1e6


def profile_updates(agent: ActorCritic, buffer: ReplayBuffer, breakdown: bool, mode: str
                    ) -> tuple[float, float]:
    """(kernels per update, kernel µs per update) from the torch profiler."""
    profiled = 20  # even: SAC's delayed actor runs twice every other update
    with matmul_precision(agent.cfg), \
            profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled):
            agent.update_from(buffer)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset"))]
    kernel_us = sum(e.device_time for e in kernels)
    if breakdown:
        by_name: dict[str, list[float]] = {}
        for e in kernels:
            by_name.setdefault(e.name, []).append(e.device_time)
        print(f"  kernels per update by name ({mode}):")
        for name, times in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:40]:
            print(f"    {len(times) / profiled:6.1f} x {sum(times) / len(times):6.1f} us  "
                  f"{name[:110]}")
    return len(kernels) / profiled, kernel_us / profiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5"])
    parser.add_argument("--steps", type=int, default=11_000)
    parser.add_argument("--eager-steps", type=int, default=3_000,
                        help="steps of the (slow) eager mode")
    parser.add_argument("--learning-starts", type=int, default=1_000)
    parser.add_argument("--updates", type=int, default=2_000,
                        help="updates timed alone per mode")
    parser.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=list(MODES))
    parser.add_argument("--breakdown", action="store_true",
                        help="also list each mode's kernels per update by name")
    parser.add_argument("--profile-host", metavar="MODE", choices=list(MODES),
                        help="instead: profile the host side of one mode's loop (cProfile)")
    parser.add_argument("--host-split", metavar="MODE", nargs="+", choices=list(MODES),
                        help="instead: time the parts of each mode's loop (µs per env step)")
    args = parser.parse_args()
    if args.profile_host:
        profile_host(args.envs[0], MODES[args.profile_host], args.steps, args.learning_starts)
        return
    if args.host_split:
        for mode in args.host_split:
            host_split(args.envs[0], mode, args.steps, args.learning_starts)
        return
    if not torch.cuda.is_available():
        raise SystemExit("throughput.py measures the GPU loop: it needs CUDA")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; learning from step "
          f"{args.learning_starts}, {args.steps} steps ({args.eager_steps} eager)")
    with tempfile.TemporaryDirectory() as log_dir:
        for env_id in args.envs:
            loops = {}
            for mode in args.modes:
                steps = args.eager_steps if mode == "eager" else args.steps
                loops[mode] = run_loop(env_id, MODES[mode], steps, args.learning_starts, log_dir)
                print(f"  {env_id} {mode}: {loops[mode]['learning_sps']:,.0f} steps/s",
                      flush=True)
            agents = {mode: build_update(env_id, MODES[mode]) for mode in args.modes}
            update_us = {mode: time_updates(*agents[mode], args.updates) for mode in args.modes}
            # Last: see the module's docstring.
            kernels = {mode: profile_updates(*agents[mode], args.breakdown, mode)
                       for mode in args.modes}
            print_table(env_id, [
                Row(mode, loops[mode]["learning_sps"], loops[mode]["host_us_per_iteration"],
                    loops[mode]["build_seconds"], update_us[mode], *kernels[mode])
                for mode in args.modes])


def run_loop_learning(env_id: str, flags: list[str], steps: int, learning_starts: int,
                      on_learning: Callable[[], object]) -> dict:
    """:func:`run_loop`, calling ``on_learning()`` once the steps are built (capture and
    compilation done), as the learning phase begins."""
    import rl_graphstep.train as loop

    build = loop._build_steps

    def build_then_signal(*args: object, **kwargs: object) -> object:
        pipe = build(*args, **kwargs)
        on_learning()
        return pipe

    loop._build_steps = build_then_signal
    try:
        with tempfile.TemporaryDirectory() as log_dir:
            return run_loop(env_id, flags, steps, learning_starts, log_dir)
    finally:
        loop._build_steps = build


def profile_host(env_id: str, flags: list[str], steps: int, learning_starts: int) -> None:
    """Where the loop's host time goes during learning: cProfile from the moment the steps
    are built (compilation excluded), by own time. The profiler inflates Python-heavy
    functions, so read it as proportions."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    try:
        summary = run_loop_learning(env_id, flags, steps, learning_starts, profiler.enable)
    finally:
        profiler.disable()
    print(f"{env_id} {' '.join(flags)}: {summary['learning_sps']:.0f} steps/s under cProfile")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def host_split(env_id: str, mode: str, steps: int, learning_starts: int) -> None:
    """Wall µs per env step of the learning phase, by part of the loop: each part's calls
    are wrapped in a timer (about 0.2 µs each), the rest is the loop's own code. Graph
    launches are also counted alone, whoever makes them."""
    import rl_graphstep.train as loop
    from rl_graphstep.acting import ActionPipe
    from rl_graphstep.algorithms.base import ActorCritic
    from rl_graphstep.envs import EnvStepper, EpisodeStatistics
    from rl_graphstep.metrics import MetricSums

    totals: dict[str, int] = {}
    counts: dict[str, int] = {}
    learning = [False]
    patched: list[tuple[object, str, object]] = []

    def timed(owner: object, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            if not learning[0]:
                return original(*args, **kwargs)
            began = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                totals[label] = totals.get(label, 0) + time.perf_counter_ns() - began
                counts[label] = counts.get(label, 0) + 1

        patched.append((owner, name, original))
        setattr(owner, name, wrapper)

    for owner, name, label in [
        (ActionPipe, "request", "action: request (copy in, replay, copy out)"),
        (ActionPipe, "wait", "action: wait"),
        (ActorCritic, "update_from", "updates: update_from"),
        (MetricSums, "add", "updates: metric sums (where not in the graph)"),
        (EnvStepper, "start", "env: start"),
        (EnvStepper, "finish", "env: finish (the step, or the wait for it)"),
        (EpisodeStatistics, "update", "env: episode statistics"),
        (loop, "true_next_observations", "buffer: true next observations"),
        (ReplayBuffer, "add", "buffer: add"),
        (loop, "_log", "logging"),
        (torch.cuda.CUDAGraph, "replay", "  of which graph replays"),
    ]:
        timed(owner, name, label)
    try:
        summary = run_loop_learning(env_id, MODES[mode], steps, learning_starts,
                                    lambda: learning.__setitem__(0, True))
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)
    learning_steps = steps - learning_starts
    per_step = 1e6 / summary["learning_sps"]
    print(f"\n{env_id} {mode}: {summary['learning_sps']:,.0f} steps/s, {per_step:,.0f} µs "
          f"per env step, over {learning_steps} steps")
    parts = 0.0
    for label, total in totals.items():
        us = total / 1e3 / learning_steps
        if not label.startswith(" "):
            parts += us
        print(f"  {label:48s} {us:8.1f} µs  ({counts[label] / learning_steps:.2f} calls)")
    print(f"  {'the loop itself (the rest)':48s} {per_step - parts:8.1f} µs")


def print_table(env_id: str, rows: list[Row]) -> None:
    eager = next((r.sps for r in rows if r.mode == "eager"), None)
    print(f"\n{env_id}\n")
    print("| mode | env steps/s | vs eager | µs per update | kernels per update | kernel "
          "floor µs | floor / update | host µs per env step | setup s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r.sps / eager:.1f}x" if eager else "-"
        print(f"| {r.mode} | {r.sps:,.0f} | {ratio} | {r.update_us:,.0f} | {r.kernels:.0f} | "
              f"{r.floor_us:,.0f} | {r.floor_us / r.update_us:.0%} | {r.host_us:,.0f} | "
              f"{r.setup_s:.1f} |", flush=True)


if __name__ == "__main__":
    main()
