"""rl_graphstep: off-policy actor-critic agents whose updates are captured as CUDA graphs."""

from rl_graphstep.graphstep import (
    CudaGraphAdaptationStep,
    EagerAdaptationStep,
    GradientTransform,
    GradNormClip,
    TensorLoss,
    clip_grad_norm,
    make_adaptation_step,
)

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
