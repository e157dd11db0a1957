"""benchmarks/recipes.py: arms parsed, each run stopped at its budget and ended in every
outcome, and the comparison table of a hand-made group whose figures are worked out by hand."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import recipes  # noqa: E402
from results import GroupResult, SeedCurve, load_results  # noqa: E402


def test_an_arm_is_a_name_and_flags_split_as_a_shell_would() -> None:
    arm = recipes.parse_arm("wide+n3=--num-envs 32 --run-name 'a b'")
    assert arm == recipes.Arm("wide+n3", ["--num-envs", "32", "--run-name", "a b"])
    assert recipes.parse_arm("plain=") == recipes.Arm("plain", [])
    for bad in ("--num-envs 32", "=--n-step 3", "a/b=--n-step 3"):
        with pytest.raises(ValueError, match="NAME=FLAGS"):
            recipes.parse_arm(bad)


_STOPS_ON_SIGINT = """import signal, sys, time
def stop(*_):
    open(sys.argv[1], "w").write("saved")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
print("started", flush=True)
time.sleep(60)
"""


def test_a_run_is_stopped_with_sigint_at_its_budget_and_ends_cleanly(tmp_path: Path) -> None:
    began = time.monotonic()
    code = recipes.run_for([sys.executable, "-c", _STOPS_ON_SIGINT, str(tmp_path / "saved")],
                           1.5, tmp_path / "run.log")
    assert code == 130
    assert (tmp_path / "saved").read_text() == "saved"  # its handler ran: a clean stop
    assert "started" in (tmp_path / "run.log").read_text()
    assert 1.5 <= time.monotonic() - began < 30


def test_a_run_that_ignores_sigint_is_killed_after_the_grace(tmp_path: Path) -> None:
    ignores = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"
    code = recipes.run_for([sys.executable, "-c", ignores], 1.0, tmp_path / "run.log",
                           grace_s=1.0)
    assert code == -signal.SIGKILL


def test_a_run_that_ends_by_itself_gives_its_exit_code(tmp_path: Path) -> None:
    code = recipes.run_for([sys.executable, "-c", "import sys; sys.exit(3)"], 30.0,
                           tmp_path / "run.log")
    assert code == 3


def test_run_for_gives_the_child_the_environment_it_is_handed(tmp_path: Path) -> None:
    read = "import os, sys; open(sys.argv[1], 'w').write(os.environ['TORCHINDUCTOR_CACHE_DIR'])"
    env = {"PATH": "/usr/bin:/bin", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    code = recipes.run_for([sys.executable, "-c", read, str(tmp_path / "seen")], 30.0,
                           tmp_path / "run.log", env=env)
    assert code == 0 and (tmp_path / "seen").read_text() == str(tmp_path / "cache")


def test_each_arm_compiles_into_an_empty_cache_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the arm before it compiled, an arm starts as a first run does: its own empty
    compiler caches (inductor's and Triton's), removed once it has ended."""
    seen: list[tuple[Path, Path]] = []

    def run_for(command: list[str], budget_s: float, log: Path,
                env: dict[str, str]) -> int:
        cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])
        assert cache.is_dir() and not any(cache.iterdir())
        seen.append((cache, Path(env["TRITON_CACHE_DIR"])))
        (cache / "fxgraph").mkdir()  # what a compiling run leaves there
        run_dir = Path(command[command.index("--log-dir") + 1]) / "run"
        run_dir.mkdir()
        return 0

    monkeypatch.setattr(recipes, "run_for", run_for)
    for name in ("a", "b", "a"):  # "a" again: its earlier cache is not reused
        assert recipes.run_arm(recipes.Arm(name, []), "Pendulum-v1", 1, 1.0,
                               tmp_path) == tmp_path / name / "run"
        (tmp_path / name / "run").rmdir()
    assert [cache.name for cache, _ in seen] == ["a.compile-cache", "b.compile-cache",
                                                 "a.compile-cache"]
    assert all(triton == cache / "triton" for cache, triton in seen)
    assert not any(cache.exists() for cache, _ in seen)


def test_the_build_time_is_read_from_the_runs_output_or_missing(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    assert recipes.built_seconds(log) is None  # no output at all
    log.write_text("run: SAC on Pendulum-v1\nstopped: interrupted during start-up\n")
    assert recipes.built_seconds(log) is None  # stopped before its updates were built
    log.write_text("x\nupdates: eager, actions in line; built in 0.2 s\ndone\n")
    assert recipes.built_seconds(log) == 0.2


def hand_group() -> GroupResult:
    """Two seeds over 20 s: seed 1 ends episodes of -100 and -50 at 5 s and 15 s, seed 2 of
    -80 and -40 at 8 s and 18 s."""
    curves = [SeedCurve(1, np.array([200, 400]), np.array([-100.0, -50.0]), np.array([5.0, 15.0])),
              SeedCurve(2, np.array([200, 400]), np.array([-80.0, -40.0]), np.array([8.0, 18.0]))]
    settings = {"num_envs": 4, "batch_size": 64, "updates_per_step": 2, "learning_starts": 100}
    return GroupResult("Pendulum-v1", "sac", curves, 400, 20.0, settings, timed_from="launch",
                       machine="NVIDIA H100 80GB HBM3; 16 CPUs (x86_64); torch 2.11.0")


def test_the_iqm_curve_every_ten_seconds() -> None:
    result = recipes.summarise(recipes.Arm("a", []), hand_group())
    # At 10 s the last episodes are -100 and -80; at 20 s the means -75 and -60.
    np.testing.assert_array_equal(result.grid, [10.0, 20.0])
    np.testing.assert_allclose(result.iqm, [-90.0, -67.5])


def test_the_table_gives_the_iqm_at_each_mark_and_the_time_to_the_threshold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(recipes, "run_arm", lambda arm, *_: tmp_path / arm.name)
    monkeypatch.setattr(recipes, "read_group", lambda _: hand_group())
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text(  # what the arm's run printed
        "run: SAC on Pendulum-v1\nupdates: CUDA graphs + torch.compile, action stream; "
        "built in 41.3 s (compile auto: on)\ndone: 400 steps\n")
    code = recipes.main(["--env", "Pendulum-v1", "--num-seeds", "2", "--minutes", "0.25",
                         "--arm", "a=--n-step 3", "--threshold", "-70", "--out",
                         str(tmp_path / "out"), "--log-dir", str(tmp_path / "logs")])
    assert code == 0
    table = (tmp_path / "out" / "recipes.md").read_text()
    assert table.startswith("`python benchmarks/recipes.py --env Pendulum-v1")
    # The day it ran and the machine its runs recorded, under the command.
    assert table.splitlines()[2] == (f"{time.strftime('%Y-%m-%d')}, NVIDIA H100 80GB HBM3; "
                                     "16 CPUs (x86_64); torch 2.11.0")
    row = next(line for line in table.splitlines() if line.startswith("| a |"))
    # 400 steps x 2 seeds in 20 s; at 15 s the seeds' last-10 means are -75 and -80 (the IQM
    # of two is their mean, -77.5); the IQM curve first reaches -70 at 18 s (-75 and -60).
    # Updates: (400 - 100) / 4 = 75 iterations of 2 updates.
    assert row.split(" | ")[1:5] == ["`--n-step 3`", "400", "40", "150"]
    assert row.split(" | ")[5] == "-78 [-80, -75]"
    assert row.split(" | ")[6].startswith("0.3 min")
    assert row.split(" | ")[7] == "41.3 s |"  # the updates' build, read from the run's output
    assert "a: 400 steps per seed" in capsys.readouterr().out
    assert (tmp_path / "out" / "recipes.csv").read_text().splitlines() == [
        "arm,seconds,iqm", "a,10,-90.00", "a,20,-67.50"]
    # The arm's episodes are kept as a results folder: read back, the same group.
    (kept,) = load_results(tmp_path / "out" / "a")
    assert kept.name == "sac-4envs" and kept.wall_s == 20.0
    for curve, expected in zip(kept.curves, hand_group().curves, strict=True):
        np.testing.assert_array_equal(curve.steps, expected.steps)
        np.testing.assert_array_equal(curve.returns, expected.returns)
        np.testing.assert_array_equal(curve.seconds, expected.seconds)


def test_two_arms_need_two_names(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as stopped:
        recipes.main(["--env", "Pendulum-v1", "--minutes", "1", "--arm", "a=", "--arm", "a=",
                      "--out", str(tmp_path)])
    assert stopped.value.code == 2
