"""The adaptation step contract: one fixed-shape update (forward, loss, backward, gradient
transform, optimizer step), captured once as a CUDA graph and replayed, or run eagerly by its twin.

Both classes share ``capture(...)`` and ``__call__(...)``, so a training loop has one code path;
:func:`make_adaptation_step` picks the graph on CUDA and the eager twin elsewhere.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor, nn

from rl_graphstep.core.capture import (
    Layout,
    RngStates,
    Snapshot,
    capture_error,
    capturing,
    describe_error,
    root_cause,
    selected_parameters,
    warm_up,
)
from rl_graphstep.core.errors import CaptureError, CompileError
from rl_graphstep.core.guards import NonFiniteGuard
from rl_graphstep.core.update_body import GradientTransform, TensorLoss, UpdateBody

if TYPE_CHECKING:
    from typing import Self


# Optimizers whose CUDA step can be captured once built with ``capturable=True``.
CAPTURABLE_OPTIMIZERS = (
    "Adam", "AdamW", "RMSprop", "NAdam", "RAdam", "Adamax", "Adadelta", "ASGD", "Rprop",
)


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_tensor(name: str, value: Any, expected: Tensor) -> None:
    """Raise a clear error when ``value`` does not match the captured ``expected`` tensor."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != expected.dtype:
        raise TypeError(f"{name} has dtype {value.dtype}, expected {expected.dtype}")
    if value.shape != expected.shape:
        raise ValueError(
            f"{name} has shape {tuple(value.shape)}, expected {tuple(expected.shape)} "
            "(a captured step has a fixed shape)"
        )
    if value.device != expected.device:
        raise ValueError(f"{name} is on {value.device}, expected {expected.device}")


def _check_is_tensor(**tensors: Any) -> None:
    for name, value in tensors.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def _check_capture_arguments(optimizer: torch.optim.Optimizer, warmup_steps: int) -> None:
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
        raise ValueError(f"warmup_steps must be an int >= 1, got {warmup_steps!r}")
    if not selected_parameters(optimizer):
        raise ValueError("the optimizer holds no parameter that requires grad")


def _check_capturable(optimizer: torch.optim.Optimizer) -> None:
    kind = type(optimizer).__name__
    if "capturable" not in optimizer.defaults:
        raise CaptureError(
            f"{kind} cannot be captured in a CUDA graph; use one of "
            f"{', '.join(CAPTURABLE_OPTIMIZERS)} with capturable=True, or run eagerly"
        )
    for index, group in enumerate(optimizer.param_groups):
        if not group.get("capturable", False):
            raise CaptureError(
                f"{kind} param group {index} has capturable=False; build it with "
                f"{kind}(..., capturable=True) to capture its step in a CUDA graph"
            )


def _check_on_cuda(module: nn.Module, optimizer: torch.optim.Optimizer,
                   example_inputs: Tensor, example_targets: Tensor) -> torch.device:
    _check_is_tensor(example_inputs=example_inputs, example_targets=example_targets)
    device = example_inputs.device
    if device.type != "cuda":
        raise ValueError(
            f"example_inputs is on {device}, expected a CUDA device "
            "(use EagerAdaptationStep off the GPU)"
        )
    if example_targets.device != device:
        raise ValueError(f"example_targets is on {example_targets.device}, expected {device}")
    named = [*module.named_parameters(), *module.named_buffers()]
    selected = selected_parameters(optimizer)
    named += [(f"optimizer parameter {i}", p) for i, p in enumerate(selected)]
    for name, tensor in named:
        if tensor.device != device:
            raise ValueError(
                f"{module._get_name()} {name} is on {tensor.device}, expected {device} "
                "(a CUDA graph step needs every parameter on the inputs' CUDA device)"
            )
    return device


# --------------------------------------------------------------------------------------------
# What both steps share
# --------------------------------------------------------------------------------------------


class CaptureSettings(NamedTuple):
    """The keyword-only settings of ``capture``, as one value for each class's ``_capture``."""

    warmup_steps: int
    gradient_transform: GradientTransform | None
    pool: Any
    skip_nonfinite: bool
    compile: bool
    seeds: int


class _AdaptationStep:
    """The interface both steps share: ``capture(...)`` builds a step from an example batch,
    ``__call__(...)`` checks new inputs and targets, copies them into the static buffers and
    runs the update."""

    static_inputs: Tensor
    static_targets: Tensor

    @classmethod
    def capture(
        cls,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        example_inputs: Tensor,
        example_targets: Tensor,
        loss_function: TensorLoss,
        *,
        warmup_steps: int = 3,
        gradient_transform: GradientTransform | None = None,
        pool: Any = None,
        skip_nonfinite: bool = False,
        compile: bool = False,
        seeds: int = 1,
    ) -> Self:
        """Build the step (each class's ``_capture`` says how).

        ``warmup_steps`` real updates precede a captured one (graphs only); ``pool``: another
        step's ``pool``, to share graph memory with it (replay them in capture order);
        ``skip_nonfinite``: skip, on the device, updates whose loss or gradients are not
        finite (see :class:`~rl_graphstep.core.guards.NonFiniteGuard`; counts in ``self.guard``);
        ``compile``: ``torch.compile`` the update's parts, fusing small kernels; ``seeds``:
        K > 1 seeds stacked on a leading dimension, the loss one value per seed (see
        :class:`~rl_graphstep.core.update_body.UpdateBody`).
        """
        _check_capture_arguments(optimizer, warmup_steps)
        settings = CaptureSettings(warmup_steps, gradient_transform, pool, skip_nonfinite,
                                   compile, seeds)
        return cls._capture(module, optimizer, example_inputs, example_targets, loss_function,
                            settings)

    @classmethod
    def _capture(cls, module: nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: Tensor, example_targets: Tensor, loss_function: TensorLoss,
                 settings: CaptureSettings) -> Self:
        raise NotImplementedError

    def __call__(self, inputs: Tensor, targets: Tensor, *, synchronize: bool = False) -> Tensor:
        """Copy ``inputs``/``targets`` into the static buffers, run the update, and return
        its loss, detached (later updates do not change it)."""
        _check_tensor("inputs", inputs, self.static_inputs)
        _check_tensor("targets", targets, self.static_targets)
        self.check_layout()
        self.static_inputs.copy_(inputs)
        self.static_targets.copy_(targets)
        return self.replay(synchronize=synchronize)

    def check_layout(self) -> None:
        """Raise if the step's tensors moved since it was built (graphs only)."""

    def replay(self, *, synchronize: bool = False) -> Tensor:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# The eager twin
# --------------------------------------------------------------------------------------------


class EagerAdaptationStep(_AdaptationStep):
    """The eager twin of :class:`CudaGraphAdaptationStep`: same interface, any device.

    ``capture`` validates the pieces (one forward under a forked RNG, its module's buffers put
    back, so it consumes neither an update nor random numbers) and keeps static input/target
    buffers; ``__call__`` checks, copies into them and runs one update. Built directly, the
    step holds what it runs in place of a graph: the loss function, and as keyword-only extras
    those of ``capture``.
    """

    graph: None = None

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                 static_inputs: Tensor, static_targets: Tensor, loss_function: TensorLoss, *,
                 gradient_transform: GradientTransform | None = None,
                 skip_nonfinite: bool = False, compile: bool = False,
                 seeds: int = 1) -> None:
        self.module, self.optimizer = module, optimizer
        self.static_inputs, self.static_targets = static_inputs, static_targets
        self.static_loss = torch.zeros(() if seeds == 1 else (seeds,), device=static_inputs.device)
        self.guard = (NonFiniteGuard(optimizer, static_inputs.device, seeds=seeds)
                      if skip_nonfinite else None)
        self._body = UpdateBody(module, optimizer, loss_function, gradient_transform,
                                self.guard, compile=compile, seeds=seeds)

    @classmethod
    def _capture(cls, module: nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: Tensor, example_targets: Tensor, loss_function: TensorLoss,
                 settings: CaptureSettings) -> EagerAdaptationStep:
        """Validate and wrap an update; ``warmup_steps`` and ``pool`` only matter to graphs,
        a compiled eager step compiles from its second call on."""
        _check_is_tensor(example_inputs=example_inputs, example_targets=example_targets)
        step = cls(module, optimizer, example_inputs.clone(), example_targets.clone(),
                   loss_function, gradient_transform=settings.gradient_transform,
                   skip_nonfinite=settings.skip_nonfinite, compile=settings.compile,
                   seeds=settings.seeds)
        devices = [example_inputs.device] if example_inputs.device.type == "cuda" else []
        # The check moves no buffer either (a batch normalisation's running statistics).
        buffers = [(b, b.detach().clone()) for b in module.buffers()]
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            step._body.forward_loss(example_inputs, example_targets)
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        return step

    def replay(self, *, synchronize: bool = False) -> Tensor:
        """Run one update on whatever the static buffers hold (no checks, no copies)."""
        loss = self.run_update()
        if synchronize and loss.is_cuda:
            torch.cuda.synchronize(loss.device)
        return loss

    def run_update(self) -> Tensor:
        """One update on the static buffers; returns the loss (see the captured step's)."""
        self.static_loss = self._body(self.static_inputs, self.static_targets)
        return self.static_loss


# --------------------------------------------------------------------------------------------
# The captured step
# --------------------------------------------------------------------------------------------


class CudaGraphAdaptationStep(_AdaptationStep):
    """A captured forward + loss + backward + gradient transform + optimizer update.

    Build it with :meth:`capture`; each call copies new inputs/targets into the static buffers
    and replays the whole update. The optimizer may hold a subset of the module's parameters:
    only those receive gradients and change.

    Built directly from the six fields below (a graph captured by hand), it replays that
    graph; only :meth:`run_update` needs the update body that :meth:`capture` passes in.

    Attributes:
        module: the module whose forward is captured.
        optimizer: the optimizer attached to the selected parameters (``capturable=True``).
        static_inputs / static_targets: the buffers the graph reads; writing into them in
            place and calling :meth:`replay` skips the copy that ``__call__`` makes.
        graph: the captured ``torch.cuda.CUDAGraph``.
        static_loss: the loss tensor the graph writes on every replay.
        pool: the graph's memory pool; pass it to another capture to share memory.
        guard: the :class:`~rl_graphstep.core.guards.NonFiniteGuard` counting skipped updates, or
            None.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        static_inputs: Tensor,
        static_targets: Tensor,
        graph: torch.cuda.CUDAGraph,
        static_loss: Tensor,
        *,
        body: UpdateBody | None = None,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.static_inputs = static_inputs
        self.static_targets = static_targets
        self.graph = graph
        self.static_loss = static_loss
        self.pool = graph.pool()
        # The graph writes into tensors the body owns (a clip transform's recorded norm, say):
        # holding it keeps them alive, or their memory would be reused while replays write it.
        self._body = body
        self.guard = None if body is None else body.guard
        self._layout = Layout(module, optimizer)

    @classmethod
    def _capture(cls, module: nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: Tensor, example_targets: Tensor, loss_function: TensorLoss,
                 settings: CaptureSettings) -> CudaGraphAdaptationStep:
        """Warm up, capture one update, and restore the pre-capture values in place.

        ``warmup_steps`` real updates run on a side stream (they create the optimizer state
        and let the allocator settle; compiling happens there, with at least two of them);
        then one update is captured. Afterwards every module parameter and buffer, every
        optimizer parameter and state tensor, and the RNG state are back to their values
        before this call: capturing consumes no update.
        """
        warmup_steps, gradient_transform, pool, skip_nonfinite, compile, seeds = settings
        device = _check_on_cuda(module, optimizer, example_inputs, example_targets)
        _check_capturable(optimizer)

        static_inputs = example_inputs.detach().clone()
        static_targets = example_targets.detach().clone()
        guard = NonFiniteGuard(optimizer, device, seeds=seeds) if skip_nonfinite else None
        body = UpdateBody(module, optimizer, loss_function, gradient_transform, guard,
                          compile=compile, seeds=seeds)
        if compile:
            warmup_steps = max(warmup_steps, 2)  # the first is eager; compile before capture
        snapshot = Snapshot(module, optimizer)
        rng = RngStates(device)

        def undo() -> None:
            rng.reset_after_failure()
            snapshot.restore(optimizer)

        try:
            warm_up(functools.partial(body, static_inputs, static_targets), device,
                    warmup_steps)
        except Exception as error:
            undo()
            if not compile:
                raise
            raise CompileError(
                f"could not compile the update of {module._get_name()}: "
                f"{describe_error(root_cause(error))}; run it uncompiled (--compile off)"
            ) from error

        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        try:
            with capturing(graph, pool):
                static_loss = body(static_inputs, static_targets)
        except Exception as error:  # the real cause hides in the chain
            undo()
            raise capture_error(f"the update of {module._get_name()}", error) from error

        snapshot.restore(optimizer)
        if guard is not None:
            guard.reset()  # the warm-up's skips are not the run's
        rng.restore()
        torch.cuda.synchronize(device)
        return cls(module, optimizer, static_inputs, static_targets, graph, static_loss,
                   body=body)

    def check_layout(self) -> None:
        """Raise if a parameter, buffer or optimizer state was re-allocated since capture
        (the graph would then update memory nobody reads); ``__call__`` runs it each time."""
        self._layout.check()

    def replay(self, *, synchronize: bool = False) -> Tensor:
        """Replay the update on whatever the static buffers hold; return a clone of the loss.

        The fast path: no copies and no checks (see :meth:`check_layout`), one graph launch.
        """
        self.graph.replay()
        loss = self.static_loss.clone()
        if synchronize:
            torch.cuda.synchronize(self.static_loss.device)
        return loss

    def run_update(self) -> Tensor:
        """The update on the static buffers as ordinary launches, not as this graph; returns
        its loss tensor.

        Called while another graph is being captured, it records this step into that graph,
        so a larger graph (sampling, both steps and the target update) replays with one
        launch. Outside a capture it is one eager update of the same tensors. It needs the
        update body, which a step built by :meth:`capture` holds.
        """
        if self._body is None:
            raise CaptureError(
                "run_update needs the step's update body, and this step was built from a graph "
                "alone; build it with CudaGraphAdaptationStep.capture(...), or replay its graph "
                "with step(inputs, targets) or step.replay()"
            )
        return self._body(self.static_inputs, self.static_targets)


AdaptationStep = CudaGraphAdaptationStep | EagerAdaptationStep


def make_adaptation_step(module: nn.Module, optimizer: torch.optim.Optimizer,
                         example_inputs: Tensor, example_targets: Tensor,
                         loss_function: TensorLoss, *, use_graph: bool | None = None,
                         **settings: Any) -> AdaptationStep:
    """Capture the update as a CUDA graph on CUDA, else wrap it in the eager twin.

    ``use_graph=None`` decides by the inputs' device; ``True`` on a non-CUDA device is an error.
    ``settings``: the keyword arguments of ``capture``.
    """
    on_cuda = isinstance(example_inputs, Tensor) and example_inputs.device.type == "cuda"
    if use_graph is None:
        use_graph = on_cuda
    if use_graph and not on_cuda:
        raise ValueError(
            f"CUDA graphs need CUDA tensors, but example_inputs is on {example_inputs.device}; "
            "pass use_graph=False (--graph off) or move the step to the GPU"
        )
    kind = CudaGraphAdaptationStep if use_graph else EagerAdaptationStep
    return kind.capture(module, optimizer, example_inputs, example_targets, loss_function,
                        **settings)
