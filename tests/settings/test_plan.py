"""The run plan: what plan_run decides from the config (graphs, automatic compiling only where
it pays, the action stream), how fall_back changes it after a failed build, when the action
stream settles off, and how a plan describes itself."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import rl_graphstep.settings.plan as plan_module
from rl_graphstep.core.errors import CaptureError, CompileError, ConfigError
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import (
    RunPlan,
    fall_back,
    matmul_precision,
    plan_run,
    resolve_device,
    settle_action_stream,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # plan_run reads the device's type only
LONG_RUN, SHORT_RUN = 1_000_000, 14_000


def plan(device: torch.device = CUDA, updates: int = LONG_RUN, **cfg: object) -> RunPlan:
    return plan_run(Config(**cfg), device, updates_ahead=updates)


def test_graphs_follow_the_flag_and_auto_takes_them_on_cuda_only() -> None:
    assert plan(CUDA, graph="auto").graphs is True
    assert plan(CPU, graph="auto").graphs is False
    assert plan(CUDA, graph="on").graphs is True
    assert plan(CUDA, graph="off").graphs is False
    with pytest.raises(ConfigError, match="--graph on needs a CUDA device, but training runs "
                                          "on cpu; use --graph auto or --graph off"):
        plan(CPU, graph="on")
    # Only an automatic choice falls back when a capture fails.
    assert plan(CUDA, graph="auto").graph_fallback is True
    assert plan(CUDA, graph="on").graph_fallback is False
    assert plan(CPU, graph="auto").graph_fallback is False


def test_compile_auto_only_for_graphs_of_runs_long_enough_to_pay_it_back() -> None:
    long = plan(CUDA, LONG_RUN, compile="auto")
    assert (long.compile, long.compile_fallback) == (True, True)
    assert long.compile_note == ("compile auto: on, 1,000,000 updates would save about 400 s, "
                                 "more than the ~30 s compilation takes")
    # The README's Pendulum run: 14,000 updates save ~6 s, against ~30 s of compiling.
    short = plan(CUDA, SHORT_RUN, compile="auto")
    assert (short.compile, short.compile_fallback) == (False, False)
    assert short.compile_note == ("compile auto: off, 14,000 updates would save about 6 s, "
                                  "less than the ~30 s compilation takes")
    # Eager steps stay uncompiled, however long the run.
    eager = plan(CPU, LONG_RUN, compile="auto")
    assert (eager.compile, eager.compile_note) == (False, "")
    assert plan(CUDA, LONG_RUN, compile="auto", graph="off").compile is False


def test_compile_on_and_off_are_kept_and_never_fall_back() -> None:
    on = plan(CPU, 0, compile="on")
    assert (on.compile, on.compile_fallback, on.compile_note) == (True, False, "")
    off = plan(CUDA, LONG_RUN, compile="off")
    assert (off.compile, off.compile_note) == (False, "")


def test_the_action_stream_needs_graphs_and_on_insists() -> None:
    assert plan(CUDA, action_stream="auto").action_stream is True
    assert plan(CUDA, action_stream="off").action_stream is False
    assert plan(CPU, action_stream="auto").action_stream is False
    insisted = plan(CPU, action_stream="on")
    assert (insisted.action_stream, insisted.insist_on_action_stream) == (False, True)
    assert plan(CUDA, action_stream="auto").insist_on_action_stream is False


@pytest.mark.parametrize(("device", "seeds", "envs", "cpus", "x86", "chosen"), [
    (CUDA, 8, 1, 16, True, "shared"),   # a seed group on the GPU host: shared
    (CUDA, 1, 4, 16, True, "shared"),   # several envs of one seed too
    (CUDA, 1, 1, 16, True, "sync"),     # one env: nothing to step at once
    (CUDA, 8, 1, 3, True, "sync"),      # too few CPUs: the workers would take turns
    (CUDA, 8, 1, 16, False, "sync"),    # the shared env's polling needs x86-64
    (CPU, 8, 1, 16, True, "sync"),      # eager updates on the CPU use the CPUs themselves
])
def test_vec_env_auto_takes_the_shared_env_where_it_measured_fastest(
        monkeypatch: pytest.MonkeyPatch, device: torch.device, seeds: int, envs: int,
        cpus: int, x86: bool, chosen: str) -> None:
    monkeypatch.setattr(plan_module, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(plan_module, "ordered_stores", lambda: x86)
    assert Config().vec_env == "auto"
    assert plan(device, num_seeds=seeds, num_envs=envs).vec_env == chosen
    # An explicit choice is kept whatever the machine.
    for kind in ("sync", "async", "shared"):
        assert plan(device, num_seeds=seeds, num_envs=envs, vec_env=kind).vec_env == kind


def test_a_cpu_budget_decides_auto_and_the_shared_envs_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that shares its machine (a sweep's trial) counts its own CPUs, not the node's."""
    monkeypatch.setattr(plan_module, "usable_cpus", lambda: 16)
    monkeypatch.setattr(plan_module, "ordered_stores", lambda: True)
    group = {"num_seeds": 8}
    assert (plan(**group).vec_env, plan(**group).env_workers) == ("shared", 15)
    budget = plan_run(Config(**group), CUDA, updates_ahead=LONG_RUN, cpus=6)
    assert (budget.vec_env, budget.env_workers) == ("shared", 5)
    few = plan_run(Config(**group), CUDA, updates_ahead=LONG_RUN, cpus=3)
    assert few.vec_env == "sync"
    one = plan_run(Config(**group, vec_env="shared"), CUDA, updates_ahead=LONG_RUN, cpus=1)
    assert (one.vec_env, one.env_workers) == ("shared", 1)  # as asked, on one worker
    with pytest.raises(ValueError, match="cpus must be at least 1, got 0"):
        plan_run(Config(**group), CUDA, updates_ahead=LONG_RUN, cpus=0)


def test_the_plan_keeps_the_device_env_kind_and_precision() -> None:
    made = plan(CPU, vec_env="async", tf32=True)
    assert (made.device, made.vec_env, made.tf32) == (CPU, "async", False)  # no TF32 on CPUs
    assert plan(CUDA, tf32=True).tf32 is True
    assert plan(CUDA).tf32 is Config().tf32
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.graphs = True  # type: ignore[misc]


AUTO = RunPlan(device=CUDA, graphs=True, compile=True, action_stream=True, vec_env="sync",
               tf32=False, graph_fallback=True, compile_fallback=True)


def test_a_compiler_failure_falls_back_to_uncompiled_where_compile_was_automatic() -> None:
    with pytest.warns(UserWarning, match="^could not compile X: boom; running the updates "
                                         "uncompiled instead$"):
        after = fall_back(AUTO, CompileError("could not compile X: boom"))
    assert after == dataclasses.replace(AUTO, compile=False, compile_fallback=False)
    assert after.graphs and after.action_stream  # the graphs stay
    with pytest.raises(CompileError, match="boom"):  # --compile on
        fall_back(dataclasses.replace(AUTO, compile_fallback=False), CompileError("boom"))
    with pytest.raises(CompileError, match="boom"):  # already uncompiled
        fall_back(after, CompileError("boom"))


def test_a_capture_failure_falls_back_to_eager_where_graphs_were_automatic() -> None:
    with pytest.warns(UserWarning, match="^could not capture X: a host sync; running the "
                                         "updates eagerly instead$"):
        after = fall_back(AUTO, CaptureError("could not capture X: a host sync"))
    # Automatic compiling goes with the graphs (eager steps stay uncompiled).
    assert after == dataclasses.replace(AUTO, graphs=False, graph_fallback=False, compile=False,
                                        action_stream=False)
    # --compile on stays on, eagerly.
    insisted = dataclasses.replace(AUTO, compile_fallback=False)
    with pytest.warns(UserWarning):
        assert fall_back(insisted, CaptureError("x")).compile is True
    with pytest.raises(CaptureError, match="a host sync"):  # --graph on
        fall_back(dataclasses.replace(AUTO, graph_fallback=False), CaptureError("a host sync"))
    with pytest.raises(CaptureError, match="a host sync"):  # already eager
        fall_back(after, CaptureError("a host sync"))


def test_a_compiler_failure_never_costs_the_graphs() -> None:
    """--compile on with --graph auto: a compiler failure is raised, not taken for a
    capture failure (which would drop the graphs and keep the failing compile)."""
    with pytest.raises(CompileError, match="boom"):
        fall_back(dataclasses.replace(AUTO, compile_fallback=False), CompileError("boom"))


def test_the_action_stream_settles_off_without_host_noise_or_graphs() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # automatic: no warning
        assert settle_action_stream(AUTO, 6, "Actor") is AUTO
        assert settle_action_stream(AUTO, 0, "Actor") == dataclasses.replace(
            AUTO, action_stream=False)
        off = dataclasses.replace(AUTO, action_stream=False)
        assert settle_action_stream(off, 0, "Actor") is off
    insisted = dataclasses.replace(AUTO, insist_on_action_stream=True)
    with pytest.warns(UserWarning, match=r"^--action-stream: acting on the updates' stream "
                                         r"instead \(MyActor has no sample\(observations, "
                                         r"noise\), so the action would draw its noise on the "
                                         r"device\)$"):
        assert settle_action_stream(insisted, 0, "MyActor").action_stream is False
    eager = dataclasses.replace(insisted, graphs=False, action_stream=False)
    with pytest.warns(UserWarning, match=r"\(it needs CUDA graphs\)$"):
        assert settle_action_stream(eager, 6, "MyActor").action_stream is False
    assert settle_action_stream(insisted, 6, "MyActor") is insisted


def test_describe_names_every_mode() -> None:
    assert AUTO.describe() == ("CUDA graphs + torch.compile, action stream, sync envs, "
                               "float32 matmuls")
    eager = RunPlan(device=CPU, graphs=False, compile=False, action_stream=False,
                    vec_env="async", tf32=True)
    assert eager.describe() == "eager, actions in line, async envs, TF32 matmuls"


def test_tf32_is_planned_on_cuda_only() -> None:
    """A CPU has no TF32: the plan's line says float32 there, whatever the config asks."""
    assert plan_run(Config(tf32=True), CUDA, updates_ahead=LONG_RUN, cpus=2).tf32 is True
    assert plan_run(Config(tf32=False), CUDA, updates_ahead=LONG_RUN, cpus=2).tf32 is False
    on_cpu = plan_run(Config(tf32=True), CPU, updates_ahead=LONG_RUN, cpus=2)
    assert on_cpu.tf32 is False and on_cpu.describe().endswith("float32 matmuls")


def test_resolve_device() -> None:
    assert resolve_device(Config(device="cpu")) == CPU
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(Config(device="auto")).type == expected
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="--device cuda was asked for, but no CUDA GPU"):
            resolve_device(Config(device="cuda"))


def test_matmul_precision_is_set_inside_and_restored_after() -> None:
    before = torch.get_float32_matmul_precision()
    with matmul_precision(True):
        assert torch.get_float32_matmul_precision() == "high"
    with matmul_precision(False):
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.get_float32_matmul_precision() == before
