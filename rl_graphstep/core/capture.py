"""Generic CUDA graph capture: capturing a function without consuming random numbers, putting a
module's and an optimizer's values back after a capture, and one clear line when one fails."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from rl_graphstep.core.errors import CaptureError, user_location

_HOST_SYNC_HINT = (
    "a CUDA graph cannot run code that waits for the GPU: remove .item(), float(t), bool(t), "
    "print(t), Python `if` on a tensor, .nonzero(), boolean-mask indexing, .cpu()/.numpy() and "
    "torch.tensor(python_value, device='cuda') from the step (use torch.where and device "
    "tensors instead), or run it eagerly (--graph off)"
)

# Fresh optimizer state is all zeros except these entries (filled from the param group).
_FRESH_STATE_FROM_GROUP: dict[str, dict[str, Callable[[dict], float]]] = {
    "Rprop": {"step_size": lambda group: float(group["lr"])},
    "ASGD": {"eta": lambda group: float(group["lr"]), "mu": lambda group: 1.0},
    "NAdam": {"mu_product": lambda group: 1.0},
}


def selected_parameters(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The optimizer's parameters that require grad: those an update changes."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]


def state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[Tensor, str, Tensor]]:
    """``(parameter, key, tensor)`` for every tensor in the optimizer's state."""
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, Tensor):
                yield param, key, value


class RngStates:
    """The CPU generator's and one CUDA device's generator states, taken before a capture, so
    that capturing consumes no random numbers."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device)

    def reset_after_failure(self) -> None:
        """After a failed capture: its generator state is left in capture mode (every later
        random draw would fail). A capture that ends cleanly takes that state out of capture
        mode in place, so the graphs captured before keep sharing it with eager draws (a fresh
        state swapped in would leave them on the old one, unseeded by ``torch.manual_seed``
        and drawing the same numbers as the new one); then both generators go back to their
        values before the capture, which also undoes the warm-up's draws."""
        ended = torch.cuda.CUDAGraph()
        # A failure that broke the CUDA context breaks this capture too; the caller's error
        # says why, so this one is not raised over it.
        with contextlib.suppress(RuntimeError):
            with torch.cuda.graph(ended):
                torch.zeros((), device=self.device)
            _settle_capture_stream()
        del ended
        self.restore()

    def restore(self) -> None:
        """After a capture that worked: both generators as they were before it."""
        torch.set_rng_state(self.cpu)
        torch.cuda.set_rng_state(self.cuda, self.device)


class Snapshot:
    """Pre-capture values of a module and an optimizer, restored in place after capture.

    In place (``copy_``) because the graph has recorded these storages' addresses.
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.module_tensors = [
            (t, t.detach().clone()) for t in (*module.parameters(), *module.buffers())
        ]
        self.optimizer_tensors = [
            (t, t.detach().clone()) for t in dict.fromkeys(selected_parameters(optimizer))
        ]
        self.state = {
            (id(p), key): value.clone() for p, key, value in state_tensors(optimizer)
        }

    @torch.no_grad()
    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        for tensor, saved in (*self.module_tensors, *self.optimizer_tensors):
            tensor.copy_(saved)
        fresh = _FRESH_STATE_FROM_GROUP.get(type(optimizer).__name__, {})
        group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        for param, key, value in state_tensors(optimizer):
            saved = self.state.get((id(param), key))
            if saved is not None:
                value.copy_(saved)
            elif key in fresh:
                value.fill_(fresh[key](group_of[id(param)]))
            else:
                value.zero_()  # a fresh Adam-family state is all zeros, `step` included


class Layout:
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
            (id(p), key, value.data_ptr()) for p, key, value in state_tensors(self.optimizer)
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
def capturing(graph: torch.cuda.CUDAGraph, pool: Any = None) -> Iterator[None]:
    """Capture into ``graph``, with a cuBLAS workspace of its own and no garbage collection;
    the caller's stream is current again afterwards, whether the capture worked or failed.

    torch caches one cuBLAS workspace per stream, and every capture runs on the same stream:
    left alone, each graph would bake in the address of one shared workspace. Two graphs
    replaying at once (an action beside an update) would then overwrite each other's
    matmuls, and destroying any graph frees that workspace (torch clears its capture
    stream's cache) while the others still write to it. Clearing the cache before the
    capture makes the capture allocate its workspace from the graph's own pool, which lives
    as long as the graph; clearing it after keeps later work out of that memory.
    """
    _clear_cublas_workspaces()
    caller = torch.cuda.current_stream()
    try:
        with _no_garbage_collection(), torch.cuda.graph(graph, pool=pool):
            yield
        _settle_capture_stream()
    finally:
        # torch.cuda.graph leaves its capture stream current when the capture fails (its exit
        # ends the capture before it restores the stream): a run that falls back to eager
        # would go on there, and later captures would start from that stream.
        torch.cuda.set_stream(caller)
        _clear_cublas_workspaces()


def _settle_capture_stream() -> None:
    """Wait for what a capture left queued on its stream. Before capturing, torch writes the
    generator's seed and a zero offset into the device tensors that every graph on that
    generator reads (on the capture stream, and does not wait for it afterwards); a replay on
    another stream soon after, which writes the current seed and offset there before its
    kernels read them, could have them overwritten in between and draw the capture's numbers.
    Captures happen once per run; the wait costs nothing that matters. (A likely cause of a
    failure in two of about eight runs of the GPU suite with 8 processes on one GPU: the first
    update of a freshly seeded graph drew another seed's sample.)"""
    torch.cuda.synchronize()


def describe_error(error: BaseException) -> str:
    """``Type: first line of the message``."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def root_cause(error: BaseException) -> BaseException:
    """The first error in the chain: PyTorch's capture error hides it in ``__context__``."""
    seen = {id(error)}
    while True:
        nxt = error.__cause__ or error.__context__
        if nxt is None or id(nxt) in seen:
            return error
        seen.add(id(nxt))
        error = nxt


def capture_error(what: str, error: BaseException) -> CaptureError:
    """The one-line error for a failed capture of ``what``: the root cause, the user's line
    at fault where there is one, and what a graph cannot run."""
    cause = root_cause(error)
    where = user_location(cause)
    return CaptureError(
        f"could not capture {what}{f' (at {where})' if where else ''}: "
        f"{describe_error(cause)}; {_HOST_SYNC_HINT}"
    )


def warm_up(function: Callable[[], Any], device: torch.device, steps: int) -> None:
    """Run ``function()`` ``steps`` times on a side stream, as a capture needs before it: the
    allocator and lazily made state (an optimizer's, cuBLAS handles) settle outside the graph."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(steps):
            function()
    torch.cuda.current_stream(device).wait_stream(side)


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
    rng = RngStates(device)
    graph = torch.cuda.CUDAGraph()
    try:
        warm_up(warmup or function, device, warmup_steps)
        with capturing(graph, pool):
            result = function()
    except Exception as error:
        rng.reset_after_failure()
        raise capture_error(what, error) from error
    rng.restore()
    return graph, result
