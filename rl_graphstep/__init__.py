"""rl_graphstep: off-policy actor-critic agents whose updates are captured as CUDA graphs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from rl_graphstep.core.guards import GradNormClip, clip_grad_norm
    from rl_graphstep.graphstep import (
        CudaGraphAdaptationStep,
        EagerAdaptationStep,
        GradientTransform,
        TensorLoss,
        make_adaptation_step,
    )
    from rl_graphstep.run.flags import load_config

# Each public name and the module that defines it.
_HOMES = {
    "CudaGraphAdaptationStep": "rl_graphstep.graphstep",
    "EagerAdaptationStep": "rl_graphstep.graphstep",
    "GradNormClip": "rl_graphstep.core.guards",
    "GradientTransform": "rl_graphstep.graphstep",
    "TensorLoss": "rl_graphstep.graphstep",
    "clip_grad_norm": "rl_graphstep.core.guards",
    "load_config": "rl_graphstep.run.flags",
    "make_adaptation_step": "rl_graphstep.graphstep",
}
__all__ = [
    "CudaGraphAdaptationStep",
    "EagerAdaptationStep",
    "GradNormClip",
    "GradientTransform",
    "TensorLoss",
    "clip_grad_norm",
    "load_config",
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


def train_command() -> NoReturn:
    """The ``rl-graphstep-train`` console script: ``python -m rl_graphstep.train`` with the
    same quiet Ctrl-C while torch is imported (this package's import is light, the training
    module's is not)."""
    from rl_graphstep.run.cli import exit_quietly, startup_guard

    startup_guard()
    from rl_graphstep.train import main

    exit_quietly(main())
