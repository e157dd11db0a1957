"""When compiling pays (the updates a run still makes against the measured break-even), and
quiet compiling: the compiler's notices about this project's own choices are dropped, every
other warning and log record still shows; on the GPU a run's first lines carry none of them."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
from processtools import run_python

from rl_graphstep.core.compiling import (
    COMPILE_SECONDS,
    SAVED_SECONDS_PER_UPDATE,
    compile_pays,
    quiet_compiler,
    updates_ahead,
)

# What torch prints for them (torch/_inductor/compile_fx.py, torch/_dynamo/variables/*.py,
# torch/csrc/cuda/Module.cpp).
TF32_HINT = ("TensorFloat32 tensor cores for float32 matrix multiplication available but not "
             "enabled. Consider setting `torch.set_float32_matmul_precision('high')` for better "
             "performance.")
NOTICES = ("TensorFloat32 tensor cores", "will be ignored",
           "Synchronization debug mode is a prototype")


def test_updates_ahead_counts_rounds_from_learning_starts_or_the_resumed_step() -> None:
    assert updates_ahead(15_000, 0, 1_000, num_envs=1, updates_per_step=1) == 14_000
    assert updates_ahead(15_000, 9_000, 1_000, num_envs=1, updates_per_step=1) == 6_000
    assert updates_ahead(15_000, 0, 1_000, num_envs=4, updates_per_step=2) == 7_000
    assert updates_ahead(1_000, 2_000, 500, num_envs=1, updates_per_step=1) == 0


def test_compile_pays_back_at_the_measured_break_even() -> None:
    break_even = int(COMPILE_SECONDS / SAVED_SECONDS_PER_UPDATE)
    assert compile_pays(break_even + 1)[0] and not compile_pays(break_even)[0]


def test_compile_pays_says_why_in_a_few_words() -> None:
    assert compile_pays(14_000) == (False, "14,000 updates would save about 6 s, less than "
                                           "the ~30 s compilation takes")
    assert compile_pays(1_000_000) == (True, "1,000,000 updates would save about 400 s, more "
                                             "than the ~30 s compilation takes")


def test_the_tf32_hint_is_dropped_and_other_warnings_are_not() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_compiler():
            warnings.warn(TF32_HINT, stacklevel=1)
            warnings.warn("a warning of the user's own", stacklevel=1)
        warnings.warn(TF32_HINT, stacklevel=1)  # outside: shown again
    assert [str(w.message) for w in caught] == ["a warning of the user's own", TF32_HINT]


@pytest.mark.parametrize("name", ["torch._dynamo.variables.ctx_manager",
                                  "torch._dynamo.variables.torch"])
def test_the_profiler_notes_are_dropped_and_other_records_are_not(
        name: str, caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger(name)
    with caplog.at_level(logging.WARNING, logger=name):
        with quiet_compiler():
            logger.warning("Profiler record function %s will be ignored", "record_function")
            logger.warning("Profiler function %s will be ignored", "record_function")
            logger.warning("Graph break from %s", "a user's print")
        logger.warning("Profiler function %s will be ignored", "outside")
    assert [r.getMessage() for r in caplog.records] == [
        "Graph break from a user's print", "Profiler function outside will be ignored"]
    assert logger.filters == []


@pytest.mark.cuda
def test_a_compiled_cuda_run_prints_none_of_the_frameworks_notices(tmp_path: Path) -> None:
    process = run_python(
        "-m", "rl_graphstep.train", "--env", "Pendulum-v1", "--total-timesteps", "400",
        "--learning-starts", "200", "--batch-size", "64", "--compile", "on", "--no-progress",
        "--log-dir", str(tmp_path), capture_output=True, text=True, timeout=600)
    output = process.stdout + process.stderr
    print(output)
    assert process.returncode == 0
    assert "CUDA graphs + torch.compile" in output
    for notice in NOTICES:
        assert notice not in output


def test_the_trainer_and_evaluate_import_without_the_compiler() -> None:
    """Importing torch's compiler takes 1-2 s: a bad flag's line, ``--help`` and ``evaluate``
    come without it (a training run imports it with its first optimizer, as torch does)."""
    out = run_python("-c", "import sys, rl_graphstep.train, rl_graphstep.evaluate; "
                     "print('torch._dynamo' in sys.modules)", capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_method_marked_outside_the_compiler_runs_eagerly_inside_a_compiled_call() -> None:
    import torch

    from rl_graphstep.core.compiling import compile_static, outside_compiler

    compiling: list[bool] = []  # whether each call of the marked method was traced

    class Probe:
        @outside_compiler
        def add_one(self, x: torch.Tensor) -> torch.Tensor:
            compiling.append(torch.compiler.is_compiling())
            return x + 1

    probe = Probe()
    assert probe.add_one(torch.zeros(2)).tolist() == [1.0, 1.0]  # a plain method until then

    def twice_plus_two(x: torch.Tensor) -> torch.Tensor:
        return probe.add_one(x) * 2

    compiled = compile_static(twice_plus_two)
    assert compiled(torch.ones(3)).tolist() == [4.0, 4.0, 4.0]
    # Traced, it would have run once, while compiling; outside the compiler it runs each call.
    assert compiled(torch.ones(3)).tolist() == [4.0, 4.0, 4.0]
    assert compiling == [False, False, False]
