"""benchmarks/groups.py: a group run in two time-limited jobs (the second resumes the first to
the full length, the third finds it done), read by the table's collect (short CPU runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import groups  # noqa: E402
from results import collect  # noqa: E402

from rl_graphstep.run.checkpoint import load_checkpoint  # noqa: E402


def test_a_group_goes_on_job_after_job_to_its_length(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--only", "td3:Pendulum-v1", "--log-dir", str(tmp_path), "--seeds", "2",
            "--total-timesteps", "1400", "--job-steps", "1200"]
    run_dir = tmp_path / "td3_pendulum"
    assert groups.main([*args, "--device", "cpu"]) == 0
    assert groups.steps_done(run_dir) == 1200
    assert groups.main(args) == 0  # resumed: the new group's flags are not needed again
    state = load_checkpoint(run_dir)
    assert state["global_step"] == 1400 and groups.steps_done(run_dir) == 1400
    assert state["config"]["num_seeds"] == 2 and state["config"]["device"] == "cpu"
    capsys.readouterr()
    assert groups.main(args) == 0
    assert capsys.readouterr().out.strip() == f"{run_dir}: done (1,400 steps)"
    [group] = collect([run_dir], tmp_path / "results")
    assert (group.algo, group.env_id, group.seeds) == ("td3", "Pendulum-v1", [1, 2])


def test_a_failed_group_makes_the_exit_code_and_the_others_still_run(tmp_path: Path) -> None:
    args = ["--only", "td3:NoSuchEnv-v0", "--only", "td3:Pendulum-v1", "--log-dir",
            str(tmp_path), "--seeds", "1", "--total-timesteps", "300", "--device", "cpu",
            "--learning-starts", "200"]
    assert groups.main(args) == 1
    assert groups.steps_done(tmp_path / "td3_pendulum") == 300
    assert groups.steps_done(tmp_path / "td3_nosuchenv") == 0


def test_a_group_that_is_not_algo_env_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        groups.main(["--only", "ppo:Hopper-v5"])
    assert exit_info.value.code == 2
    assert "'ppo:Hopper-v5' is not ALGO:ENV" in capsys.readouterr().err
    assert groups.run_name("sac", "HalfCheetah-v5") == "sac_halfcheetah"
    assert len(set(groups.GROUPS)) == 9
