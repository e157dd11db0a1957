"""Microseconds per update: the eager twin against the captured CUDA graph, side by side.

A 256-256 ReLU MLP critic-sized network (23 inputs, 1 output) at batch 256, with Adam and
gradient-norm clipping, the shape of one SAC critic head on HalfCheetah.

    python benchmarks/graphstep.py [--updates 2000] [--batch-size 256] [--device cuda]
"""

from __future__ import annotations

import argparse
import time

import torch
from cli import cli_main, positive_int
from torch import nn

from rl_graphstep.core.guards import clip_grad_norm
from rl_graphstep.graphstep import CudaGraphAdaptationStep, EagerAdaptationStep


def build(device: str, inputs: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
    ).to(device)


def mse(prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((prediction - targets) ** 2).mean()


def time_step(kind: type, device: str, args: argparse.Namespace) -> float:
    """Mean microseconds per update over ``args.updates`` calls, after a warm-up."""
    module = build(device, args.inputs, args.width)
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-4, capturable=device == "cuda")
    inputs = torch.randn(args.batch_size, args.inputs, device=device)
    targets = torch.randn(args.batch_size, 1, device=device)
    step = kind.capture(module, optimizer, inputs, targets, mse,
                        gradient_transform=clip_grad_norm(module.parameters(), 10.0))
    for _ in range(50):
        step(inputs, targets)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.updates):
        step(inputs, targets)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / args.updates * 1e6


@cli_main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=positive_int, default=2000)
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--inputs", type=positive_int, default=23)
    parser.add_argument("--width", type=positive_int, default=256)
    parser.add_argument("--device", choices=["cuda", "cpu"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU, and none is available; use --device cpu")
    where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"# {where}, torch {torch.__version__}, batch {args.batch_size}, "
          f"{args.inputs}-{args.width}-{args.width}-1 MLP, Adam + clip, {args.updates} updates")
    eager = time_step(EagerAdaptationStep, args.device, args)
    print("| step | µs per update | speed-up |\n|---|---:|---:|")
    print(f"| eager twin | {eager:.1f} | 1.0x |")
    if args.device == "cuda":
        graph = time_step(CudaGraphAdaptationStep, args.device, args)
        print(f"| CUDA graph | {graph:.1f} | {eager / graph:.1f}x |")


if __name__ == "__main__":
    raise SystemExit(main())
