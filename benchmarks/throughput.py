"""SAC speed by loop mode, side by side in one process: env steps/s, µs per update, host µs
per env step, kernels per update and the kernel-time floor.

Each mode runs the real training loop (``rl_graphstep.train.train``): one env, one update per
env step, batch 256, 256-256 networks; steps/s and host time count the learning phase only
(capture and compilation are reported apart). Then each mode's update alone is timed (µs per
critic + actor update, synchronised at the end) and profiled: kernels per update and the sum
of their device times, the floor an update with no launch gaps would reach.

The phases run in that order for all modes of all envs: every loop, then every timing, then
every profile. The profiler leaves CUDA's profiling interface attached to the process after it
stops (pytorch/pytorch#144455), so that every later CUDA call costs more host time: the likely
reason why a loop run after another mode's profile once measured 45% slower.

The modes without "overlap" in their name wait for each iteration's updates before the envs
step (``torch.cuda.synchronize`` after ``OffPolicyLearner.update``, patched in this process
only): the baseline that overlap is measured against. The product always overlaps.

    python benchmarks/throughput.py --envs HalfCheetah-v5 --steps 10000 --eager-steps 2000

``--update-flags`` instead times and profiles one iteration's updates alone, built from any
training flags (a config, K seeds, a batch size), with its kernels by name: where the update
of a many-env recipe spends its time.

    python benchmarks/throughput.py --update-flags "--config sac_mujoco_parallel --num-seeds 5 \
        --compile on"

(``--compile auto`` counts no updates ahead here, so it does not compile: say ``on``.)
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gymnasium as gym
import torch
from cli import (
    BenchmarkError,
    check_training,
    cli_main,
    nonnegative_int,
    positive_int,
    split_flags,
)
from learner import built_learner
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.run.flags import load_config
from rl_graphstep.settings.plan import matmul_precision
from rl_graphstep.train import train

# name -> flags; "graph" modes without overlap wait for the updates every env step (see
# AWAITED). Modes without "action stream" in their name act in line, on the updates' stream.
IN_LINE = ["--action-stream", "off"]
MODES: dict[str, list[str]] = {
    "eager": ["--graph", "off"],
    "graph": ["--graph", "on", "--compile", "off", *IN_LINE],
    "graph+compile": ["--graph", "on", "--compile", "on", *IN_LINE],
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
# The modes whose loop waits for each iteration's updates before the envs step.
AWAITED = {"graph", "graph+compile"}


@dataclass
class Row:
    mode: str
    sps: float
    host_us: float
    setup_s: float
    update_us: float
    kernels: float
    floor_us: float


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def updates_awaited(mode: str) -> Iterator[None]:
    """In the modes of ``AWAITED``, every ``OffPolicyLearner.update`` is followed by a wait
    for the device while inside, so the envs step only after the updates ended."""
    if mode not in AWAITED:
        yield
        return
    update = OffPolicyLearner.update

    def update_and_wait(learner: OffPolicyLearner) -> None:
        update(learner)
        synchronize(learner.device)

    OffPolicyLearner.update = update_and_wait  # type: ignore[method-assign]
    try:
        yield
    finally:
        OffPolicyLearner.update = update  # type: ignore[method-assign]


def run_loop(env_id: str, mode: str, steps: int, learning_starts: int, log_dir: str,
             seeds: int = 1) -> dict:
    """The training loop in ``mode`` (with ``seeds`` seeds, 1.. K, a buffer of ``steps`` rows
    per seed); its summary."""
    cfg = load_config(["--env", env_id, *MODES[mode], "--total-timesteps", str(steps),
                       "--learning-starts", str(learning_starts), "--buffer-size", str(steps),
                       "--log-dir", log_dir, "--no-progress", "--seed", "1",
                       "--num-seeds", str(seeds)])
    with updates_awaited(mode):
        return train(cfg)


def build_update(env_id: str, flags: list[str], device: torch.device | None = None
                 ) -> OffPolicyLearner:
    """The mode's learner with its updates built (on CUDA unless ``device`` says otherwise),
    over a buffer of 10,000 random rows, after 20 updates."""
    cfg = load_config(["--env", env_id, *flags])
    env = gym.make(env_id)
    device = device or torch.device("cuda")
    with matmul_precision(cfg.tf32):  # a captured graph keeps the kernels chosen here
        learner = built_learner(cfg, env.observation_space, env.action_space, device)
        for _ in range(20):
            learner.update()
        synchronize(device)
    return learner


def time_updates(learner: OffPolicyLearner, updates: int) -> float:
    """µs per update over ``updates`` updates, synchronised at the end."""
    with matmul_precision(learner.cfg.tf32):  # eager matmuls read it on every call
        began = time.perf_counter()
        for _ in range(updates):
            learner.update()
        synchronize(learner.device)
    return (time.perf_counter() - began) / updates * 1e6


def profile_update_alone(env_id: str, flags: list[str], updates: int) -> None:
    """One iteration's updates (``learner.update()``: ``--updates-per-step`` of them) built
    from ``flags`` on CUDA graphs: µs per iteration over ``updates`` iterations, then its
    kernels, their device time and the 40 largest kernels by name."""
    check_training(env_id, flags, "--update-flags")
    if not torch.cuda.is_available():
        raise BenchmarkError("--update-flags times the update on the GPU: it needs CUDA")
    learner = build_update(env_id, ["--graph", "on", *flags])
    cfg = learner.cfg
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {env_id} "
          f"{shlex.join(flags)}: {cfg.updates_per_step} update(s) of batch {cfg.batch_size} "
          f"x {cfg.num_seeds} seed(s) an iteration, {learner.plan.describe()}", flush=True)
    iteration_us = time_updates(learner, updates)
    kernels, kernel_us = profile_updates(learner, True, "one iteration")
    print(f"{iteration_us:,.0f} µs per iteration ({iteration_us / cfg.updates_per_step:,.0f} "
          f"per update), {kernels:,.0f} kernels, {kernel_us:,.0f} µs of kernel time "
          f"({kernel_us / iteration_us:.0%} of it)")


def profile_updates(learner: OffPolicyLearner, breakdown: bool, mode: str
                    ) -> tuple[float, float]:
    """(kernels per update, kernel µs per update) from the torch profiler."""
    profiled = 20  # even: SAC's delayed actor runs twice every other update
    with matmul_precision(learner.cfg.tf32), \
            profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled):
            learner.update()
        synchronize(learner.device)
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


@cli_main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5"])
    parser.add_argument("--steps", type=positive_int, default=11_000)
    parser.add_argument("--eager-steps", type=positive_int, default=3_000,
                        help="steps of the (slow) eager mode")
    parser.add_argument("--learning-starts", type=nonnegative_int, default=1_000)
    parser.add_argument("--updates", type=positive_int, default=2_000,
                        help="updates timed alone per mode")
    parser.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=list(MODES))
    parser.add_argument("--breakdown", action="store_true",
                        help="also list each mode's kernels per update by name")
    parser.add_argument("--profile-host", metavar="MODE", choices=list(MODES),
                        help="instead: profile the host side of one mode's loop (cProfile)")
    parser.add_argument("--host-split", metavar="MODE", nargs="+", choices=list(MODES),
                        help="instead: time the parts of each mode's loop (µs per env step)")
    parser.add_argument("--num-seeds", type=positive_int, default=1,
                        help="seeds trained together in --profile-host and --host-split")
    parser.add_argument("--update-flags", metavar="FLAGS",
                        help="instead: time and profile one iteration's updates alone, built "
                        "with these training flags (on the first of --envs), kernels by name")
    args = parser.parse_args()
    if args.update_flags is not None:
        profile_update_alone(args.envs[0], split_flags(args.update_flags, "--update-flags"),
                             args.updates)
        return
    if args.profile_host:
        profile_host(args.envs[0], args.profile_host, args.steps, args.learning_starts,
                     args.num_seeds)
        return
    if args.host_split:
        for mode in args.host_split:
            host_split(args.envs[0], mode, args.steps, args.learning_starts, args.num_seeds)
        return
    if not torch.cuda.is_available():
        raise SystemExit("throughput.py measures the GPU loop: it needs CUDA")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; learning from step "
          f"{args.learning_starts}, {args.steps} steps ({args.eager_steps} eager)")
    runs = [(env_id, mode) for env_id in args.envs for mode in args.modes]
    loops = {}
    with tempfile.TemporaryDirectory() as log_dir:
        for env_id, mode in runs:
            steps = args.eager_steps if mode == "eager" else args.steps
            loops[env_id, mode] = run_loop(env_id, mode, steps, args.learning_starts, log_dir)
            print(f"  {env_id} {mode}: {loops[env_id, mode]['learning_sps']:,.0f} steps/s",
                  flush=True)
    learners = {run: build_update(run[0], MODES[run[1]]) for run in runs}
    update_us = {run: time_updates(learners[run], args.updates) for run in runs}
    # Last, for every env: see the module's docstring.
    kernels = {run: profile_updates(learners[run], args.breakdown, f"{run[0]} {run[1]}")
               for run in runs}
    for env_id in args.envs:
        print_table(env_id, [
            Row(mode, loops[env_id, mode]["learning_sps"],
                loops[env_id, mode]["host_us_per_iteration"],
                loops[env_id, mode]["build_seconds"], update_us[env_id, mode],
                *kernels[env_id, mode])
            for mode in args.modes])


@contextlib.contextmanager
def calling_at_learning(on_learning: Callable[[], object]) -> Iterator[None]:
    """While inside, a training loop calls ``on_learning()`` once its learner is built
    (capture and compilation done), as the learning phase begins."""
    import rl_graphstep.train as loop

    start_learning = loop._start_learning

    def start_then_signal(run: loop.Run) -> None:
        start_learning(run)
        on_learning()

    loop._start_learning = start_then_signal
    try:
        yield
    finally:
        loop._start_learning = start_learning


def run_loop_learning(env_id: str, mode: str, steps: int, learning_starts: int,
                      on_learning: Callable[[], object], seeds: int = 1) -> dict:
    """:func:`run_loop`, calling ``on_learning()`` as the learning phase begins."""
    with calling_at_learning(on_learning), tempfile.TemporaryDirectory() as log_dir:
        return run_loop(env_id, mode, steps, learning_starts, log_dir, seeds)


def profile_host(env_id: str, mode: str, steps: int, learning_starts: int,
                 seeds: int = 1) -> None:
    """Where the loop's host time goes during learning: cProfile from the moment the steps
    are built (compilation excluded), by own time. The profiler inflates Python-heavy
    functions, so read it as proportions."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    try:
        summary = run_loop_learning(env_id, mode, steps, learning_starts, profiler.enable,
                                    seeds)
    finally:
        profiler.disable()
    print(f"{env_id} {mode} ({' '.join(MODES[mode])}), {seeds} seed(s): "
          f"{summary['learning_sps']:.0f} steps/s per seed under cProfile")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def host_split(env_id: str, mode: str, steps: int, learning_starts: int,
               seeds: int = 1) -> None:
    """Wall µs per env step of the learning phase (per iteration, where every seed's envs
    step once), by part of the loop: each part's calls are wrapped in a timer (about 0.2 µs
    each), the rest is the loop's own code. Graph launches are also counted alone, whoever
    makes them."""
    import rl_graphstep.run.collector as collecting
    import rl_graphstep.train as loop
    from rl_graphstep.envs.vector import EnvStepper, EpisodeStatistics
    from rl_graphstep.learners.metrics import MetricSums
    from rl_graphstep.run.acting import ActionPipe
    from rl_graphstep.run.collector import Collector

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
        (OffPolicyLearner, "update", "updates: OffPolicyLearner.update"),
        (MetricSums, "add", "updates: metric sums (where not in the graph)"),
        (EnvStepper, "start", "env: start"),
        (EnvStepper, "finish", "env: finish (the step, or the wait for it)"),
        (EpisodeStatistics, "update", "env: episode statistics"),
        (collecting, "true_next_observations", "buffer: true next observations"),
        (ReplayBuffer, "add", "buffer: add"),
        (loop, "_log", "logging"),
        # Indented labels are not parts of their own: Collector.step holds the action, env,
        # buffer and update parts above.
        (Collector, "step", "  Collector.step, of the parts above"),
        (torch.cuda.CUDAGraph, "replay", "  of which graph replays"),
    ]:
        timed(owner, name, label)
    try:
        summary = run_loop_learning(env_id, mode, steps, learning_starts,
                                    lambda: learning.__setitem__(0, True), seeds)
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)
    learning_steps = steps - learning_starts
    per_step = 1e6 / summary["learning_sps"]
    print(f"\n{env_id} {mode}, {seeds} seed(s): {summary['learning_sps']:,.0f} steps/s per "
          f"seed, {per_step:,.0f} µs per env step, over {learning_steps} steps")
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
    raise SystemExit(main())
