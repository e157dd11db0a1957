"""Where a PPO rollout's wall time goes: its env steps (acting, the envs, the host's
bookkeeping) against its update (GAE and every minibatch of every epoch).

The real loop (``rl_graphstep.train.train --algo ppo``) runs for ``--rollouts`` rollouts; each
update is timed from its call to the device's end of it (the device is synchronised before
and after), the rest of the rollout is the steps. The first ``--burn-in`` rollouts (capture,
compilation) are not counted. Without synchronising, the update's kernels would overlap the
next rollout's first steps; synchronised, each part is its own.

    python benchmarks/ppo_split.py --env HalfCheetah-v5                       # CleanRL's settings
    python benchmarks/ppo_split.py --env HalfCheetah-v5 --flags "--num-envs 64 --num-steps 32"
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import tempfile
import time
from collections.abc import Sequence

import torch

from rl_graphstep.learners.onpolicy import OnPolicyLearner
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import train


def split_rollouts(cfg_args: list[str], device: torch.device) -> list[tuple[float, float]]:
    """Train as ``cfg_args`` say; per rollout, (seconds of its steps, seconds of its update)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    original = OnPolicyLearner.update
    parts: list[tuple[float, float]] = []
    last = [time.perf_counter()]  # when the last update ended (or the run began)

    def timed(self: OnPolicyLearner, next_values: torch.Tensor) -> None:
        sync()
        called = time.perf_counter()
        original(self, next_values)
        sync()
        done = time.perf_counter()
        parts.append((called - last[0], done - called))
        last[0] = done

    OnPolicyLearner.update = timed  # type: ignore[method-assign]
    try:
        train(load_config(cfg_args))
    finally:
        OnPolicyLearner.update = original  # type: ignore[method-assign]
    return parts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--burn-in", type=int, default=2, help="rollouts not counted")
    parser.add_argument("--flags", default="", help="more training flags, one string")
    parser.add_argument("--device", choices=["cuda", "cpu"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if not 0 <= args.burn_in < args.rollouts:
        parser.error(f"--burn-in takes 0 .. --rollouts - 1; got {args.burn_in} of "
                     f"{args.rollouts}")
    with tempfile.TemporaryDirectory() as log_dir:
        base = ["--algo", "ppo", "--env", args.env, "--device", args.device, "--log-dir",
                log_dir, "--no-progress", *shlex.split(args.flags)]
        cfg = load_config(base)
        rollout = cfg.num_envs * cfg.num_steps  # env steps of a seed's rollout
        cfg_args = [*base, "--total-timesteps", str(args.rollouts * rollout),
                    "--checkpoint-every", str(10 * args.rollouts * rollout)]
        parts = split_rollouts(cfg_args, torch.device(args.device))[args.burn_in:]
    if not parts:
        raise SystemExit("no rollout was timed: raise --rollouts")
    steps = statistics.median(p[0] for p in parts)
    update = statistics.median(p[1] for p in parts)
    vector_steps = cfg.num_steps
    print(f"{args.env}, {args.device}, {cfg.num_seeds} seed(s) x {cfg.num_envs} env(s) x "
          f"{cfg.num_steps} steps, {cfg.num_minibatches} minibatches x {cfg.update_epochs} "
          f"epochs; medians of rollouts {args.burn_in + 1}-{args.rollouts}")
    print("| part | ms per rollout | µs per vector step | share |")
    print("|---|---:|---:|---:|")
    total = steps + update
    for name, seconds in (("env steps (acting, envs, bookkeeping)", steps),
                          ("update (GAE, minibatches)", update)):
        print(f"| {name} | {seconds * 1e3:,.1f} | {seconds * 1e6 / vector_steps:,.1f} | "
              f"{seconds / total:.0%} |")
    minibatches = cfg.num_minibatches * cfg.update_epochs
    print(f"env steps/s: {rollout / total:,.0f}; update: {update * 1e6 / minibatches:,.0f} µs "
          f"per minibatch ({minibatches} a rollout)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
