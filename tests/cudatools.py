"""Small pieces the GPU tests of the adaptation step and its guards share: a seeded MLP, its
loss and fixed batches, all on CUDA."""

from __future__ import annotations

import torch
from torch import nn

DEVICE = "cuda"


def mlp(seed: int = 0, width: int = 64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2)).to(DEVICE)


def mse(prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((prediction - targets) ** 2).mean()


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return [(torch.randn(32, 4, device=DEVICE, generator=g),
             torch.randn(32, 2, device=DEVICE, generator=g)) for _ in range(n)]
