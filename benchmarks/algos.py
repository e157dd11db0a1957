"""Algorithms side by side in one process: each arm's update alone (µs per update) and the
training loop's env steps/s, so that what an algorithm (or a setting) costs over another is
measured on one machine in one call.

An arm is a name and training flags (``crossq=--algo crossq``), run with the YAML file its
algorithm and task pick (``configs/<algo>_mujoco.yaml`` on a MuJoCo task: CrossQ's
2,048-wide critic, its actor every 3rd update), compiled CUDA graphs on the GPU. The update
is timed over a buffer of random rows (µs per update, averaged over the updates with and
without the actor's); the loop runs from ``--learning-starts`` and counts its learning phase.

    python benchmarks/algos.py --env HalfCheetah-v5 --num-seeds 5 --arm "sac=--algo sac" \
        --arm "crossq=--algo crossq" --arm "crossq+tf32=--algo crossq --tf32"
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence

import gymnasium as gym
import torch
from cli import check_training, cli_main, nonnegative_int, positive_int
from recipes import parse_arm
from throughput import build_update, time_updates

from rl_graphstep.run.flags import load_config
from rl_graphstep.settings.config import Config
from rl_graphstep.train import train


def flags_of(device: str) -> list[str]:
    """Compiled graphs on CUDA, the eager loop elsewhere."""
    return ["--graph", "on", "--compile", "on"] if device == "cuda" else ["--graph", "off"]


def critic_parameters(cfg: Config) -> int:
    """Parameters of one seed's default critic (all its members)."""
    from rl_graphstep.algorithms import algorithm_class

    env = gym.make(cfg.env_id)
    critic = algorithm_class(cfg.algo).default_critic(env.observation_space, env.action_space,
                                                      cfg)
    env.close()
    return sum(p.numel() for p in critic.parameters())


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--arm", action="append", metavar="NAME=FLAGS",
                        help="an algorithm and its flags (default: sac and crossq)")
    parser.add_argument("--steps", type=positive_int, default=15_000, help="env steps of each loop")
    parser.add_argument("--learning-starts", type=nonnegative_int, default=1_000)
    parser.add_argument("--updates", type=positive_int, default=2_000, help="updates timed alone")
    parser.add_argument("--num-seeds", type=positive_int, default=1)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args(argv)
    try:
        arms = [parse_arm(spec) for spec in args.arm or ["sac=--algo sac",
                                                          "crossq=--algo crossq"]]
    except ValueError as error:
        parser.error(str(error))
    for arm in arms:  # every arm's flags before the first arm runs
        check_training(args.env, [*flags_of(args.device), *arm.flags], f"arm {arm.name}")
    rows = []
    for arm in arms:
        base = ["--device", args.device, *flags_of(args.device), "--num-seeds",
                str(args.num_seeds), *arm.flags]
        with tempfile.TemporaryDirectory() as log_dir:
            summary = train(load_config([
                "--env", args.env, *base, "--total-timesteps", str(args.steps), "--learning-starts",
                str(args.learning_starts), "--buffer-size", str(args.steps), "--log-dir",
                log_dir, "--no-progress"]))
        learner = build_update(args.env, base, torch.device(args.device))
        cfg, us = learner.cfg, time_updates(learner, args.updates)
        rows.append((arm.name, critic_parameters(cfg), cfg.batch_size, cfg.policy_frequency,
                     us, summary["learning_sps"]))
        print(f"{arm.name}: {us:,.0f} µs per update, {summary['learning_sps']:,.0f} env steps/s",
              flush=True)
    print(f"\n{args.env}, {args.num_seeds} seed(s), {args.device}, torch {torch.__version__}\n")
    print("| arm | critic parameters | batch | actor every | µs per update | "
          "env steps/s per seed | vs first |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    first = rows[0][5]
    for name, params, batch, every, us, sps in rows:
        print(f"| {name} | {params:,} | {batch} | {every} | {us:,.0f} | {sps:,.0f} | "
              f"{sps / first:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
