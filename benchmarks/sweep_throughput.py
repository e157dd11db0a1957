"""A sweep's env steps/s in all against one trial alone: the same config trained once in this
process, then ``--trials`` copies of it as one sweep on a local Ray, packed by
``--cpus-per-trial`` and ``--gpus-per-trial`` (fractions share a GPU).

Both figures are wall-clock: every env step of the trials over the whole time, setup
included (the sweep's includes Ray's start, the trial's its update build), so a short run
understates what packing gives. Needs the ``sweep`` extra.

    python benchmarks/sweep_throughput.py --env HalfCheetah-v5 --steps 5000 --trials 4 \\
        --gpus-per-trial 0.25
    python benchmarks/sweep_throughput.py --env Pendulum-v1 --steps 3000 --trials 2 \\
        --cpus-per-trial 1 --device cpu
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml
from cli import cli_main, nonnegative_int, positive_float, positive_int

from rl_graphstep.settings.config import config_from_dict
from rl_graphstep.sweep import main as sweep_main
from rl_graphstep.train import train


def base_config(args: argparse.Namespace) -> dict[str, object]:
    """The training settings every run here shares."""
    return {"env_id": args.env, "total_timesteps": args.steps, "device": args.device,
            "learning_starts": min(args.learning_starts, args.steps // 2), "progress": False}


def alone(args: argparse.Namespace, folder: Path) -> float:
    """One trial's run in this process: env steps/s over its wall time."""
    cfg = config_from_dict({**base_config(args), "log_dir": str(folder / "alone")})
    start = time.perf_counter()
    train(cfg)
    return args.steps / (time.perf_counter() - start)


def swept(args: argparse.Namespace, folder: Path) -> float:
    """``--trials`` copies of the run as one sweep: env steps/s of all trials over its wall
    time."""
    spec = {"name": "packed", "base": base_config(args), "num_samples": args.trials}
    path = folder / "packed.yaml"
    path.write_text(yaml.safe_dump(spec))
    start = time.perf_counter()
    code = sweep_main([str(path), "--log-dir", str(folder / "sweeps"),
                       "--cpus-per-trial", str(args.cpus_per_trial),
                       "--gpus-per-trial", str(args.gpus_per_trial)])
    if code != 0:
        raise SystemExit(f"the sweep exited with {code}")
    return args.trials * args.steps / (time.perf_counter() - start)


@cli_main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=positive_int, default=5000, help="env steps per trial")
    parser.add_argument("--learning-starts", type=nonnegative_int, default=1000)
    parser.add_argument("--trials", type=positive_int, default=4)
    parser.add_argument("--cpus-per-trial", type=positive_float, default=1)
    parser.add_argument("--gpus-per-trial", type=float, default=0)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one = alone(args, Path(tmp))
        packed = swept(args, Path(tmp))
    print(f"\n| env | trials | cpus/trial | gpus/trial | one alone, steps/s | sweep, steps/s "
          f"in all | ratio |\n|---|---:|---:|---:|---:|---:|---:|\n| {args.env} | "
          f"{args.trials} | {args.cpus_per_trial:g} | {args.gpus_per_trial:g} | {one:,.0f} | "
          f"{packed:,.0f} | {packed / one:.2f}x |")


if __name__ == "__main__":
    raise SystemExit(main())
