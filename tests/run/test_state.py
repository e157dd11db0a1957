"""Checkpoints of a run, saved and put back (``rl_graphstep.run.state``): those written by
rl_graphstep 0.1.0, before the learner and the algorithms were separated, still load.

The data: two runs of 600 steps written by that version (tiny networks), and the learning
state the same version reached when it resumed the SAC run (saved with its buffer, so the
continuation is exact) to step 900, as a SHA-256 per tensor. Those hashes depend on the torch
build, its CPU kernels and the CPU's vendor (MKL), so they are kept per platform
(tests/recordings.py); the comparison skips, saying so, where none was recorded on a platform
like this one. Recording resumes the run with this version, so record a new platform only with
a version that still resumes as 0.1.0 did (the test passes on a recorded platform); it adds this
platform's hashes, or replaces those made on the same platform, and keeps the others::

    python tests/run/test_state.py --record
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from recordings import cpu_platform, record_here, recording_here

from rl_graphstep.evaluate import evaluate
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.train import main

DATA = Path(__file__).parents[1] / "fixtures" / "v0.1.0_runs"
RESUMED = DATA / "old_sac_resumed_to_900.json"
RECORD = "python tests/run/test_state.py --record"


def hashes(value: Any, prefix: str = "agent") -> dict[str, str]:
    """SHA-256 of every tensor in a (nested) checkpoint value, by dotted name."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().numpy().tobytes()
        return {prefix: hashlib.sha256(data).hexdigest()}
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list | tuple) else ())
    return {k: v for key, item in items for k, v in hashes(item, f"{prefix}.{key}").items()}


def resume_to_900(run: Path) -> dict[str, Any]:
    """Resume the (copied) 0.1.0 SAC run ``run`` to step 900 with this version; the checkpoint
    it saves there."""
    assert main(["--resume", str(run), "--total-timesteps", "900", "--no-progress"]) == 0
    return torch.load(run / "checkpoints" / "step_000000000900.pt", weights_only=False)


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
    state = resume_to_900(run)
    assert "resumed at step 600" in capsys.readouterr().out
    assert state["config"]["vec_env"] == "sync" and "async_envs" not in state["config"]
    expected, got = recording_here(RESUMED, RECORD)["hashes"], hashes(state["agent"])
    assert got.keys() == expected.keys()
    assert [name for name in expected if got[name] != expected[name]] == []


def test_a_checkpoint_of_version_0_1_0_evaluates(old_run: Any) -> None:
    result = evaluate(old_run("old_td3"), episodes=1, device="cpu", verbose=False)
    assert len(result.returns) == 1 and -2000 < result.mean < 0


def record() -> None:
    """Resume the 0.1.0 SAC run to step 900 as the test does, on one intra-op thread as the
    tests run (tests/conftest.py), and write this platform's hashes into RESUMED, in place of
    the ones made on the same platform or added; the others are kept."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        run = Path(shutil.copytree(DATA / "old_sac", Path(folder) / "old_sac"))
        got = hashes(resume_to_900(run)["agent"])
    record_here(RESUMED, {"platform": cpu_platform(), "hashes": dict(sorted(got.items()))},
                DATA.parents[2])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", required=True,
                        help="resume the 0.1.0 SAC run to step 900 and record its hashes "
                             "for this platform")
    parser.parse_args()
    record()
