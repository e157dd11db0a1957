"""benchmarks/groups.py: a group run in two time-limited jobs (the second resumes the first to
the full length, the third finds it done), read by the table's collect (short CPU runs)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import groups  # noqa: E402
from runfolders import collect  # noqa: E402

from rl_graphstep.core.errors import ConfigError  # noqa: E402
from rl_graphstep.run.checkpoint import load_checkpoint  # noqa: E402
from rl_graphstep.run.flags import load_config  # noqa: E402


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


@pytest.mark.parametrize(("bad", "message"), [
    (["--only", "td3:NoSuchEnv-v0"], "the group td3 on NoSuchEnv-v0: unknown environment "
     "'NoSuchEnv-v0'"),
    (["--batch-size", "0"], "the group td3 on Pendulum-v1: --batch-size must be a positive "
     "int, got 0"),
    (["--bogus"], "the group td3 on Pendulum-v1: unknown flag --bogus"),
])
def test_a_group_its_training_would_refuse_stops_the_job_before_any_group_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: list[str],
        message: str) -> None:
    args = ["--only", "td3:Pendulum-v1", "--log-dir", str(tmp_path), "--seeds", "1",
            "--total-timesteps", "300", "--learning-starts", "200", "--device", "cpu"]
    assert groups.main([*args, *bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"groups.py: error: {message}") and "\n" not in err
    assert list(tmp_path.iterdir()) == []  # not one group started


def test_a_group_that_fails_makes_the_exit_code_and_the_others_still_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        ran.append(cmd[cmd.index("--run-name") + 1])
        return subprocess.CompletedProcess(cmd, 1 if len(ran) == 1 else 0)

    monkeypatch.setattr(groups.subprocess, "run", run)
    assert groups.main(["--only", "td3:Pendulum-v1", "--only", "sac:Pendulum-v1", "--log-dir",
                        str(tmp_path), "--device", "cpu"]) == 1
    assert ran == ["td3_pendulum", "sac_pendulum"]


def test_a_group_that_is_not_algo_env_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        groups.main(["--only", "a2c:Hopper-v5"])
    assert exit_info.value.code == 2
    assert "'a2c:Hopper-v5' is not ALGO:ENV or ALGO" in capsys.readouterr().err
    assert groups.run_name("sac", "HalfCheetah-v5") == "sac_halfcheetah"
    assert len(set(groups.GROUPS)) == 9


def test_the_crossq_and_ppo_groups_are_named_by_algo_alone() -> None:
    assert groups.parse_group("crossq") == [
        ("crossq", "HalfCheetah-v5"), ("crossq", "Hopper-v5"), ("crossq", "Walker2d-v5"),
        ("crossq", "Ant-v5"), ("crossq", "Humanoid-v5")]
    assert groups.parse_group("ppo") == [
        ("ppo", "HalfCheetah-v5"), ("ppo", "Walker2d-v5"), ("ppo", "Hopper-v5"),
        ("ppo", "InvertedPendulum-v5"), ("ppo", "Humanoid-v5")]
    assert groups.parse_group("crossq:Humanoid-v5") == [("crossq", "Humanoid-v5")]
    assert groups.parse_group("sac") == [g for g in groups.GROUPS if g[0] == "sac"]
    assert not {"crossq", "ppo"} & {algo for algo, _ in groups.GROUPS}  # the default: nine


def new_group_command(algo: str, env_id: str, log_dir: Path, extra: list[str],
                      config: str | None = None) -> list[str]:
    args = argparse.Namespace(total_timesteps=1_000_000, job_steps=None, seeds=5, config=config)
    return groups.command(algo, env_id, log_dir / groups.run_name(algo, env_id, config), 0,
                          args, extra)


def test_a_crossq_group_is_started_as_the_off_policy_groups_are(tmp_path: Path) -> None:
    cmd = new_group_command("crossq", "Humanoid-v5", tmp_path,
                            ["--device", "cuda", "--no-save-buffer", "--num-steps", "64"])
    assert cmd == [sys.executable, "-m", "rl_graphstep.train", "--algo", "crossq", "--env",
                   "Humanoid-v5", "--num-seeds", "5", "--total-timesteps", "1000000",
                   "--save-buffer", "--log-dir", str(tmp_path), "--run-name",
                   "crossq_humanoid", "--checkpoint-every", "100000", "--keep-checkpoints",
                   "1", "--no-progress", "--device", "cuda", "--no-save-buffer"]
    cfg = load_config(cmd[3:])  # what the training command reads: no flag refused
    assert (cfg.algo, cfg.num_seeds, cfg.save_buffer) == ("crossq", 5, False)
    assert cfg.critic_hidden_sizes == (2048, 2048)  # configs/crossq_mujoco.yaml's


def test_a_ppo_group_gets_no_off_policy_flags(tmp_path: Path) -> None:
    extra = ["--device", "cuda", "--learning-starts", "200", "--no-save-buffer",
             "--buffer-size", "1000", "--num-steps=1024", "--hidden-sizes", "64", "64"]
    cmd = new_group_command("ppo", "Hopper-v5", tmp_path, extra)
    assert cmd == [sys.executable, "-m", "rl_graphstep.train", "--algo", "ppo", "--env",
                   "Hopper-v5", "--num-seeds", "5", "--total-timesteps", "1000000",
                   "--log-dir", str(tmp_path), "--run-name", "ppo_hopper",
                   "--checkpoint-every", "100000", "--keep-checkpoints", "1", "--no-progress",
                   "--device", "cuda", "--num-steps=1024", "--hidden-sizes", "64", "64"]
    cfg = load_config(cmd[3:])
    assert (cfg.algo, cfg.num_steps, cfg.obs_norm) == ("ppo", 1024, True)
    with pytest.raises(ConfigError, match="--save-buffer is a setting of"):
        load_config([*cmd[3:], "--save-buffer"])  # why groups.py leaves it out for PPO
    assert groups.settings_of("ppo", extra)[1] == [
        "--learning-starts", "200", "--no-save-buffer", "--buffer-size", "1000"]


def test_ppo_and_crossq_groups_go_on_where_they_stopped(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """A CrossQ group in two jobs (--job-steps, its buffer saved), a PPO group made longer
    (resumed at a rollout boundary); flags only the other reads are left out of each."""
    common = ["--log-dir", str(tmp_path), "--seeds", "2", "--total-timesteps", "384"]
    extra = ["--device", "cpu", "--hidden-sizes", "16", "16", "--learning-starts", "200",
             "--batch-size", "16", "--critic-hidden-sizes", "32", "32", "--num-steps", "64",
             "--num-minibatches", "4", "--update-epochs", "2"]
    assert groups.main(["--only", "crossq:Pendulum-v1", *common, "--job-steps", "256",
                        *extra]) == 0
    crossq = tmp_path / "crossq_pendulum"
    assert groups.steps_done(crossq) == 256 and load_checkpoint(crossq)["buffer"] is not None
    assert groups.main(["--only", "ppo:Pendulum-v1", *common, *extra]) == 0
    out = capsys.readouterr().out
    assert ("crossq_pendulum: leaves out --num-steps 64 --num-minibatches 4 --update-epochs 2 "
            "(settings that crossq does not read)") in out
    assert ("ppo_pendulum: leaves out --learning-starts 200 --batch-size 16 "
            "--critic-hidden-sizes 32 32 (settings that ppo does not read)") in out
    ppo = tmp_path / "ppo_pendulum"
    assert groups.steps_done(ppo) == 384  # six rollouts of 64
    longer = ["--log-dir", str(tmp_path), "--seeds", "2", "--total-timesteps", "512"]
    assert groups.main(["--only", "crossq:Pendulum-v1", "--only", "ppo:Pendulum-v1",
                        *longer]) == 0
    for run_dir, algo in ((crossq, "crossq"), (ppo, "ppo")):
        state = load_checkpoint(run_dir)
        assert state["global_step"] == 512 and state["config"]["algo"] == algo
        assert state["config"]["num_seeds"] == 2 and state["config"]["device"] == "cpu"
    assert load_checkpoint(ppo)["agent"]["updates"] == 8  # 512 / 64 rollouts learned from
    [group] = collect([ppo], tmp_path / "results")
    assert (group.algo, group.env_id, group.steps) == ("ppo", "Pendulum-v1", 512)


def test_job_steps_are_refused_for_ppo_groups(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        groups.main(["--only", "sac:Hopper-v5", "--only", "ppo", "--job-steps", "1000",
                     "--log-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: --job-steps would end a PPO group's first job at a shorter" in err
    assert not any(tmp_path.iterdir())  # nothing ran


def test_a_config_starts_new_groups_in_a_folder_of_their_own(tmp_path: Path) -> None:
    """``--config sac_mujoco_parallel``: the new group's command names the shipped file, whose
    settings the training command then reads (32 envs per seed, 4 updates of 2,048 rows), in
    ``sac_humanoid_parallel`` beside the default ``sac_humanoid``."""
    assert groups.run_name("sac", "Humanoid-v5", "sac_mujoco_parallel") == (
        "sac_humanoid_parallel")
    assert groups.run_name("sac", "Humanoid-v5", "my/sac_big.yaml") == "sac_humanoid_big"
    assert groups.run_name("sac", "Humanoid-v5", "sac_mujoco") == "sac_humanoid_mujoco"
    assert groups.run_name("sac", "Humanoid-v5", None) == "sac_humanoid"
    assert groups.config_suffix("td3", "sac_mujoco_parallel") == "sac_mujoco_parallel"
    assert groups.config_suffix("sac", "sac_") == "sac_"  # nothing left: the whole stem
    cmd = new_group_command("sac", "Humanoid-v5", tmp_path, ["--device", "cuda"],
                            config="sac_mujoco_parallel")
    assert cmd == [sys.executable, "-m", "rl_graphstep.train", "--algo", "sac", "--env",
                   "Humanoid-v5", "--config", "sac_mujoco_parallel", "--num-seeds", "5",
                   "--total-timesteps", "1000000", "--save-buffer", "--log-dir",
                   str(tmp_path), "--run-name", "sac_humanoid_parallel", "--checkpoint-every",
                   "100000", "--keep-checkpoints", "1", "--no-progress", "--device", "cuda"]
    cfg = load_config(cmd[3:])
    assert (cfg.algo, cfg.num_envs, cfg.batch_size, cfg.updates_per_step) == ("sac", 32, 2048, 4)
    assert (cfg.num_seeds, cfg.run_name) == (5, "sac_humanoid_parallel")


def test_a_resumed_group_keeps_its_own_config(tmp_path: Path) -> None:
    """Its checkpoint holds its config; ``--resume`` refuses ``--config``, so none is given."""
    args = argparse.Namespace(total_timesteps=1_000_000, job_steps=None, seeds=5,
                              config="sac_mujoco_parallel")
    run_dir = tmp_path / "sac_humanoid_parallel"
    cmd = groups.command("sac", "Humanoid-v5", run_dir, 300_000, args, ["--device", "cuda"])
    assert cmd == [sys.executable, "-m", "rl_graphstep.train", "--resume", str(run_dir),
                   "--total-timesteps", "1000000", "--no-progress"]


def test_main_hands_the_config_to_new_groups_only(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """What main runs (the training commands caught): a shipped name passed as given, a YAML
    file here by its full path (the commands run from the checkout), each group in its
    config's folder; a group already under way resumed without it. Each command compiles
    into an empty cache folder beside its group, gone after it."""
    ran: list[list[str]] = []
    caches: list[Path] = []

    def run(cmd: list[str], cwd: Path, check: bool, env: dict[str, str]
            ) -> subprocess.CompletedProcess[str]:
        ran.append(cmd)
        cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])
        assert cache.is_dir() and not any(cache.iterdir())
        assert env["TRITON_CACHE_DIR"] == str(cache / "triton")
        (cache / "compiled").write_text("kernels")  # what a run leaves there
        caches.append(cache)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(groups.subprocess, "run", run)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sac_big.yaml").write_text("batch_size: 512\n")
    only = ["--only", "sac:Humanoid-v5", "--log-dir", "runs"]
    assert groups.main([*only, "--config", "sac_mujoco_parallel"]) == 0
    assert groups.main([*only, "--config", "sac_big.yaml"]) == 0
    monkeypatch.setattr(groups, "steps_done", lambda run_dir: 200_000)
    assert groups.main([*only, "--config", "sac_mujoco_parallel"]) == 0

    def after(cmd: list[str], flag: str) -> str | None:
        return cmd[cmd.index(flag) + 1] if flag in cmd else None

    runs = (tmp_path / "runs").resolve()
    assert [(after(cmd, "--config"), after(cmd, "--run-name"), after(cmd, "--resume"))
            for cmd in ran] == [
        ("sac_mujoco_parallel", "sac_humanoid_parallel", None),
        (str((tmp_path / "sac_big.yaml").resolve()), "sac_humanoid_big", None),
        (None, None, str(runs / "sac_humanoid_parallel"))]
    assert after(ran[0], "--log-dir") == str(runs)
    assert caches == [runs / "sac_humanoid_parallel.compile-cache",
                      runs / "sac_humanoid_big.compile-cache",
                      runs / "sac_humanoid_parallel.compile-cache"]
    assert not any(cache.exists() for cache in caches)


def test_a_training_flag_that_begins_like_one_of_its_own_is_handed_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--seed 6`` is the training's first seed, not an abbreviation of ``--seeds``."""
    ran: list[list[str]] = []

    def run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(groups.subprocess, "run", run)
    assert groups.main(["--only", "sac:Pendulum-v1", "--log-dir", str(tmp_path), "--seed",
                        "6", "--device", "cpu"]) == 0
    [cmd] = ran
    assert cmd[cmd.index("--num-seeds") + 1] == "5" and cmd[cmd.index("--seed") + 1] == "6"
