"""K seeds in one process: env steps/s per seed and in all, by K and vector env, with each K's
update timed and profiled alone.

The training loop (``rl_graphstep.train.train``) runs SAC with ``--num-seeds K`` (seeds 1..K,
one env each, one update per env step, compiled CUDA graphs) with each vector env: sync (in
the process), async (gymnasium's, a process per env, through pipes), shared (worker
processes polling shared memory) or auto (the training default's choice for that K);
steps/s and host µs count the learning phase. Every loop runs before any profile: the
profiler slows every later CUDA call of its process. Then each K's update (all K seeds in
one graph) is timed alone and profiled (kernels per update, their device time). GPU memory
is the loop's peak (its buffer holds ``--steps`` rows per seed) and the replay buffer a seed
group would hold at the default 1,000,000 rows per seed.

    python benchmarks/seeds.py --envs HalfCheetah-v5 Hopper-v5 --seeds 1 2 4 8 16 32

On the CPU (``--device cpu``, a smoke run) the loops run uncompiled and eager, without the
update's profile.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import torch
from cli import cli_main, nonnegative_int, positive_int
from learner import built_learner
from throughput import profile_updates, time_updates

from rl_graphstep.run.flags import load_config
from rl_graphstep.settings.plan import matmul_precision
from rl_graphstep.train import train

DEFAULT_ROWS = 1_000_000


@dataclass
class Loop:
    """One loop's figures: the vector env it ran (``auto``'s choice), iterations/s (each steps
    every seed's env once), host µs per iteration, peak GPU bytes."""

    vec_env: str
    iterations: float
    host_us: float | None
    peak_bytes: int


def run_loop(env_id: str, seeds: int, vec_env: str, steps: int, learning_starts: int,
             device: str, log_dir: str, extra: Sequence[str] = ()) -> Loop:
    """The loop of K seeds as the benchmarks run it; ``extra``: more training flags, after
    these (so they win)."""
    flags = ["--graph", "on", "--compile", "on"] if device == "cuda" else ["--graph", "off"]
    cfg = load_config(["--env", env_id, "--num-seeds", str(seeds), "--vec-env", vec_env,
                       "--device", device, *flags, "--total-timesteps", str(steps),
                       "--learning-starts", str(learning_starts), "--buffer-size", str(steps),
                       "--log-dir", log_dir, "--no-progress", *extra])
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    summary = train(cfg)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return Loop(summary["vec_env"], summary["learning_sps"], summary["host_us_per_iteration"], peak)


def buffer_bytes(env_id: str, seeds: int) -> int:
    """The replay buffer of ``seeds`` seeds at the default rows per seed (float32 rows of
    observation, action, reward, next observation, termination)."""
    env = gym.make(env_id)
    row = 2 * env.observation_space.shape[0] + env.action_space.shape[0] + 2
    env.close()
    return seeds * DEFAULT_ROWS * row * 4


def update_figures(env_id: str, seeds: int, updates: int) -> tuple[float, float, float]:
    """(µs per update, kernels per update, kernel µs per update) of K seeds' update."""
    cfg = load_config(["--env", env_id, "--num-seeds", str(seeds), "--graph", "on",
                       "--compile", "on"])
    env = gym.make(env_id)
    device = torch.device("cuda")
    with matmul_precision(cfg.tf32):
        learner = built_learner(cfg, env.observation_space, env.action_space, device)
        for _ in range(20):
            learner.update()
        torch.cuda.synchronize(device)
    env.close()
    us = time_updates(learner, updates)
    return (us, *profile_updates(learner, False, f"{env_id} K={seeds}"))


@cli_main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5"])
    parser.add_argument("--seeds", nargs="+", type=positive_int, default=[1, 2, 4, 8, 16, 32],
                        help="the group sizes K to measure")
    parser.add_argument("--vec-envs", nargs="+", default=["sync", "async", "shared"],
                        choices=["auto", "sync", "async", "shared"],
                        help="auto: the training default's choice per K")
    parser.add_argument("--steps", type=positive_int, default=30_000,
                        help="env steps per seed (at 6,000, one seed's figure spread over "
                        "1,800-2,600 env steps/s)")
    parser.add_argument("--learning-starts", type=nonnegative_int, default=1_000)
    parser.add_argument("--updates", type=positive_int, default=500,
                        help="updates timed alone per K")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("seeds.py measures the GPU loop: it needs CUDA (or --device cpu)")
    where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"# {where}, torch {torch.__version__}; {args.steps} steps per seed, learning from "
          f"step {args.learning_starts}", flush=True)
    runs = [(env_id, k, vec) for env_id in args.envs for k in args.seeds for vec in args.vec_envs]
    loops: dict[tuple[str, int, str], Loop] = {}
    with tempfile.TemporaryDirectory() as log_dir:
        for env_id, k, vec in runs:
            loops[env_id, k, vec] = loop = run_loop(env_id, k, vec, args.steps,
                                                    args.learning_starts, args.device, log_dir)
            print(f"  {env_id} K={k} {vec} ({loop.vec_env}): {loop.iterations:,.0f} iterations/s, "
                  f"{k * loop.iterations:,.0f} env steps/s in all", flush=True)
    updates = {}
    if args.device == "cuda":
        updates = {(env_id, k): update_figures(env_id, k, args.updates)
                   for env_id in args.envs for k in args.seeds}
    for env_id in args.envs:
        print(f"\n{env_id}\n")
        print("| K | envs | env steps/s per seed | in all | per seed vs K=1 | host µs per "
              "iteration | µs per update | kernels per update | kernel µs | loop peak GPU "
              "MiB | buffer at 1M rows/seed GiB |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k, vec in ((k, vec) for k in args.seeds for vec in args.vec_envs):
            loop = loops[env_id, k, vec]
            single = loops.get((env_id, 1, vec))
            ratio = f"{loop.iterations / single.iterations:.2f}x" if single else "-"
            host = f"{loop.host_us:,.0f}" if loop.host_us is not None else "-"
            us, kernels, kernel_us = updates.get((env_id, k), (float("nan"),) * 3)
            envs = f"{vec} ({loop.vec_env})" if vec == "auto" else vec
            print(f"| {k} | {envs} | {loop.iterations:,.0f} | {k * loop.iterations:,.0f} | "
                  f"{ratio} | {host} | {us:,.0f} | {kernels:.0f} | {kernel_us:,.0f} | "
                  f"{loop.peak_bytes / 2**20:,.0f} | {buffer_bytes(env_id, k) / 2**30:.1f} |",
                  flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
