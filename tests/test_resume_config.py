"""The config a resumed run trains with and records: the run's own, from the command line and
from Python alike, with the flags given over it; its folder, name and seeds kept; the envs it
asks for, not the checkpoint's when they differ."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from rl_graphstep import train
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.run.checkpoint import latest_checkpoint, load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.settings.config import Config

# The run's own settings, far from the defaults and from configs/sac_pendulum.yaml (batch 256,
# buffer 100,000, learning-starts 1,000), which a resume must not fall back to.
OWN = ["--device", "cpu", "--learning-starts", "100", "--batch-size", "32",
       "--buffer-size", "1000000", "--hidden-sizes", "16", "16", "--log-interval", "100",
       "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of 300 steps with the settings above; tests resume copies of it."""
    log_dir = tmp_path_factory.mktemp("runs")
    assert train.main([*OWN, "--total-timesteps", "300", "--log-dir", str(log_dir),
                       "--run-name", "run"]) == 0
    return log_dir / "run"


@pytest.fixture
def run(trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the trained run in runs/run of the working folder (short relative paths)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(trained, tmp_path / "runs" / "run")
    return Path("runs/run")


def saved_config(run: Path) -> dict[str, object]:
    return load_checkpoint(run)["config"]


def test_resuming_from_python_keeps_the_runs_settings(run: Path) -> None:
    """The README's Python entry, train(load_config([...])), resumes as the command line does:
    from the run's config, not from the defaults and the shipped YAML."""
    cfg = load_config(["--resume", str(run), "--total-timesteps", "1100"])
    assert (cfg.batch_size, cfg.buffer_size, cfg.learning_starts) == (32, 1_000_000, 100)
    summary = train.train(cfg)
    assert summary["global_step"] == 1100
    # 200 updates by step 300, then one an iteration once the buffer (not saved) holds a
    # batch of the run's 32 again: learning-starts 100, not the YAML's 1000.
    assert summary["updates"]["critic"] == (0, 200 + 800 - 32)
    saved = saved_config(run)
    assert (saved["batch_size"], saved["buffer_size"], saved["learning_starts"],
            saved["total_timesteps"]) == (32, 1_000_000, 100, 1100)
    assert (saved["log_dir"], saved["run_name"]) == ("runs", "run")


def test_a_config_built_by_hand_records_what_trained_and_says_what_changed(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Config(resume=...) is the whole config of the resumed run: what differs from the run's
    is named in the start line, and the checkpoint records what trained, the run's own folder
    and name included."""
    cfg = Config(resume=str(run), total_timesteps=500, device="cpu", learning_starts=100,
                 batch_size=64, buffer_size=1000, hidden_sizes=(16, 16), log_interval=100,
                 progress=False, log_dir="elsewhere", run_name="other")
    train.train(cfg)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("; resumed at step 300; changed from the run's config: "
                          "--buffer-size 1000000 -> 1000, --batch-size 32 -> 64; the replay "
                          "buffer was not saved (--save-buffer saves it): updates wait until "
                          "it holds a batch again (64 steps)")
    saved = saved_config(run)
    assert (saved["batch_size"], saved["buffer_size"], saved["total_timesteps"]) == (64, 1000, 500)
    assert (saved["log_dir"], saved["run_name"]) == ("runs", "run")
    assert not Path("elsewhere").exists()


def test_a_config_built_by_hand_with_other_seeds_is_one_line(run: Path) -> None:
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    cfg = Config(resume=str(run), seed=5, total_timesteps=500, device="cpu",
                 learning_starts=100, batch_size=32, hidden_sizes=(16, 16), progress=False)
    with pytest.raises(ConfigError) as info:
        train.train(cfg)
    assert str(info.value) == (
        "the config's seeds (5) are not those of the resumed run runs/run (1): a run resumes "
        "with its own seeds; build the config with load_config(['--resume', RUN, ...]), which "
        "starts from the run's own")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


@pytest.mark.parametrize(("flags", "message"), [
    (["--run-name", "other"], "--run-name cannot be combined with --resume: the resumed run "
                              "keeps its folder and name (runs/run); drop --run-name"),
    (["--log-dir", "elsewhere", "--run-name", "other"],
     "--log-dir and --run-name cannot be combined with --resume: the resumed run keeps its "
     "folder and name (runs/run); drop --log-dir and --run-name"),
    (["--seed", "4"], "--seed 4 does not match: the resumed run has 1 seed (1), and a run "
                      "resumes with its own seeds; drop --seed"),
    (["--algo", "td3"], "--algo td3 does not match: the resumed run is sac on Pendulum-v1, and "
                        "a run resumes with its own env and algorithm; drop --algo"),
    (["--env-id", "MountainCarContinuous-v0"], "--env MountainCarContinuous-v0 does not match: "
     "the resumed run is sac on Pendulum-v1, and a run resumes with its own env and algorithm; "
     "drop --env"),
])
def test_a_resume_refuses_a_folder_name_or_seed_it_would_not_keep(
        run: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code = train.main(["--resume", str(run), "--total-timesteps", "400", *flags])
    err = capsys.readouterr().err
    assert (code, err) == (2, f"error: {message}\n")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert not Path("elsewhere").exists() and not Path("runs/other").exists()


def test_a_resume_may_name_its_own_folder(run: Path) -> None:
    cfg = load_config(["--resume", str(run / "checkpoints"), "--run-name", "run", "--log-dir",
                       "./runs/../runs", "--seed", "1"])
    assert cfg.batch_size == 32


def test_a_resume_of_the_checkpoints_folder_trains_in_the_run(run: Path) -> None:
    """``find_checkpoint`` takes runs/x/checkpoints; the run goes on in runs/x, not in a
    checkpoints/checkpoints/ folder of its own."""
    assert train.main(["--resume", str(run / "checkpoints"), "--total-timesteps", "400"]) == 0
    assert latest_checkpoint(run).name == "step_000000000400.pt"
    assert not (run / "checkpoints" / "checkpoints").exists()


def test_a_resume_with_more_envs_steps_them(run: Path) -> None:
    """The checkpoint's one env would step in place of the two asked for (and counted as
    two): the envs asked for start fresh episodes instead, with a warning."""
    with pytest.warns(UserWarning, match=r"^the checkpoint holds 1 sync env, this run steps 2 "
                      r"sync envs; their episodes restart on resume$"):
        summary = train.train(load_config(["--resume", str(run), "--total-timesteps", "700",
                                           "--num-envs", "2"]))
    # One episode of 200 steps ended in the first 300; each of the two fresh envs ends one
    # in the 200 iterations to step 700 (the old env would have ended one, at step 400).
    assert summary["episodes"] == 3
    assert saved_config(run)["num_envs"] == 2


def test_a_resume_keeps_its_envs_when_nothing_about_them_changed(run: Path) -> None:
    """Exact resume: the pickled envs go on (the episode of the first 300 steps ends at 400)."""
    summary = train.train(dataclasses.replace(
        load_config(["--resume", str(run), "--total-timesteps", "400"])))
    assert summary["episodes"] == 2


def test_a_resume_trains_with_the_learning_rates_it_is_given(run: Path) -> None:
    """torch's Optimizer.load_state_dict takes the learning rates of the checkpoint's groups:
    the start line said '--policy-lr 0.0003 -> 0.001' while the run went on at 0.0003."""
    train.train(load_config(["--resume", str(run), "--total-timesteps", "400", "--policy-lr",
                             "0.001", "--q-lr", "0.0001"]))
    agent = load_checkpoint(run)["agent"]
    # The actor's group, then the temperature's (at --q-lr, as CleanRL's); the critic's.
    assert [g["lr"] for g in agent["actor_optimizer"]["param_groups"]] == [0.001, 0.0001]
    assert [g["lr"] for g in agent["critic_optimizer"]["param_groups"]] == [0.0001]


@pytest.mark.parametrize(("flags", "message"), [
    (["--no-autotune"], "--no-autotune does not match: the resumed run learns its temperature "
                        "(--autotune), and a run resumes with its temperature's optimizer as it "
                        "was; drop --no-autotune"),
    (["--alpha", "0.5"], "--alpha 0.5 does not apply on resume: the run learns its temperature "
                         "(--autotune), and --alpha only started it (at 0.2); drop --alpha"),
])
def test_a_resume_refuses_temperature_settings_it_could_not_apply(
        run: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--alpha was recorded as changed while the learned temperature went on; --no-autotune was
    'the saved networks do not fit', the wrong advice."""
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert train.main(["--resume", str(run), "--total-timesteps", "400", *flags]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_fixed_temperature_changed_on_resume_is_the_one_that_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without autotune --alpha is the temperature: the checkpoint's must not overwrite it."""
    monkeypatch.chdir(tmp_path)
    assert train.main([*OWN, "--total-timesteps", "300", "--log-dir", "runs", "--run-name",
                       "fixed", "--no-autotune", "--alpha", "0.3"]) == 0
    train.train(load_config(["--resume", "runs/fixed", "--total-timesteps", "400", "--alpha",
                             "0.05"]))
    state = load_checkpoint(Path("runs/fixed"))
    assert state["agent"]["log_alpha"].exp().item() == pytest.approx(0.05)
    assert state["config"]["alpha"] == 0.05
