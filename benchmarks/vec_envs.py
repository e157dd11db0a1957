"""µs per vector step of the three vector envs (sync, async, shared) by env count, no learning.

Each kind steps zero actions ``--steps`` times after 50 warm-up steps; the envs autoreset as
in training (SAME_STEP). ``shared`` uses one worker per CPU but one, so on a small machine
several envs share a worker.

    python benchmarks/vec_envs.py --envs Pendulum-v1 HalfCheetah-v5 --counts 1 2 4 8
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from cli import cli_main, positive_int

from rl_graphstep.envs.vector import make_vec_env

KINDS = ("sync", "async", "shared")


def step_us(env_id: str, count: int, kind: str, steps: int) -> float:
    envs = make_vec_env(env_id, num_envs=count, seed=0, kind=kind)
    try:
        envs.reset(seed=0)
        actions = np.zeros((count, *envs.single_action_space.shape),
                           envs.single_action_space.dtype)
        for _ in range(50):
            envs.step(actions)
        began = time.perf_counter()
        for _ in range(steps):
            envs.step(actions)
        return (time.perf_counter() - began) / steps * 1e6
    finally:
        envs.close()


@cli_main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5"])
    parser.add_argument("--counts", nargs="+", type=positive_int, default=[1, 2, 4, 8])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--steps", type=positive_int, default=2_000)
    args = parser.parse_args()
    print(f"# {os.cpu_count()} CPUs; µs per vector step over {args.steps} steps\n")
    print("| env | envs | " + " | ".join(args.kinds) + " |")
    print("|---|---:|" + "---:|" * len(args.kinds))
    for env_id in args.envs:
        for count in args.counts:
            figures = [step_us(env_id, count, kind, args.steps) for kind in args.kinds]
            print(f"| {env_id} | {count} | " + " | ".join(f"{us:,.0f}" for us in figures)
                  + " |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
