"""CPU updates with one intra-op thread against torch's default count, on an idle and a busy CPU.

Times SAC and TD3 updates (the built-in networks, batch 256, eager on the CPU) for Pendulum's
sizes and a MuJoCo-like size, with ``torch.set_num_threads(1)`` and with the count torch
started with, first on the CPU as it is (the load average says how idle that was), then
beside one CPU-burning process per core (the other work a shared machine or a CI runner
has). Prints a Markdown table of milliseconds per update (the median of a few rounds) and
the default/one-thread ratio.

    python benchmarks/cpu_threads.py [--updates 100] [--rounds 3] [--threads 4 8]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from cli import cli_main, positive_int
from learner import box, built_learner

from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.settings.config import Config

# (label, observation size, action size, hidden sizes)
SIZES = [("Pendulum 3/1, 256-256", 3, 1, (256, 256)),
         ("MuJoCo-like 17/6, 256-256", 17, 6, (256, 256))]
BURN = "while True:\n    pass\n"


def make_learner(algo: str, observation_size: int, action_size: int,
                 hidden_sizes: tuple[int, ...]) -> OffPolicyLearner:
    """The algorithm's learner with its default networks on the CPU (eager, as `train()`
    builds it there), over a buffer of random rows."""
    cfg = Config(algo=algo, hidden_sizes=hidden_sizes)
    return built_learner(cfg, box(observation_size), box(action_size), torch.device("cpu"),
                         rows=1_000)


def ms_per_update(learner: OffPolicyLearner, threads: int, updates: int, rounds: int) -> float:
    """Median over ``rounds`` of the mean time of ``updates`` updates (each from a replay
    sample), in milliseconds."""
    torch.set_num_threads(threads)
    for _ in range(10):  # warm-up
        learner.update()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(updates):
            learner.update()
        times.append((time.perf_counter() - start) / updates * 1e3)
    return statistics.median(times)


@contextmanager
def busy_cpu(processes: int) -> Iterator[None]:
    """``processes`` Python processes spinning on a core each while inside."""
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(processes)]
    try:
        time.sleep(0.5)  # let them get going
        yield
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


@cli_main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=positive_int, default=100, help="updates per round")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds per cell (median)")
    parser.add_argument("--algos", nargs="+", default=["sac", "td3"], choices=["sac", "td3"])
    parser.add_argument("--threads", nargs="*", type=positive_int, default=[],
                        help="thread counts to time besides 1 and torch's default")
    args = parser.parse_args()
    default = torch.get_num_threads()
    cores = os.cpu_count() or 1
    counts = sorted({1, default, *args.threads})
    print(f"# {platform.processor() or platform.machine()}, {cores} CPUs, torch "
          f"{torch.__version__}, default threads {default}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average before "
          f"{os.getloadavg()[0]:.2f}, batch 256, {args.updates} updates x {args.rounds} rounds")
    print("| CPU | algo | sizes | " + " | ".join(f"{n} thread{'s' * (n > 1)} ms" for n in counts)
          + f" | {default}/1 |")
    print("|---|---|---|" + "---:|" * (len(counts) + 1))
    for load in ("as found", f"+{cores} burners"):
        with busy_cpu(cores) if load != "as found" else _nothing():
            for algo in args.algos:
                for label, obs, act, hidden in SIZES:
                    learner = make_learner(algo, obs, act, hidden)
                    ms = {n: ms_per_update(learner, n, args.updates, args.rounds)
                          for n in counts}
                    print(f"| {load} | {algo} | {label} | "
                          + " | ".join(f"{ms[n]:.2f}" for n in counts)
                          + f" | {ms[default] / ms[1]:.2f}x |", flush=True)
    torch.set_num_threads(default)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


if __name__ == "__main__":
    raise SystemExit(main())
