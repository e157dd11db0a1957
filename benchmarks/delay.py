"""The delayed actor update: a host-side counter against a device-side mask, for TD3.

The counter (what rl_graphstep does) replays the actor graph only on every
``policy_frequency``-th update. A device-side mask would replay it on every update and zero
the result on the others, so it costs at least as much as replaying the actor step every
time (``policy_frequency=1``); this measures both, side by side, in microseconds per update.

    python benchmarks/delay.py [--updates 3000]
"""

from __future__ import annotations

import argparse
import time

import torch
from cli import cli_main, positive_int
from learner import box, built_learner

from rl_graphstep.settings.config import Config


def time_updates(policy_frequency: int, updates: int, device: torch.device) -> float:
    """µs per TD3 update from a replay sample; on CUDA the separate step graphs, replayed
    one after the other, so that the actor step's graph is what the delay skips."""
    cfg = Config(algo="td3", policy_frequency=policy_frequency, compile="off")
    learner = built_learner(cfg, box(17), box(6), device, fuse=False)
    for _ in range(20):
        learner.update()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(updates):
        learner.update()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / updates * 1e6


@cli_main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=positive_int, default=3000)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    counter = time_updates(2, args.updates, device)
    every = time_updates(1, args.updates, device)
    print(f"# TD3 update, 17-dim obs, 6-dim action, batch 256, {device}, torch {torch.__version__}")
    print("| delayed actor (delay 2) | µs per update |\n|---|---:|")
    print(f"| host counter: actor replayed every 2nd update | {counter:.1f} |")
    print(f"| device mask (lower bound: actor replayed every update) | {every:.1f} |")


if __name__ == "__main__":
    raise SystemExit(main())
