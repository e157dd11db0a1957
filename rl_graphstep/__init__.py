"""rl_graphstep: off-policy actor-critic agents whose updates are captured as CUDA graphs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_graphstep.graphstep import (
        CudaGraphAdaptationStep,
        EagerAdaptationStep,
        GradientTransform,
        TensorLoss,
        make_adaptation_step,
    )
    from rl_graphstep.guards import GradNormClip, clip_grad_norm

# Each public name and the module that defines it.
_HOMES = {
    "CudaGraphAdaptationStep": "rl_graphstep.graphstep",
    "EagerAdaptationStep": "rl_graphstep.graphstep",
    "GradNormClip": "rl_graphstep.guards",
    "GradientTransform": "rl_graphstep.graphstep",
    "TensorLoss": "rl_graphstep.graphstep",
    "clip_grad_norm": "rl_graphstep.guards",
    "make_adaptation_step": "rl_graphstep.graphstep",
}
__all__ = [
    "CudaGraphAdaptationStep",
    "EagerAdaptationStep",
    "GradNormClip",
    "GradientTransform",
    "TensorLoss",
    "clip_grad_norm",
    "make_adaptation_step",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported on first use, not with the package: `python -m rl_graphstep.train` imports the
    # package before the entry module runs, and the entry can only turn a Ctrl-C during the
    # seconds torch takes to import into one line once its own code is running.
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'rl_graphstep' has no attribute {name!r}")
