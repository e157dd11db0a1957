"""CPU tests of the adaptation step contract: the eager twin, the documented constructor and
signatures, errors, the factory, the package's public names."""

from __future__ import annotations

import copy
import importlib
import inspect

import pytest
import torch
from torch import nn

import rl_graphstep
from rl_graphstep import graphstep
from rl_graphstep.core.errors import CaptureError
from rl_graphstep.core.guards import clip_grad_norm
from rl_graphstep.graphstep import (
    CudaGraphAdaptationStep,
    EagerAdaptationStep,
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


# The specification's constructor and capture, by name and kind of parameter.
SIX_FIELDS = ["module", "optimizer", "static_inputs", "static_targets", "graph", "static_loss"]
CAPTURE = ["module", "optimizer", "example_inputs", "example_targets", "loss_function"]


def extras(parameters: list[inspect.Parameter], documented: list[str]) -> list[inspect.Parameter]:
    """The parameters past the documented positional ones, which are checked to come first."""
    assert [p.name for p in parameters[: len(documented)]] == documented
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in parameters[: len(documented)])
    return parameters[len(documented):]


def test_the_constructor_takes_the_six_documented_fields_and_keyword_only_extras() -> None:
    parameters = list(inspect.signature(CudaGraphAdaptationStep).parameters.values())
    rest = extras(parameters, SIX_FIELDS)
    assert rest and all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in rest)


@pytest.mark.parametrize("kind", [CudaGraphAdaptationStep, EagerAdaptationStep])
def test_capture_takes_the_documented_arguments_and_keyword_only_extras(kind: type) -> None:
    parameters = list(inspect.signature(kind.capture).parameters.values())
    rest = extras(parameters, CAPTURE)
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in rest)
    defaults = {p.name: p.default for p in rest}
    assert defaults["warmup_steps"] == 3 and defaults["gradient_transform"] is None


class HandGraph:
    """Stands in for a CUDA graph on the CPU (no graph can be made there): ``replay()`` runs
    the update it was given, on the same tensors, as a captured one would."""

    def __init__(self, update) -> None:
        self.update = update
        self.replays = 0

    def pool(self) -> tuple[str, int]:
        return ("pool", id(self))

    def replay(self) -> None:
        self.update()
        self.replays += 1


def hand_built_step() -> tuple[CudaGraphAdaptationStep, HandGraph]:
    """A step built from exactly the six documented fields, positionally."""
    module = mlp()
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    static_inputs, static_targets = (t.clone() for t in batches(1, seed=7)[0])
    static_loss = torch.zeros(())

    def update() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = mse(module(static_inputs), static_targets)
        loss.backward()
        optimizer.step()
        static_loss.copy_(loss.detach())

    update()  # as a capture's warm-up does: it creates the optimizer state the graph updates
    graph = HandGraph(update)
    step = CudaGraphAdaptationStep(module, optimizer, static_inputs, static_targets, graph,
                                   static_loss)
    return step, graph


def test_a_step_built_from_the_six_documented_fields_copies_and_replays() -> None:
    step, graph = hand_built_step()
    reference = mlp()
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)

    def reference_update(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        ref_optimizer.zero_grad()
        loss = mse(reference(inputs), targets)
        loss.backward()
        ref_optimizer.step()
        return loss.detach()

    reference_update(*batches(1, seed=7)[0])  # the hand-built step's warm-up
    assert step.pool == graph.pool() and step.guard is None
    for inputs, targets in batches(3):
        loss = step(inputs, targets)
        assert torch.equal(loss, reference_update(inputs, targets))
        assert torch.equal(step.static_inputs, inputs)  # copied into the static buffers
        assert loss.data_ptr() != step.static_loss.data_ptr()  # a clone of the graph's loss
    assert graph.replays == 3
    for p, q in zip(step.module.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_hand_built_step_checks_its_inputs_and_layout() -> None:
    step, graph = hand_built_step()
    with pytest.raises(ValueError, match=r"inputs has shape \(9, 4\), expected \(8, 4\)"):
        step(torch.zeros(9, 4), torch.zeros(8, 2))
    step.module[0].weight.data = step.module[0].weight.data.clone()
    with pytest.raises(RuntimeError, match="parameter or buffer of Sequential was re-allocated"):
        step(*batches(1)[0])
    assert graph.replays == 0


def test_run_update_without_a_body_says_it_needs_capture() -> None:
    step, graph = hand_built_step()
    with pytest.raises(CaptureError, match=r"run_update needs the step's update body.*"
                                           r"CudaGraphAdaptationStep\.capture\(\.\.\.\)"):
        step.run_update()
    assert graph.replays == 0
    step.replay()  # replaying its graph still works
    assert graph.replays == 1


def test_an_eager_step_built_directly_runs_as_a_captured_one() -> None:
    data = batches(4)
    built_module, captured_module = mlp(), mlp()
    built = EagerAdaptationStep(
        built_module, torch.optim.Adam(built_module.parameters(), lr=1e-2),
        data[0][0].clone(), data[0][1].clone(), mse,
        gradient_transform=clip_grad_norm(built_module.parameters(), 0.5), skip_nonfinite=True)
    captured = EagerAdaptationStep.capture(
        captured_module, torch.optim.Adam(captured_module.parameters(), lr=1e-2), *data[0], mse,
        gradient_transform=clip_grad_norm(captured_module.parameters(), 0.5),
        skip_nonfinite=True)
    for inputs, targets in data:
        assert torch.equal(built(inputs, targets), captured(inputs, targets))
    for p, q in zip(built_module.parameters(), captured_module.parameters(), strict=True):
        assert torch.equal(p, q)
    assert built.guard is not None and built.guard.skipped.item() == 0


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


def test_compiled_steps_keep_every_shape_static(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two steps whose optimizers run Adam's code with other shapes, in one process: neither
    is compiled with a symbolic shape. By default the second would be (the compiler sees the
    shapes at Adam.step change), and its kernels then depended on what compiled before it."""
    real = torch.compile
    seen: list[object] = []

    def recording(graph: torch.fx.GraphModule, example_inputs: list[object]) -> object:
        # What the compiler traced each input as: a tensor's shape, or a size of its own.
        seen.extend(node.meta.get("example_value") for node in graph.graph.nodes
                    if node.op == "placeholder")
        return graph.forward

    monkeypatch.setattr(torch, "compile",
                        lambda function, **kwargs: real(function, backend=recording, **kwargs))
    torch._dynamo.reset()
    for size_in, size_out in ((3, 1), (5, 2)):
        module = torch.nn.Linear(size_in, size_out)
        optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
        inputs, targets = torch.randn(8, size_in), torch.randn(8, size_out)
        step = EagerAdaptationStep.capture(module, optimizer, inputs, targets,
                                           torch.nn.functional.mse_loss, compile=True)
        for _ in range(3):  # the first call runs uncompiled
            step(inputs, targets)
    tensors = [x for x in seen if isinstance(x, torch.Tensor)]
    assert tensors
    assert not [x for x in seen if isinstance(x, torch.SymInt)]
    assert not [x for x in tensors if any(isinstance(d, torch.SymInt) for d in x.shape)]


def test_the_package_exports_the_public_contract() -> None:
    for name in rl_graphstep.__all__:
        home = importlib.import_module(rl_graphstep._HOMES[name])
        assert getattr(rl_graphstep, name) is getattr(home, name)
    assert set(rl_graphstep._HOMES) == set(rl_graphstep.__all__)
