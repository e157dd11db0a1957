"""Where an iteration of the training loop spends its time, on the host and on the GPU.

The real loop (``rl_graphstep.train.train``, SAC, compiled CUDA graphs, one env per seed unless
``--flags`` say otherwise) runs for K seeds; a window of its learning phase is profiled
(torch.profiler, CPU and CUDA), after ``--skip`` iterations of learning. For that window it
prints, per iteration: the wall time; the host's time in each of its parts (the action's
request and wait, the store of the last transition, the envs' start and the wait for them, the
updates' launch, the episodes' bookkeeping, the logging) and what none of them marks; the GPU
time of each stream (kernels and copies) and of all streams together (their union), the time
no stream is busy, and the kernels that take the most time per iteration on each stream.
``--update-kernels`` then lists the update's own kernels, measured alone, to tell the loop's
apart.

Tracing slows the host, the more so with the CPU traced (one seed's HalfCheetah iteration:
384 µs untraced, 940 traced with ``--gpu-only``, 1,370 with the CPU): compare the GPU's busy
times with the untraced loop's iteration time, not with the traced wall time. Run one K per
process: the profiler slows every later CUDA call of the process.

    python benchmarks/timeline.py --env HalfCheetah-v5 --seeds 8
    python benchmarks/timeline.py --env Humanoid-v5 --seeds 5 --vec-env shared --steps 200000 \
        --learning-starts 5000 --skip 500 --window 100 --flags "--config sac_mujoco_parallel"
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable

import torch
from cli import cli_main, nonnegative_int, positive_int, split_flags
from throughput import build_update, calling_at_learning, profile_updates
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

import rl_graphstep.train as training
from rl_graphstep.envs.vector import EnvStepper
from rl_graphstep.learners.offpolicy import OffPolicyLearner
from rl_graphstep.run.acting import ActionPipe
from rl_graphstep.run.collector import Collector
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import train

# The host's parts of an iteration, each marked where it is called: (owner, method, label).
# "iteration" (the collector's step) holds the first five; the episodes' bookkeeping and the
# logging run after it, in the loop.
HOST_PARTS = (
    (ActionPipe, "request", "action request"),
    (ActionPipe, "wait", "action wait"),
    (Collector, "flush", "store"),
    (EnvStepper, "start", "env start"),
    (OffPolicyLearner, "update", "update launch"),
    (EnvStepper, "finish", "env wait"),
    (training, "_episode_ended", "episode ended"),
    (training, "_log", "log"),
)

Interval = tuple[int, int]


def union_length(intervals: list[Interval]) -> int:
    """The total length of the union of ``intervals`` (start, end)."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def profiled_loop(cfg_args: list[str], skip: int, window: int, host: bool = True
                  ) -> tuple[profile, dict]:
    """Train as ``cfg_args`` say, profiling iterations ``skip`` .. ``skip + window`` of the
    learning phase (each marked ``iteration``, its host parts as ``HOST_PARTS`` name them). Without
    ``host`` only the GPU is traced: the marks are not recorded, and the host runs at about
    its unprofiled speed."""
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if host else [ProfilerActivity.CUDA]
    prof = profile(activities=activities)
    learning = [False]
    count = [0]
    originals: list[tuple[object, str, Callable]] = []

    def wrap(owner: object, name: str, label: str, counts: bool) -> None:
        original = getattr(owner, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            if not learning[0]:
                return original(*args, **kwargs)
            if counts:
                if count[0] == skip:
                    prof.start()
                elif count[0] == skip + window:
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
                    prof.stop()
                count[0] += 1
            with record_function(label):
                return original(*args, **kwargs)

        originals.append((owner, name, original))
        setattr(owner, name, wrapper)

    wrap(Collector, "step", "iteration", True)
    for owner, name, label in HOST_PARTS:
        wrap(owner, name, label, False)
    try:
        with calling_at_learning(lambda: learning.__setitem__(0, True)):
            summary = train(load_config(cfg_args))
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    if count[0] <= skip + window:
        raise SystemExit(f"the loop made {count[0]} learning iterations: fewer than --skip + "
                         "--window; raise --steps")
    return prof, summary


def report(prof: profile, window: int, top: int) -> None:
    events = prof.profiler.kineto_results.events()
    marks: dict[str, list[Interval]] = {"iteration": []}
    marks.update((label, []) for _, _, label in HOST_PARTS)
    streams: dict[int, list[tuple[int, int, str]]] = {}
    for e in events:
        if e.device_type() == DeviceType.CUDA:
            if e.name() in marks:  # a mark's span on the GPU, not work
                continue
            streams.setdefault(e.device_resource_id(), []).append(
                (e.start_ns(), e.end_ns(), e.name()))
        elif e.name() in marks:
            marks[e.name()].append((e.start_ns(), e.end_ns()))
    iterations = sorted(marks["iteration"])
    if iterations:  # from the first iteration's start to the last's
        n, lo, hi = len(iterations) - 1, iterations[0][0], iterations[-1][0]
    else:  # the GPU alone was traced: from its first kernel to its last
        work = [span for items in streams.values() for span in items]
        n, lo, hi = window, min(s for s, _, _ in work), max(e for _, e, _ in work)
    span = hi - lo

    def inside(intervals: list[Interval]) -> list[Interval]:
        return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]

    per = 1e-3 / n  # ns over the window -> µs per iteration
    waits = (f", of which the host waits for actions "
             f"{union_length(inside(marks['action wait'])) * per:,.1f} µs" if iterations else "")
    print(f"{n} iterations (of {window} profiled): {span * per:,.1f} µs per iteration{waits}")
    if iterations:  # the host's parts; what no part marks is the rest of the host's work
        parts = {label: union_length(inside(marks[label])) * per for _, _, label in HOST_PARTS}
        step = union_length(inside(iterations)) * per
        print("  host µs per iteration: " + ", ".join(
            f"{label} {us:,.1f}" for label, us in parts.items() if us > 0))
        outside = ("episode ended", "log")
        print(f"  in the collector's step, unmarked: "
              f"{step - sum(us for label, us in parts.items() if label not in outside):,.1f}; "
              f"in the loop outside it, unmarked: "
              f"{span * per - step - sum(parts[label] for label in outside):,.1f}")
    busy_all: list[Interval] = []
    for stream, items in sorted(streams.items(), key=lambda kv: -len(kv[1])):
        spans = inside([(s, e) for s, e, _ in items])
        busy_all += spans
        print(f"  stream {stream}: {union_length(spans) * per:,.1f} µs busy, "
              f"{len(spans) / n:.1f} kernels and copies per iteration")
        by_name: dict[str, list[int]] = {}
        for s, e, name in items:
            by_name.setdefault(name, []).append(e - s)
        for name, times in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]:
            print(f"      {sum(times) * per:7.1f} µs  {len(times) / n:5.1f} x  {name[:100]}")
    busy = union_length(busy_all)
    print(f"  any stream busy: {busy * per:,.1f} µs per iteration; no stream busy: "
          f"{(span - busy) * per:,.1f} µs")


@cli_main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--seeds", type=positive_int, default=8, help="the group size K")
    parser.add_argument("--vec-env", default="auto", choices=["auto", "sync", "async", "shared"])
    parser.add_argument("--steps", type=positive_int, default=6_000, help="env steps per seed")
    parser.add_argument("--learning-starts", type=nonnegative_int, default=1_000)
    parser.add_argument("--skip", type=nonnegative_int, default=2_000,
                        help="learning iterations before the window")
    parser.add_argument("--window", type=positive_int, default=300, help="iterations profiled")
    parser.add_argument("--top", type=positive_int, default=8, help="kernels listed per stream")
    parser.add_argument("--gpu-only", action="store_true",
                        help="trace the GPU alone, not the host (which then runs at about its "
                        "own speed)")
    parser.add_argument("--flags", default="", help="more training flags, one string (after "
                        "this script's own, so they may override them)")
    parser.add_argument("--update-kernels", action="store_true",
                        help="then list the kernels of the update alone, to tell them apart")
    args = parser.parse_args()
    flags = split_flags(args.flags, "--flags")
    if not torch.cuda.is_available():
        raise SystemExit("timeline.py profiles the GPU loop: it needs CUDA")
    with tempfile.TemporaryDirectory() as log_dir:
        prof, summary = profiled_loop(
            ["--env", args.env, "--num-seeds", str(args.seeds), "--vec-env", args.vec_env,
             "--graph", "on", "--compile", "on", "--total-timesteps", str(args.steps),
             "--learning-starts", str(args.learning_starts), "--buffer-size", str(args.steps),
             "--log-dir", log_dir, "--no-progress", *flags],
            args.skip, args.window,
            host=not args.gpu_only)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.env}, K="
          f"{args.seeds}, {summary['vec_env']} envs: {summary['learning_sps']:,.0f} env steps/s "
          "per seed over the learning phase (the window profiled included)")
    report(prof, args.window, args.top)
    if args.update_kernels:
        learner = build_update(args.env, ["--num-seeds", str(args.seeds), "--graph", "on",
                                          "--compile", "on"])
        profile_updates(learner, True, f"{args.env} K={args.seeds}, the update alone")


if __name__ == "__main__":
    raise SystemExit(main())
