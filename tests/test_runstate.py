"""Checkpoints of a run, saved and put back (``rl_graphstep.runstate``): those written by
rl_graphstep 0.1.0, before the learner and the algorithms were separated, still load.

The data: two runs of 600 steps written by that version (tiny networks), and the learning
state the same version reached when it resumed the SAC run (saved with its buffer, so the
continuation is exact) to step 900.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_graphstep.checkpoint import load_checkpoint
from rl_graphstep.evaluate import evaluate
from rl_graphstep.train import main

DATA = Path(__file__).parent / "data" / "v0.1.0_runs"


def hashes(value: Any, prefix: str = "agent") -> dict[str, str]:
    """SHA-256 of every tensor in a (nested) checkpoint value, by dotted name."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().numpy().tobytes()
        return {prefix: hashlib.sha256(data).hexdigest()}
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list | tuple) else ())
    return {k: v for key, item in items for k, v in hashes(item, f"{prefix}.{key}").items()}


@pytest.fixture
def old_run(tmp_path: Path) -> Any:
    def copy(name: str) -> Path:
        return Path(shutil.copytree(DATA / name, tmp_path / name))
    return copy


def test_a_checkpoint_of_version_0_1_0_resumes_exactly_as_that_version_did(
        old_run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    run = old_run("old_sac")
    saved = load_checkpoint(run)["config"]
    # Written before --vec-env: it names the settings that are gone.
    assert {"async_envs", "env_worker", "overlap"} <= set(saved)
    assert main(["--resume", str(run), "--total-timesteps", "900", "--no-progress"]) == 0
    assert "resumed at step 600" in capsys.readouterr().out
    state = torch.load(run / "checkpoints" / "step_000000000900.pt", weights_only=False)
    assert state["config"]["vec_env"] == "sync" and "async_envs" not in state["config"]
    expected = json.loads((DATA / "old_sac_resumed_to_900.json").read_text())
    got = hashes(state["agent"])
    assert got.keys() == expected.keys()
    assert [name for name in expected if got[name] != expected[name]] == []


def test_a_checkpoint_of_version_0_1_0_evaluates(old_run: Any) -> None:
    result = evaluate(old_run("old_td3"), episodes=1, device="cpu", verbose=False)
    assert len(result.returns) == 1 and -2000 < result.mean < 0
