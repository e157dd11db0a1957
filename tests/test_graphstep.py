"""CPU tests of the adaptation step contract: the eager twin, clipping, errors, the factory."""

from __future__ import annotations

import contextlib
import copy
import gc

import pytest
import torch
from torch import nn

from rl_graphstep import graphstep
from rl_graphstep.errors import CaptureError
from rl_graphstep.graphstep import (
    CudaGraphAdaptationStep,
    EagerAdaptationStep,
    clip_grad_norm,
    make_adaptation_step,
)


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))


def mse(prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((prediction - targets) ** 2).mean()


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)) for _ in range(n)]


def test_eager_step_equals_hand_written_update() -> None:
    module, reference = mlp(), mlp()
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    data = batches(5)
    clip = clip_grad_norm(module.parameters(), 0.5)
    step = EagerAdaptationStep.capture(module, optimizer, *data[0], mse, gradient_transform=clip)
    for inputs, targets in data:
        loss = step(inputs, targets)
        ref_optimizer.zero_grad()
        ref_loss = mse(reference(inputs), targets)
        ref_loss.backward()
        nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        ref_optimizer.step()
        assert torch.equal(loss, ref_loss.detach())
    for p, q in zip(module.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)
    assert optimizer.state[next(iter(module.parameters()))]["step"].item() == len(data)


def test_capture_consumes_no_update_and_no_random_numbers() -> None:
    module = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 2))
    before = copy.deepcopy(module.state_dict())
    optimizer = torch.optim.Adam(module.parameters())
    rng = torch.get_rng_state()
    EagerAdaptationStep.capture(module, optimizer, *batches(1)[0], mse)
    assert torch.equal(torch.get_rng_state(), rng)
    assert not optimizer.state
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key])


def test_clip_bounds_the_update_and_records_the_norm() -> None:
    module = mlp()
    start = [p.detach().clone() for p in module.parameters()]
    clip = clip_grad_norm(module.parameters(), max_norm=0.1)
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    inputs, targets = batches(1)[0]
    reference = mlp()
    mse(reference(inputs), 100 * targets).backward()
    expected_norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in reference.parameters()])
    )
    step = EagerAdaptationStep.capture(module, optimizer, inputs, 100 * targets, mse,
                                       gradient_transform=clip)
    step(inputs, 100 * targets)
    assert expected_norm > 1.0  # clipping is active
    torch.testing.assert_close(clip.norm, expected_norm)
    moved = torch.linalg.vector_norm(
        torch.cat([(p - s).flatten() for p, s in zip(module.parameters(), start, strict=True)])
    )
    torch.testing.assert_close(moved, torch.tensor(0.1), rtol=1e-4, atol=0)


def test_clip_with_infinite_max_norm_only_records() -> None:
    module = mlp()
    clip = clip_grad_norm(module.parameters(), float("inf"))
    mse(module(torch.ones(3, 4)), torch.zeros(3, 2)).backward()
    grads = [p.grad.clone() for p in module.parameters()]
    clip()
    assert clip.norm > 0
    for p, g in zip(module.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)


def test_optimizer_over_a_subset_changes_only_that_subset() -> None:
    module = mlp()
    frozen_critic = nn.Linear(2, 1)
    first, last = module[0], module[2]
    first_before = [p.detach().clone() for p in first.parameters()]
    last_before = [p.detach().clone() for p in last.parameters()]
    critic_before = [p.detach().clone() for p in frozen_critic.parameters()]
    optimizer = torch.optim.Adam(last.parameters(), lr=1e-2)

    def loss_through_critic(prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return mse(prediction, targets) - frozen_critic(prediction).mean()

    step = EagerAdaptationStep.capture(module, optimizer, *batches(1)[0], loss_through_critic)
    for inputs, targets in batches(3):
        step(inputs, targets)
    for p, b in zip(first.parameters(), first_before, strict=True):
        assert torch.equal(p, b) and p.grad is None
    for p, b in zip(frozen_critic.parameters(), critic_before, strict=True):
        assert torch.equal(p, b) and p.grad is None
    assert all(not torch.equal(p, b) for p, b in zip(last.parameters(), last_before, strict=True))


def test_factory_picks_the_eager_twin_on_cpu() -> None:
    module = mlp()
    step = make_adaptation_step(module, torch.optim.Adam(module.parameters()), *batches(1)[0], mse)
    assert isinstance(step, EagerAdaptationStep)
    assert step.graph is None


def test_factory_refuses_a_graph_on_cpu() -> None:
    module = mlp()
    with pytest.raises(ValueError, match="CUDA graphs need CUDA tensors.*--graph off"):
        make_adaptation_step(module, torch.optim.Adam(module.parameters()), *batches(1)[0], mse,
                             use_graph=True)


@pytest.fixture
def step() -> EagerAdaptationStep:
    module = mlp()
    return EagerAdaptationStep.capture(module, torch.optim.Adam(module.parameters()),
                                       *batches(1)[0], mse)


def test_call_rejects_a_wrong_shape(step: EagerAdaptationStep) -> None:
    with pytest.raises(ValueError, match=r"inputs has shape \(9, 4\), expected \(8, 4\)"):
        step(torch.zeros(9, 4), torch.zeros(8, 2))


def test_call_rejects_a_wrong_dtype(step: EagerAdaptationStep) -> None:
    with pytest.raises(TypeError, match="targets has dtype torch.float64, expected torch.float32"):
        step(torch.zeros(8, 4), torch.zeros(8, 2, dtype=torch.float64))


def test_call_rejects_a_wrong_device(step: EagerAdaptationStep) -> None:
    with pytest.raises(ValueError, match="inputs is on meta, expected cpu"):
        step(torch.zeros(8, 4, device="meta"), torch.zeros(8, 2))


def test_call_rejects_a_non_tensor(step: EagerAdaptationStep) -> None:
    with pytest.raises(TypeError, match="inputs must be a torch.Tensor, got list"):
        step([[0.0] * 4] * 8, torch.zeros(8, 2))


def test_capture_rejects_a_non_scalar_loss() -> None:
    module = mlp()
    with pytest.raises(ValueError, match=r"returned shape \(8, 2\), expected a scalar"):
        EagerAdaptationStep.capture(module, torch.optim.Adam(module.parameters()),
                                    *batches(1)[0], lambda p, t: (p - t) ** 2)


def test_capture_rejects_a_loss_without_grad() -> None:
    module = mlp()
    with pytest.raises(ValueError, match="does not require grad"):
        EagerAdaptationStep.capture(module, torch.optim.Adam(module.parameters()),
                                    *batches(1)[0], lambda p, t: t.sum())


@pytest.mark.parametrize("warmup", [0, -1, 1.5])
def test_capture_rejects_bad_warmup_steps(warmup: object) -> None:
    module = mlp()
    with pytest.raises(ValueError, match="warmup_steps must be an int >= 1"):
        EagerAdaptationStep.capture(module, torch.optim.Adam(module.parameters()),
                                    *batches(1)[0], mse, warmup_steps=warmup)


def test_graph_step_rejects_cpu_tensors() -> None:
    module = mlp()
    with pytest.raises(ValueError, match="example_inputs is on cpu, expected a CUDA device"):
        CudaGraphAdaptationStep.capture(module, torch.optim.Adam(module.parameters()),
                                        *batches(1)[0], mse)


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        (lambda ps: torch.optim.SGD(ps, lr=0.1), "SGD cannot be captured in a CUDA graph"),
        (lambda ps: torch.optim.Adagrad(ps), "Adagrad cannot be captured in a CUDA graph"),
        (lambda ps: torch.optim.Adam(ps), r"Adam param group 0 has capturable=False"),
    ],
)
def test_uncapturable_optimizers_are_named(optimizer, message: str) -> None:
    with pytest.raises(CaptureError, match=message):
        graphstep._check_capturable(optimizer(mlp().parameters()))


def test_layout_detects_reallocated_optimizer_state() -> None:
    module = mlp()
    optimizer = torch.optim.Adam(module.parameters())
    EagerAdaptationStep.capture(module, optimizer, *batches(1)[0], mse)(*batches(1)[0])
    layout = graphstep._Layout(module, optimizer)
    layout.check()
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as from a checkpoint
    with pytest.raises(RuntimeError, match="state tensors were re-allocated"):
        layout.check()


def test_layout_detects_reallocated_parameters() -> None:
    module = mlp()
    layout = graphstep._Layout(module, torch.optim.Adam(module.parameters()))
    module.to(torch.float64)
    with pytest.raises(RuntimeError, match="parameter or buffer of Sequential was re-allocated"):
        layout.check()


def test_layout_detects_changed_parameter_groups() -> None:
    module = mlp()
    optimizer = torch.optim.Adam(module[0].parameters())
    layout = graphstep._Layout(module, optimizer)
    optimizer.add_param_group({"params": module[2].parameters()})
    with pytest.raises(RuntimeError, match="parameter groups or their settings changed"):
        layout.check()
    layout = graphstep._Layout(module, optimizer)
    optimizer.param_groups[0]["lr"] = 0.5
    with pytest.raises(RuntimeError, match="parameter groups or their settings changed"):
        layout.check()


def test_root_cause_walks_the_context_chain() -> None:
    try:
        try:
            raise ValueError("the real cause")
        except ValueError:
            raise RuntimeError("operation failed due to a previous error during capture") from None
    except RuntimeError as error:
        # `from None` hides it from the traceback but the context is still there
        assert str(graphstep._root_cause(error)) == "the real cause"


def test_no_garbage_is_collected_during_a_capture() -> None:
    finalized = []

    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            finalized.append(True)

    Cycle()  # unreachable, but only the cyclic collector frees it
    with graphstep._no_garbage_collection():
        assert finalized == [True]  # collected before the capture starts
        assert not gc.isenabled()
    assert gc.isenabled()


@pytest.mark.parametrize("fails", [False, True], ids=["captured", "capture-failed"])
def test_each_capture_gets_a_cublas_workspace_of_its_own(
        fails: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's per-stream cuBLAS workspace cache is cleared before the capture (the capture
    then allocates its own, in its graph's pool) and after it, failed or not (later work
    does not reuse the graph's), with no garbage collection in between."""
    log = []

    class Graph:
        def __init__(self, graph: object, pool: object = None) -> None:
            log.append(("graph", graph, pool))

        def __enter__(self) -> None:
            log.append(("capture", gc.isenabled()))

        def __exit__(self, *exc: object) -> None:
            log.append("end")

    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces",
                        lambda: log.append("clear"), raising=False)
    monkeypatch.setattr(torch.cuda, "graph", Graph)
    expected = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
    with expected, graphstep._capturing("g", "pool"):
        log.append("work")
        if fails:
            raise RuntimeError("cannot capture")
    assert log == ["clear", ("graph", "g", "pool"), ("capture", False), "work", "end", "clear"]
    assert gc.isenabled()


def test_compiled_eager_step_matches_the_uncompiled_one() -> None:
    """torch.compile of the step bodies fuses kernels; the update it computes is the same."""
    def run(compile: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                     torch.nn.Linear(8, 1))
        optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
        inputs, targets = torch.randn(16, 4), torch.randn(16, 1)
        step = EagerAdaptationStep.capture(
            module, optimizer, inputs, targets, torch.nn.functional.mse_loss,
            gradient_transform=lambda: torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0),
            skip_nonfinite=True, compile=compile)
        losses = [step(inputs, targets) for _ in range(4)]
        return [*losses, *module.parameters()]

    for a, b in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def failing_compile(function: object, **_: object) -> object:
    def compiled(*args: object) -> None:
        raise RuntimeError("the compiler gave up")
    return compiled


def test_a_part_the_compiler_fails_on_runs_uncompiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", failing_compile)
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    inputs, targets = torch.randn(8, 3), torch.randn(8, 1)
    step = EagerAdaptationStep.capture(module, optimizer, inputs, targets,
                                       torch.nn.functional.mse_loss, compile=True)
    before = module.weight.detach().clone()
    step(inputs, targets)  # the first call is uncompiled anyway
    with pytest.warns(UserWarning) as warned:
        step(inputs, targets)
    assert [str(w.message) for w in warned] == [
        f"torch.compile failed on the {part} of Linear (RuntimeError: the compiler gave up); "
        "that part runs uncompiled"
        for part in ("forward and loss", "gradient transform and optimizer step")]
    assert step._body.uncompiled_parts == ["forward and loss",
                                           "gradient transform and optimizer step"]
    assert not torch.equal(module.weight, before)
    assert optimizer.state[module.weight]["step"] == 2  # two updates, none doubled


def test_every_step_built_in_one_process_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile keeps at most 8 compiled versions of one code object, and all steps run
    the same code guarded on their own optimizer: the tenth step built in a process (a sweep,
    a benchmark, a test session) must still be compiled, not silently run uncompiled."""
    from torch._dynamo.utils import counters

    real = torch.compile
    # The eager backend traces as the real one does but generates no code: fast on a CPU.
    monkeypatch.setattr(torch, "compile", lambda function, **_: real(function, backend="eager"))
    torch._dynamo.reset()
    graphs_per_step = []
    for _ in range(10):
        module = torch.nn.Linear(3, 1)
        optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
        inputs, targets = torch.randn(8, 3), torch.randn(8, 1)
        step = EagerAdaptationStep.capture(module, optimizer, inputs, targets,
                                           torch.nn.functional.mse_loss, compile=True)
        before = counters["stats"]["unique_graphs"]
        for _ in range(3):  # the first call runs uncompiled
            step(inputs, targets)
        graphs_per_step.append(counters["stats"]["unique_graphs"] - before)
    assert graphs_per_step[0] >= 2  # forward + loss, and the optimizer part
    assert graphs_per_step == [graphs_per_step[0]] * 10
