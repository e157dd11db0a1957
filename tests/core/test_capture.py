"""CPU tests of the capture utilities: the layout check, the error chain and message, no garbage
collection and a cuBLAS workspace of its own during a capture."""

from __future__ import annotations

import contextlib
import copy
import gc

import pytest
import torch
from torch import nn

from rl_graphstep.core import capture
from rl_graphstep.core.errors import CaptureError


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))


def test_layout_detects_reallocated_optimizer_state() -> None:
    module = mlp()
    optimizer = torch.optim.Adam(module.parameters())
    module(torch.ones(3, 4)).sum().backward()
    optimizer.step()  # creates the state
    layout = capture.Layout(module, optimizer)
    layout.check()
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as from a checkpoint
    with pytest.raises(RuntimeError, match="state tensors were re-allocated"):
        layout.check()


def test_layout_detects_reallocated_parameters() -> None:
    module = mlp()
    layout = capture.Layout(module, torch.optim.Adam(module.parameters()))
    module.to(torch.float64)
    with pytest.raises(RuntimeError, match="parameter or buffer of Sequential was re-allocated"):
        layout.check()


def test_layout_detects_changed_parameter_groups() -> None:
    module = mlp()
    optimizer = torch.optim.Adam(module[0].parameters())
    layout = capture.Layout(module, optimizer)
    optimizer.add_param_group({"params": module[2].parameters()})
    with pytest.raises(RuntimeError, match="parameter groups or their settings changed"):
        layout.check()
    layout = capture.Layout(module, optimizer)
    optimizer.param_groups[0]["lr"] = 0.5
    with pytest.raises(RuntimeError, match="parameter groups or their settings changed"):
        layout.check()


@pytest.mark.parametrize("kind", ["Adam", "NAdam", "Rprop"])
def test_snapshot_restores_values_and_fresh_state_in_place(kind: str) -> None:
    """What a capture's warm-up changed comes back in the same storage; state the warm-up
    created is reset to a fresh optimizer's (zeros, or the group's value where torch
    starts from one)."""
    module = mlp()
    optimizer = getattr(torch.optim, kind)(module.parameters(), lr=0.01)
    before = [p.detach().clone() for p in module.parameters()]
    snapshot = capture.Snapshot(module, optimizer)
    for _ in range(2):
        optimizer.zero_grad()
        module(torch.ones(3, 4)).pow(2).sum().backward()
        optimizer.step()
    storages = [p.data_ptr() for p in module.parameters()]
    snapshot.restore(optimizer)
    assert [p.data_ptr() for p in module.parameters()] == storages
    for p, b in zip(module.parameters(), before, strict=True):
        assert torch.equal(p, b)
    reference = mlp()
    fresh = getattr(torch.optim, kind)(reference.parameters(), lr=0.01)
    reference(torch.ones(3, 4)).sum().backward()
    fresh.step()  # one step from fresh state, on gradients of the same shapes
    optimizer.zero_grad()
    module(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    for p, q in zip(module.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


def test_root_cause_walks_the_context_chain() -> None:
    try:
        try:
            raise ValueError("the real cause")
        except ValueError:
            raise RuntimeError("operation failed due to a previous error during capture") from None
    except RuntimeError as error:
        # `from None` hides it from the traceback but the context is still there
        assert str(capture.root_cause(error)) == "the real cause"


def test_capture_error_names_what_the_line_and_the_cause() -> None:
    try:
        try:
            raise ValueError("a host sync\nmore text")
        except ValueError:
            raise RuntimeError("operation not permitted when stream is capturing") from None
    except RuntimeError as error:
        failure = capture.capture_error("the replay sampling", error)
    assert isinstance(failure, CaptureError)
    message = str(failure)
    assert message.startswith("could not capture the replay sampling (at "
                              "tests/core/test_capture.py:")
    assert "): ValueError: a host sync; a CUDA graph cannot run code that waits" in message
    assert "\n" not in message


def test_describe_error_is_the_type_and_first_line() -> None:
    assert capture.describe_error(ValueError("first\nsecond")) == "ValueError: first"
    assert capture.describe_error(RuntimeError()) == "RuntimeError"


def test_no_garbage_is_collected_during_a_capture() -> None:
    finalized = []

    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            finalized.append(True)

    Cycle()  # unreachable, but only the cyclic collector frees it
    with capture._no_garbage_collection():
        assert finalized == [True]  # collected before the capture starts
        assert not gc.isenabled()
    assert gc.isenabled()


@pytest.mark.parametrize("fails", [False, True], ids=["captured", "capture-failed"])
def test_each_capture_gets_a_cublas_workspace_of_its_own(
        fails: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's per-stream cuBLAS workspace cache is cleared before the capture (the capture
    then allocates its own, in its graph's pool) and after it, failed or not (later work
    does not reuse the graph's), with no garbage collection in between; a capture that
    worked waits for its stream before it returns. The caller's stream is current again
    after both: torch's graph leaves its capture stream current when the capture fails."""
    log = []
    current = ["caller's stream"]

    class Graph:
        def __init__(self, graph: object, pool: object = None) -> None:
            log.append(("graph", graph, pool))

        def __enter__(self) -> None:
            log.append(("capture", gc.isenabled()))
            current[0] = "capture stream"

        def __exit__(self, *exc: object) -> None:
            log.append("end")
            if exc[0] is None:
                current[0] = "caller's stream"

    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces",
                        lambda: log.append("clear"), raising=False)
    monkeypatch.setattr(torch.cuda, "graph", Graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("wait"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: current.__setitem__(0, stream))
    expected = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
    with expected, capture.capturing("g", "pool"):
        log.append("work")
        if fails:
            raise RuntimeError("cannot capture")
    waited = [] if fails else ["wait"]
    assert log == ["clear", ("graph", "g", "pool"), ("capture", False), "work", "end", *waited,
                   "clear"]
    assert current == ["caller's stream"]
    assert gc.isenabled()
