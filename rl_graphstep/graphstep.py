"""The adaptation step: one fixed-shape update (forward, loss, backward, gradient transform,
optimizer step), captured once as a CUDA graph and replayed, or run eagerly by its twin.

Both classes share ``capture(...)`` and ``__call__(...)``, so a training loop has one code path;
:func:`make_adaptation_step` picks the graph on CUDA and the eager twin elsewhere.
"""

from __future__ import annotations

import contextlib
import gc
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from rl_graphstep.errors import CaptureError, CompileError, user_location

TensorLoss = Callable[[Any, Tensor], Tensor]
"""``loss_function(prediction, targets)``: a scalar, differentiable tensor."""

GradientTransform = Callable[[], None]
"""Run after backward and before the optimizer step, e.g. gradient-norm clipping."""

# Optimizers whose CUDA step can be captured once built with ``capturable=True``.
CAPTURABLE_OPTIMIZERS = (
    "Adam", "AdamW", "RMSprop", "NAdam", "RAdam", "Adamax", "Adadelta", "ASGD", "Rprop",
)

# Fresh optimizer state is all zeros except these entries (filled from the param group).
_FRESH_STATE_FROM_GROUP: dict[str, dict[str, Callable[[dict], float]]] = {
    "Rprop": {"step_size": lambda group: float(group["lr"])},
    "ASGD": {"eta": lambda group: float(group["lr"]), "mu": lambda group: 1.0},
    "NAdam": {"mu_product": lambda group: 1.0},
}

_HOST_SYNC_HINT = (
    "a CUDA graph cannot run code that waits for the GPU: remove .item(), float(t), bool(t), "
    "print(t), Python `if` on a tensor, .nonzero(), boolean-mask indexing, .cpu()/.numpy() and "
    "torch.tensor(python_value, device='cuda') from the step (use torch.where and device "
    "tensors instead), or run it eagerly (--graph off)"
)


# --------------------------------------------------------------------------------------------
# Gradient-norm clipping
# --------------------------------------------------------------------------------------------


class GradNormClip:
    """Clip the gradients' total 2-norm to ``max_norm``; keep the pre-clip norm in ``self.norm``.

    ``self.norm`` is a preallocated 0-dim float32 tensor updated in place, so inside a CUDA
    graph every replay refreshes it and a logger can read it without re-allocations. The
    clipping itself never syncs with the host (``clip_grad_norm_`` scales by
    ``min(1, max_norm / (norm + 1e-6))`` on the device). ``max_norm=inf`` only records.
    """

    def __init__(self, parameters: Iterable[Tensor], max_norm: float) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        if not self.parameters:
            raise ValueError("clip_grad_norm needs at least one parameter that requires grad")
        if not max_norm > 0:
            raise ValueError(f"max_norm must be > 0, got {max_norm}")
        self.max_norm = float(max_norm)
        self.norm = torch.zeros((), dtype=torch.float32, device=self.parameters[0].device)

    def __call__(self) -> None:
        total = nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        self.norm.copy_(total)


def clip_grad_norm(parameters: Iterable[Tensor], max_norm: float) -> GradNormClip:
    """A capture-safe :data:`GradientTransform` clipping ``parameters`` to ``max_norm``."""
    return GradNormClip(parameters, max_norm)


# --------------------------------------------------------------------------------------------
# Shared pieces of both steps
# --------------------------------------------------------------------------------------------


def _selected_parameters(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]


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


def _check_scalar_loss(loss: Any, loss_function: Callable) -> None:
    name = getattr(loss_function, "__qualname__", type(loss_function).__name__)
    if not isinstance(loss, Tensor):
        raise TypeError(f"loss_function {name} returned {type(loss).__name__}, expected a tensor")
    if loss.dim() != 0:
        raise ValueError(
            f"loss_function {name} returned shape {tuple(loss.shape)}, expected a scalar "
            "(shape ()); reduce it, e.g. with .mean()"
        )
    if not loss.requires_grad:
        raise ValueError(
            f"loss_function {name} returned a tensor that does not require grad; it must "
            "depend on the optimizer's parameters"
        )


def _check_capture_arguments(optimizer: torch.optim.Optimizer, warmup_steps: int) -> None:
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
        raise ValueError(f"warmup_steps must be an int >= 1, got {warmup_steps!r}")
    if not _selected_parameters(optimizer):
        raise ValueError("the optimizer holds no parameter that requires grad")


class NonFiniteGuard:
    """Skips, on the device and without a host sync, an update whose loss or gradients are
    not finite, so one bad batch cannot corrupt the parameters.

    Before the optimizer step it zeroes the gradients of a bad update (so the step itself
    stays finite) and copies the parameters and optimizer state aside; after the step it
    puts them back exactly when the update was bad. ``skipped`` counts skipped updates,
    ``consecutive`` the current run of them (both int64 device tensors).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.device = device
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)
        self.consecutive = torch.zeros((), dtype=torch.int64, device=device)
        self._tensors: list[Tensor] = []
        self._backups: list[Tensor] = []

    def _guarded(self) -> tuple[list[Tensor], list[Tensor]]:
        tensors = [
            t for t in (*_selected_parameters(self.optimizer),
                        *(v for _, _, v in _state_tensors(self.optimizer)))
            if t.is_floating_point() and t.device == self.device
        ]
        # The state appears after the first eager step; inside a graph this never changes.
        if len(tensors) != len(self._tensors) or any(
            a is not b for a, b in zip(tensors, self._tensors, strict=True)
        ):
            self._tensors, self._backups = tensors, [t.detach().clone() for t in tensors]
        return self._tensors, self._backups

    @torch.no_grad()
    def before_step(self, loss: Tensor, parameters: list[Tensor],
                    grad_norm: Tensor | None = None) -> Tensor:
        """Check the update, neutralise a bad one's gradients, back up what the step changes;
        returns the 0-dim float ``keep`` (1: finite update, 0: skip). ``grad_norm``: the
        gradients' total norm when already known (a clip computed it; it is finite exactly
        when every gradient is), saving its recomputation."""
        grads = [p.grad for p in parameters if p.grad is not None]
        finite = torch.isfinite(loss.detach())
        if grads:
            if grad_norm is None:
                grad_norm = torch.stack(torch._foreach_norm(grads)).sum()
            finite = finite & torch.isfinite(grad_norm)
            for grad in grads:
                grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            torch._foreach_mul_(grads, finite.to(grads[0].dtype))
        self.skipped.add_(~finite)
        self.consecutive.mul_(~finite).add_(~finite)
        tensors, backups = self._guarded()
        torch._foreach_copy_(backups, tensors)
        return finite.float()

    @torch.no_grad()
    def after_step(self, keep: Tensor) -> None:
        """Undo the step when ``keep`` is 0: t*1 + b*0 = t and t*0 + b*1 = b, exactly."""
        tensors, backups = self._guarded()
        torch._foreach_mul_(tensors, keep)
        torch._foreach_add_(tensors, torch._foreach_mul(backups, 1.0 - keep))

    def reset(self) -> None:
        self.skipped.zero_()
        self.consecutive.zero_()


# Compiled versions allowed per code object while a step compiles (torch's default is 8).
_RECOMPILE_LIMIT = 1024


def _own_code(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` rebuilt on a copy of its code object.

    ``torch.compile`` keeps compiled versions per code object, guarded on the objects they
    read (this body's module and optimizer), and stops compiling a code object after
    ``recompile_limit`` (8) versions. All bodies share their methods' code, so without a copy
    the ninth step built in a process would silently run uncompiled."""
    function = method.__func__
    code = function.__code__.replace()
    fresh = types.FunctionType(code, function.__globals__, function.__name__,
                               function.__defaults__, function.__closure__)
    return types.MethodType(fresh, method.__self__)


def compile_now(method: Callable[..., Any], *args: Any, what: str
                ) -> Callable[..., Any] | None:
    """``torch.compile(method)`` (a bound method, on a code object of its own), compiled now
    by one call on ``args`` (make it a call without effect), so that a capture later records
    the compiled kernels instead of compiling inside the capture. None, with a one-line
    warning, where the compiler fails."""
    compiled = torch.compile(_own_code(method))
    try:
        compiled(*args)
    except Exception as error:  # the compiler's own failures have no common base class
        warnings.warn(f"torch.compile failed on {what} ({_describe(_root_cause(error))}); "
                      f"it runs uncompiled", stacklevel=3)
        return None
    return compiled


class _UpdateBody:
    """The update both steps run: zero grads, forward, loss, backward, transform, step.

    Backward is restricted to the optimizer's parameters, so other module parameters and any
    module the loss calls (a critic inside an actor's loss) get no ``.grad`` written.

    With ``compile=True`` two parts are ``torch.compile``d (default mode), which fuses their
    many small kernels: forward + loss (its backward is compiled with it) and transform +
    guard + optimizer step. The first call runs uncompiled: it checks the loss and creates the
    optimizer state, so the compiled code is traced once against the state it will keep. A
    part the compiler fails on (on its first compiled call, before it runs) stays uncompiled,
    with a warning, and :attr:`uncompiled_parts` names it.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_function: TensorLoss,
        gradient_transform: GradientTransform | None,
        guard: NonFiniteGuard | None = None,
        *,
        compile: bool = False,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.loss_function = loss_function
        self.gradient_transform = gradient_transform
        self.guard = guard
        self.parameters = _selected_parameters(optimizer)
        self.uncompiled_parts: list[str] = []
        # Each part: [what runs now, its uncompiled form, compiled calls so far].
        self._parts: dict[str, list[Any]] = {
            "forward and loss": [self._forward_loss, self._forward_loss, 0],
            "gradient transform and optimizer step": [self._apply, self._apply, 0],
        }
        if compile:
            for part in self._parts.values():
                part[0] = torch.compile(_own_code(part[1]))
        self._first_call_done = False

    def _forward_loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        return self.loss_function(self.module(inputs), targets)

    def forward_loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        loss = self._forward_loss(inputs, targets)
        _check_scalar_loss(loss, self.loss_function)
        return loss

    def _apply(self, loss: Tensor) -> None:
        """Transform the gradients and step (skipping a non-finite update when guarded)."""
        if self.gradient_transform is not None:
            self.gradient_transform()
        if self.guard is None:
            self.optimizer.step()
        else:
            norm = self.gradient_transform.norm if isinstance(
                self.gradient_transform, GradNormClip) else None
            keep = self.guard.before_step(loss, self.parameters, norm)
            self.optimizer.step()
            self.guard.after_step(keep)

    def _run(self, name: str, *args: Tensor) -> Any:
        """Run a part, compiled where possible; on the compiler's failure at the first
        compiled call, fall back to the uncompiled part for good."""
        part = self._parts[name]
        if part[0] is part[1]:
            return part[1](*args)
        if part[2]:
            return part[0](*args)
        try:
            # Compiling happens here. Code the compiler reaches through a graph break (the
            # optimizer's own step wrapper, say) is shared by all steps and guarded on each
            # one's optimizer: lift the per-code limit of compiled versions for this call, or
            # the ninth step built in a process would run that code uncompiled.
            with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
                result = part[0](*args)
        except Exception as error:
            cause = _root_cause(error)
            warnings.warn(
                f"torch.compile failed on the {name} of {self.module._get_name()} "
                f"({_describe(cause)}); that part runs uncompiled", stacklevel=4)
            part[0] = part[1]
            self.uncompiled_parts.append(name)
            return part[1](*args)
        part[2] += 1
        return result

    def __call__(self, inputs: Tensor, targets: Tensor) -> Tensor:
        # set_to_none: inside a capture, backward then allocates the gradients from the graph's
        # pool instead of recording an accumulation into stale ones.
        self.optimizer.zero_grad(set_to_none=True)
        if self._first_call_done:
            loss = self._run("forward and loss", inputs, targets)
        else:
            loss = self.forward_loss(inputs, targets)
        loss.backward(inputs=self.parameters)
        # No grad: all of it works on gradients, and a compiled graph that starts with grad
        # mode on is traced as a training graph, which copies every tensor it updates.
        with torch.no_grad():
            if self._first_call_done:
                self._run("gradient transform and optimizer step", loss.detach())
            else:
                self._apply(loss.detach())
        self._first_call_done = True
        return loss.detach()


# --------------------------------------------------------------------------------------------
# The eager twin
# --------------------------------------------------------------------------------------------


class EagerAdaptationStep:
    """The eager twin of :class:`CudaGraphAdaptationStep`: same interface, any device.

    ``capture`` validates the pieces (one forward under a forked RNG, so it consumes neither an
    update nor random numbers) and keeps static input/target buffers; ``__call__`` checks,
    copies into them and runs one update.
    """

    graph: None = None

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        static_inputs: Tensor,
        static_targets: Tensor,
        body: _UpdateBody,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.static_inputs = static_inputs
        self.static_targets = static_targets
        self.static_loss = torch.zeros((), device=static_inputs.device)
        self._body = body
        self.guard = body.guard

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
    ) -> EagerAdaptationStep:
        """Validate and wrap an update; ``warmup_steps`` and ``pool`` only matter to graphs.
        ``compile``: ``torch.compile`` the update's parts (from its second call on)."""
        del pool
        _check_capture_arguments(optimizer, warmup_steps)
        _check_is_tensor(example_inputs=example_inputs, example_targets=example_targets)
        guard = NonFiniteGuard(optimizer, example_inputs.device) if skip_nonfinite else None
        body = _UpdateBody(module, optimizer, loss_function, gradient_transform, guard,
                           compile=compile)
        devices = [example_inputs.device] if example_inputs.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            body.forward_loss(example_inputs, example_targets)
        return cls(module, optimizer, example_inputs.clone(), example_targets.clone(), body)

    def __call__(self, inputs: Tensor, targets: Tensor, *, synchronize: bool = False) -> Tensor:
        """Run one update on ``inputs``/``targets``; return the loss (detached)."""
        _check_tensor("inputs", inputs, self.static_inputs)
        _check_tensor("targets", targets, self.static_targets)
        self.static_inputs.copy_(inputs)
        self.static_targets.copy_(targets)
        return self.replay(synchronize=synchronize)

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
    selected = _selected_parameters(optimizer)
    named += [(f"optimizer parameter {i}", p) for i, p in enumerate(selected)]
    for name, tensor in named:
        if tensor.device != device:
            raise ValueError(
                f"{module._get_name()} {name} is on {tensor.device}, expected {device} "
                "(a CUDA graph step needs every parameter on the inputs' CUDA device)"
            )
    return device


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[Tensor, str, Tensor]]:
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, Tensor):
                yield param, key, value


class _Snapshot:
    """Pre-capture values of a module and an optimizer, restored in place after capture.

    In place (``copy_``) because the graph has recorded these storages' addresses.
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.module_tensors = [
            (t, t.detach().clone()) for t in (*module.parameters(), *module.buffers())
        ]
        self.optimizer_tensors = [
            (t, t.detach().clone()) for t in dict.fromkeys(_selected_parameters(optimizer))
        ]
        self.state = {
            (id(p), key): value.clone() for p, key, value in _state_tensors(optimizer)
        }

    @torch.no_grad()
    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        for tensor, saved in (*self.module_tensors, *self.optimizer_tensors):
            tensor.copy_(saved)
        fresh = _FRESH_STATE_FROM_GROUP.get(type(optimizer).__name__, {})
        group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        for param, key, value in _state_tensors(optimizer):
            saved = self.state.get((id(param), key))
            if saved is not None:
                value.copy_(saved)
            elif key in fresh:
                value.fill_(fresh[key](group_of[id(param)]))
            else:
                value.zero_()  # a fresh Adam-family state is all zeros, `step` included


class _Layout:
    """What the graph was recorded against: tensor addresses and parameter groups.

    Re-reading it costs a pointer read per tensor and no GPU work, so every call can check it;
    a mismatch means the graph would update memory nobody uses any more.
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.module = module
        self.optimizer = optimizer
        self.value = self.read()

    def read(self) -> tuple:
        groups = tuple(
            (
                tuple(id(p) for p in group["params"]),
                tuple(
                    (key, id(value) if isinstance(value, Tensor) else value)
                    for key, value in group.items()
                    if key != "params"
                ),
            )
            for group in self.optimizer.param_groups
        )
        module_ptrs = tuple(
            (name, t.data_ptr())
            for name, t in (*self.module.named_parameters(), *self.module.named_buffers())
        )
        optimizer_ptrs = tuple(
            p.data_ptr() for group in self.optimizer.param_groups for p in group["params"]
        )
        state_ptrs = tuple(
            (id(p), key, value.data_ptr()) for p, key, value in _state_tensors(self.optimizer)
        )
        return groups, module_ptrs, optimizer_ptrs, state_ptrs

    def check(self) -> None:
        now = self.read()
        if now == self.value:
            return
        causes = (
            "the optimizer's parameter groups or their settings changed",
            f"a parameter or buffer of {self.module._get_name()} was re-allocated "
            "(e.g. by module.to(...) or load_state_dict with assign=True)",
            "an optimizer parameter was re-allocated",
            "the optimizer's state tensors were re-allocated (e.g. by optimizer.load_state_dict)",
        )
        cause = next(c for c, a, b in zip(causes, now, self.value, strict=True) if a != b)
        raise RuntimeError(
            f"{cause} since capture, so the CUDA graph would update orphaned memory; copy new "
            "values into the existing tensors in place (tensor.copy_) or capture a new step"
        )


@contextlib.contextmanager
def _no_garbage_collection() -> Iterator[None]:
    """Collect garbage now and not during the capture: a finalizer that frees CUDA memory or
    destroys an unreachable older graph mid-capture (a prohibited call while a stream is
    capturing) would invalidate the capture far from its cause."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _clear_cublas_workspaces() -> None:
    """Drop torch's cached cuBLAS workspaces (one per stream); the next matmul allocates anew."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def _capturing(graph: torch.cuda.CUDAGraph, pool: Any = None) -> Iterator[None]:
    """Capture into ``graph``, with a cuBLAS workspace of its own and no garbage collection.

    torch caches one cuBLAS workspace per stream, and every capture runs on the same stream:
    left alone, each graph would bake in the address of one shared workspace. Two graphs
    replaying at once (an action beside an update) would then overwrite each other's
    matmuls, and destroying any graph frees that workspace (torch clears its capture
    stream's cache) while the others still write to it. Clearing the cache before the
    capture makes the capture allocate its workspace from the graph's own pool, which lives
    as long as the graph; clearing it after keeps later work out of that memory.
    """
    _clear_cublas_workspaces()
    try:
        with _no_garbage_collection(), torch.cuda.graph(graph, pool=pool):
            yield
    finally:
        _clear_cublas_workspaces()


def _describe(error: BaseException) -> str:
    """``Type: first line of the message``."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _root_cause(error: BaseException) -> BaseException:
    """The first error in the chain: PyTorch's capture error hides it in ``__context__``."""
    seen = {id(error)}
    while True:
        nxt = error.__cause__ or error.__context__
        if nxt is None or id(nxt) in seen:
            return error
        seen.add(id(nxt))
        error = nxt


def capture_graph(
    function: Callable[[], Any],
    device: torch.device,
    *,
    what: str,
    warmup_steps: int = 1,
    pool: Any = None,
    warmup: Callable[[], Any] | None = None,
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Capture ``function()`` as a CUDA graph; return the graph and the captured call's result.

    For the small graphs around the steps (replay sampling, action selection): ``function``
    reads and writes tensors it holds, so ``graph.replay()`` redoes it on their current
    values. It runs ``warmup_steps`` times on a side stream first (``warmup`` instead, where
    given: the same kernels on scratch tensors, for a function whose real run must not
    happen), and the RNG states come back to their values before the call, so capturing
    consumes no random numbers. Raises :class:`CaptureError` naming ``what`` and the line at
    fault.

    The graph keeps the addresses of the tensors ``function`` reads, not the tensors: the
    caller must hold every one of them for as long as it replays the graph. One held only by
    a closure is freed when the closure goes, its memory is handed to the next allocation,
    and replays then read whatever that holds.
    """
    rng = (torch.get_rng_state(), torch.cuda.get_rng_state(device))
    generator = torch.cuda.default_generators[device.index or 0]
    generator_backup = generator.clone_state()
    graph = torch.cuda.CUDAGraph()
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup_steps):
                (warmup or function)()
        torch.cuda.current_stream(device).wait_stream(side)
        with _capturing(graph, pool):
            result = function()
    except Exception as error:
        generator.graphsafe_set_state(generator_backup)
        torch.set_rng_state(rng[0])
        cause = _root_cause(error)
        where = user_location(cause)
        raise CaptureError(
            f"could not capture {what}{f' (at {where})' if where else ''}: "
            f"{_describe(cause)}; {_HOST_SYNC_HINT}"
        ) from error
    torch.set_rng_state(rng[0])
    torch.cuda.set_rng_state(rng[1], device)
    return graph, result


class CudaGraphAdaptationStep:
    """A captured forward + loss + backward + gradient transform + optimizer update.

    Build it with :meth:`capture`; each call copies new inputs/targets into the static buffers
    and replays the whole update. The optimizer may hold a subset of the module's parameters:
    only those receive gradients and change.

    Attributes:
        module: the module whose forward is captured.
        optimizer: the optimizer attached to the selected parameters (``capturable=True``).
        static_inputs / static_targets: the buffers the graph reads; writing into them in
            place and calling :meth:`replay` skips the copy that ``__call__`` makes.
        graph: the captured ``torch.cuda.CUDAGraph``.
        static_loss: the loss tensor the graph writes on every replay.
        pool: the graph's memory pool; pass it to another capture to share memory.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        static_inputs: Tensor,
        static_targets: Tensor,
        graph: torch.cuda.CUDAGraph,
        static_loss: Tensor,
        body: _UpdateBody,
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
        self.guard = body.guard
        self._layout = _Layout(module, optimizer)

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
    ) -> CudaGraphAdaptationStep:
        """Warm up, capture one update, and restore the pre-capture values in place.

        ``warmup_steps`` real updates run on a side stream (they create the optimizer state
        and let the allocator settle); then one update is captured. Afterwards every module
        parameter and buffer, every optimizer parameter and state tensor, and the RNG state
        are back to their values before this call: capturing consumes no update.

        ``pool``: another step's ``pool``, to share memory with it (replay them in capture
        order). ``skip_nonfinite``: skip, on the device, updates whose loss or gradients are
        not finite (see :class:`NonFiniteGuard`; counts in ``self.guard``). ``compile``:
        ``torch.compile`` the update's parts before capturing them, fusing small kernels; the
        compilation happens during the warm-up (at least two steps then).
        """
        _check_capture_arguments(optimizer, warmup_steps)
        device = _check_on_cuda(module, optimizer, example_inputs, example_targets)
        _check_capturable(optimizer)

        static_inputs = example_inputs.detach().clone()
        static_targets = example_targets.detach().clone()
        guard = NonFiniteGuard(optimizer, device) if skip_nonfinite else None
        body = _UpdateBody(module, optimizer, loss_function, gradient_transform, guard,
                           compile=compile)
        if compile:
            warmup_steps = max(warmup_steps, 2)  # the first is eager; compile before capture
        snapshot = _Snapshot(module, optimizer)
        rng = (torch.get_rng_state(), torch.cuda.get_rng_state(device))
        generator = torch.cuda.default_generators[device.index or 0]
        generator_backup = generator.clone_state()

        def undo() -> None:
            # A failed capture leaves the generator in capture mode: every later random draw
            # would fail. Put back a clean copy, which also undoes the warm-up's draws.
            generator.graphsafe_set_state(generator_backup)
            snapshot.restore(optimizer)
            torch.set_rng_state(rng[0])

        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(warmup_steps):
                    body(static_inputs, static_targets)
            torch.cuda.current_stream(device).wait_stream(side)
        except Exception as error:
            undo()
            if not compile:
                raise
            raise CompileError(
                f"could not compile the update of {module._get_name()}: "
                f"{_describe(_root_cause(error))}; run it uncompiled (--compile off)"
            ) from error

        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        try:
            with _capturing(graph, pool):
                static_loss = body(static_inputs, static_targets)
        except Exception as error:  # the real cause hides in the chain
            undo()
            cause = _root_cause(error)
            where = user_location(cause)
            raise CaptureError(
                f"could not capture the update of {module._get_name()}"
                f"{f' (at {where})' if where else ''}: {_describe(cause)}; {_HOST_SYNC_HINT}"
            ) from error

        snapshot.restore(optimizer)
        if guard is not None:
            guard.reset()  # the warm-up's skips are not the run's
        torch.set_rng_state(rng[0])
        torch.cuda.set_rng_state(rng[1], device)
        torch.cuda.synchronize(device)
        return cls(module, optimizer, static_inputs, static_targets, graph, static_loss, body)

    def __call__(self, inputs: Tensor, targets: Tensor, *, synchronize: bool = False) -> Tensor:
        """Copy ``inputs``/``targets`` into the static buffers, replay the update, and return
        a detached clone of the loss (later replays do not change it)."""
        _check_tensor("inputs", inputs, self.static_inputs)
        _check_tensor("targets", targets, self.static_targets)
        self.check_layout()
        self.static_inputs.copy_(inputs)
        self.static_targets.copy_(targets)
        return self.replay(synchronize=synchronize)

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
        launch. Outside a capture it is one eager update of the same tensors.
        """
        return self._body(self.static_inputs, self.static_targets)


AdaptationStep = CudaGraphAdaptationStep | EagerAdaptationStep


def make_adaptation_step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    example_inputs: Tensor,
    example_targets: Tensor,
    loss_function: TensorLoss,
    *,
    use_graph: bool | None = None,
    warmup_steps: int = 3,
    gradient_transform: GradientTransform | None = None,
    pool: Any = None,
    skip_nonfinite: bool = False,
    compile: bool = False,
) -> AdaptationStep:
    """Capture the update as a CUDA graph on CUDA, else wrap it in the eager twin.

    ``use_graph=None`` decides by the inputs' device; ``True`` on a non-CUDA device is an error.
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
    return kind.capture(
        module, optimizer, example_inputs, example_targets, loss_function,
        warmup_steps=warmup_steps, gradient_transform=gradient_transform, pool=pool,
        skip_nonfinite=skip_nonfinite, compile=compile,
    )
