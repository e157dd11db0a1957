"""Environment steps per second during learning: captured graphs against eager, side by side.

Runs the real training loop (``rl_graphstep.train.train``) for each env and mode in one
process and prints a markdown table. Steps/s counts only the learning phase (after
``learning_starts``), one update per env step, batch 256, 256-256 networks.

    python benchmarks/throughput.py --envs Pendulum-v1 HalfCheetah-v5 --steps 6000
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from rl_graphstep.config import load_config
from rl_graphstep.train import train


def measure(env_id: str, graph: str, steps: int, learning_starts: int, log_dir: str) -> float:
    cfg = load_config([
        "--env", env_id, "--graph", graph, "--total-timesteps", str(steps),
        "--learning-starts", str(learning_starts), "--buffer-size", str(steps),
        "--log-dir", log_dir, "--no-progress", "--seed", "1",
    ])
    return train(cfg)["learning_sps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["Pendulum-v1", "HalfCheetah-v5"])
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--learning-starts", type=int, default=1000)
    args = parser.parse_args()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"# {device}, torch {torch.__version__}, {args.steps} steps, learning from "
          f"{args.learning_starts}")
    modes = ["on", "off"] if torch.cuda.is_available() else ["off"]
    print("| env | " + " | ".join(f"graph {m} steps/s" for m in modes) + " | ratio |")
    print("|---|" + "---:|" * (len(modes) + 1))
    with tempfile.TemporaryDirectory() as log_dir:
        for env_id in args.envs:
            sps = [measure(env_id, m, args.steps, args.learning_starts, log_dir) for m in modes]
            ratio = f"{sps[0] / sps[-1]:.1f}x" if len(sps) > 1 else "-"
            print(f"| {env_id} | " + " | ".join(f"{s:.0f}" for s in sps) + f" | {ratio} |",
                  flush=True)


if __name__ == "__main__":
    main()
