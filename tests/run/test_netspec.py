"""Custom networks a run records: resumed and evaluated from any folder as they were trained,
classes that cannot be found again refused in one line, deterministic_action checked, built
modules and their seeds, and a resumed run acting with its policy at once."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.core.netcheck import check_actor
from rl_graphstep.evaluate import evaluate
from rl_graphstep.evaluate import main as evaluate_main
from rl_graphstep.networks.builtin import DeterministicActor, EnsembleCritic, SquashedGaussianActor
from rl_graphstep.networks.custom import load_class
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.run.netspec import class_spec
from rl_graphstep.train import main, train

ROOT = Path(__file__).resolve().parents[2]
# `examples` is a folder of the repository, not of the installed package (see
# tests/networks/test_custom.py).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.layernorm_critic import LayerNormCritic  # noqa: E402
from examples.residual_actor import ResidualActor  # noqa: E402

SMALL = ["--env", "Pendulum-v1", "--device", "cpu", "--learning-starts", "100",
         "--batch-size", "32", "--hidden-sizes", "16", "--buffer-size", "2000",
         "--log-interval", "100", "--no-progress", "--seed", "3"]
PENDULUM = gym.make("Pendulum-v1")
OBS_SPACE, ACT_SPACE = PENDULUM.observation_space, PENDULUM.action_space
PENDULUM.close()

SMALL_CRITIC = '''
from rl_graphstep.networks.builtin import EnsembleCritic


class SmallCritic(EnsembleCritic):
    def __init__(self, observation_space, action_space):
        super().__init__(observation_space, action_space, hidden_sizes={width})
'''


def small(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [*SMALL, "--log-dir", str(tmp_path / "runs"), "--run-name", name, *extra]


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ------------------------------------------------------------------ classes passed from Python


def test_a_class_passed_from_python_resumes_and_evaluates_from_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(small(tmp_path, "py", "--total-timesteps", "110", "--actor-kwargs",
                            "{width: 16, blocks: 1}", "--critic-kwargs", "{hidden_sizes: [16]}"))
    train(cfg, actor=ResidualActor, critic=LayerNormCritic)
    run = tmp_path / "runs" / "py"
    recorded = load_checkpoint(run)["config"]
    assert recorded["actor"] == "examples.residual_actor:ResidualActor"
    assert recorded["critic"] == "examples.layernorm_critic:LayerNormCritic"
    assert recorded["actor_kwargs"] == {"width": 16, "blocks": 1}
    start = capsys.readouterr().out.splitlines()[0]
    assert start.endswith("; actor ResidualActor (examples.residual_actor), critic "
                          "LayerNormCritic (examples.layernorm_critic)")

    assert main(["--resume", str(run), "--total-timesteps", "150"]) == 0
    resumed = load_checkpoint(run)
    # 11 updates by step 110; resumed without its buffer, it refills a batch (32 steps) first.
    assert resumed["global_step"] == 150 and resumed["agent"]["updates"] == 11 + 7
    assert "; resumed at step 110" in capsys.readouterr().out
    assert evaluate_main([str(run), "--episodes", "1", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("Pendulum-v1, sac, step 150: mean return ")


def test_the_default_networks_stay_null_and_unnamed(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    train(load_config(small(tmp_path, "plain", "--total-timesteps", "150")))
    recorded = load_checkpoint(tmp_path / "runs" / "plain")["config"]
    assert recorded["actor"] is None and recorded["critic"] is None
    assert "actor" not in capsys.readouterr().out.splitlines()[0]


def test_a_local_class_warns_and_is_refused_in_one_line_where_it_is_needed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class LocalActor(DeterministicActor):
        pass

    cfg = load_config(small(tmp_path, "local", "--algo", "td3", "--total-timesteps", "150"))
    with pytest.warns(UserWarning, match=r"actor: LocalActor is defined inside a function "
                      r"\(.*<locals>\.LocalActor\), so --resume and evaluate cannot import"):
        train(cfg, actor=LocalActor)
    run = tmp_path / "runs" / "local"
    spec = load_checkpoint(run)["config"]["actor"]
    assert spec == f"{__name__}:{LocalActor.__qualname__}"
    capsys.readouterr()

    assert main(["--resume", str(run), "--total-timesteps", "200"]) == 2
    assert one_error_line(capsys) == (
        f"error: actor: {spec!r} is a class defined inside a function, which cannot be "
        "imported again; pass the class itself again (to train with cfg.resume, or to "
        "evaluate), or move it into a module or file and give that spec")
    assert evaluate_main([str(run), "--episodes", "1", "--device", "cpu"]) == 2
    assert one_error_line(capsys).startswith(f"error: actor: {spec!r} is a class defined ")

    # Passed again, it resumes and evaluates.
    with pytest.warns(UserWarning, match="defined inside a function"):
        train(dataclasses.replace(cfg, resume=str(run), total_timesteps=200), actor=LocalActor)
    assert load_checkpoint(run)["global_step"] == 200
    result = evaluate(run, episodes=1, device="cpu", actor=LocalActor, verbose=False)
    assert len(result.returns) == 1


def test_refused_and_nested_specs() -> None:
    with pytest.raises(ConfigError, match=r"^'__main__:Net' is a class of an interactive "
                       r"session or `python -c` \(a __main__ without a file\), which cannot"):
        load_class("__main__:Net")
    assert load_class(f"{__name__}:Outer.Inner") is Outer.Inner
    # The config accepts what a run records.
    cfg = load_config([*SMALL, "--actor", "mod:f.<locals>.Net", "--critic", "mod:A.B"])
    assert (cfg.actor, cfg.critic) == ("mod:f.<locals>.Net", "mod:A.B")


class Outer:
    class Inner(DeterministicActor):
        pass


def test_a_nested_class_is_recorded_by_its_qualified_name(tmp_path: Path) -> None:
    train(load_config(small(tmp_path, "nested", "--algo", "td3", "--total-timesteps", "150")),
          actor=Outer.Inner)
    run = tmp_path / "runs" / "nested"
    assert load_checkpoint(run)["config"]["actor"] == f"{__name__}:Outer.Inner"
    assert main(["--resume", str(run), "--total-timesteps", "200"]) == 0


# ------------------------------------------------------------------ file-path networks


def test_a_file_network_resumes_and_evaluates_from_anywhere_as_trained(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir()
    elsewhere.mkdir()
    source = first / "nets.py"
    source.write_text(SMALL_CRITIC.format(width="(16,)"))
    monkeypatch.chdir(first)
    train(load_config([*SMALL, "--log-dir", "runs", "--run-name", "file", "--critic",
                       "nets.py:SmallCritic", "--total-timesteps", "200"]))
    assert capsys.readouterr().out.splitlines()[0].endswith("; critic SmallCritic (nets.py)")
    run = first / "runs" / "file"
    assert load_checkpoint(run)["config"]["critic"] == "networks/nets.py:SmallCritic"
    assert (run / "networks" / "nets.py").read_text() == source.read_text()

    # The original edited (it would no longer fit the weights), then removed; the run moved.
    source.write_text(SMALL_CRITIC.format(width="(64,)"))
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    source.unlink()
    monkeypatch.chdir(elsewhere)
    assert main(["--resume", str(moved), "--total-timesteps", "300"]) == 0
    assert load_checkpoint(moved)["config"]["critic"] == "networks/nets.py:SmallCritic"
    assert sorted(p.name for p in (moved / "networks").iterdir()) == ["nets.py"]
    assert evaluate_main([str(moved), "--episodes", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "; critic SmallCritic (networks/nets.py); resumed at step 200" in out
    assert "step 300: mean return" in out


def test_an_edited_file_given_to_a_resumed_run_is_kept_beside_the_first_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("nets.py").write_text(SMALL_CRITIC.format(width="(16,)"))
    args = [*SMALL, "--log-dir", "runs", "--run-name", "r", "--critic", "nets.py:SmallCritic"]
    train(load_config([*args, "--total-timesteps", "150"]))
    Path("nets.py").write_text(SMALL_CRITIC.format(width="(16,)") + "\n# edited\n")
    train(load_config([*args, "--total-timesteps", "200", "--resume", "runs/r"]))
    spec = load_checkpoint("runs/r")["config"]["critic"]
    assert spec.startswith("networks/nets_") and spec.endswith(".py:SmallCritic")
    assert Path("runs/r/networks/nets.py").read_text() == SMALL_CRITIC.format(width="(16,)")
    assert Path("runs/r", spec.rpartition(":")[0]).read_text().endswith("# edited\n")


def test_a_checkpoint_from_before_the_copies_resumes_from_its_folder_and_gets_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Older runs recorded the file spec as given, relative to the folder they started in."""
    monkeypatch.chdir(tmp_path)
    Path("nets.py").write_text(SMALL_CRITIC.format(width="(16,)"))
    train(load_config([*SMALL, "--log-dir", "runs", "--run-name", "old", "--critic",
                       "nets.py:SmallCritic", "--total-timesteps", "150"]))
    checkpoint = next(Path("runs/old/checkpoints").iterdir())
    state = torch.load(checkpoint, weights_only=False)
    state["config"]["critic"] = "nets.py:SmallCritic"
    torch.save(state, checkpoint)
    shutil.rmtree("runs/old/networks")
    assert main(["--resume", "runs/old", "--total-timesteps", "200"]) == 0
    assert load_checkpoint("runs/old")["config"]["critic"] == "networks/nets.py:SmallCritic"
    assert Path("runs/old/networks/nets.py").is_file()


def test_a_file_network_that_is_gone_is_named_with_its_place_in_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    Path("nets.py").write_text(SMALL_CRITIC.format(width="(16,)"))
    train(load_config([*SMALL, "--log-dir", "runs", "--run-name", "g", "--critic",
                       "nets.py:SmallCritic", "--total-timesteps", "150"]))
    (tmp_path / "runs" / "g" / "networks" / "nets.py").unlink()
    capsys.readouterr()
    assert evaluate_main(["runs/g", "--episodes", "1", "--device", "cpu"]) == 2
    copy = tmp_path / "runs" / "g" / "networks" / "nets.py"
    assert one_error_line(capsys).startswith(
        f"error: critic: file '{copy}' for '{copy}:SmallCritic' does not exist")


# A file actor that counts how often its file runs: once per run, whatever the seeds.
COUNTED_ACTOR = """
with open({loads!r}, "a") as loads:
    loads.write("x")

from rl_graphstep.networks.builtin import SquashedGaussianActor


class DeepActor(SquashedGaussianActor):
    def __init__(self, observation_space, action_space):
        super().__init__(observation_space, action_space, hidden_sizes=(16, 16))
"""


def test_file_networks_load_once_for_a_group_of_seeds_that_trains_evaluates_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each seed's networks are of one class: a file loaded per seed made each its own, and
    SeedStack refused them (``module 1 is a DeepActor, module 0 a DeepActor``)."""
    monkeypatch.chdir(tmp_path)
    loads = tmp_path / "loads.txt"
    Path("actor.py").write_text(COUNTED_ACTOR.format(loads=str(loads)))
    critic = "examples/layernorm_critic.py:LayerNormCritic"
    shutil.copytree(ROOT / "examples", "examples")
    summary = train(load_config([*SMALL, "--log-dir", "runs", "--run-name", "g", "--num-seeds",
                                 "2", "--actor", "actor.py:DeepActor", "--critic", critic,
                                 "--total-timesteps", "150"]))
    assert summary["seeds"] == (3, 4) and summary["updates"]["critic"] == (0, 100)
    assert loads.read_text() == "x"
    assert load_checkpoint("runs/g")["config"]["actor"] == "networks/actor.py:DeepActor"
    assert load_checkpoint("runs/g")["config"]["critic"] == ("networks/layernorm_critic.py:"
                                                             "LayerNormCritic")
    group = evaluate(Path("runs/g"), episodes=1, device="cpu", verbose=False)
    assert group.seeds == (3, 4) and len(group.results) == 2  # each seed's own actor
    assert group.results[0].returns != group.results[1].returns
    assert loads.read_text() == "xx"  # the run's copy, once for both seeds
    capsys.readouterr()
    assert main(["--resume", "runs/g", "--total-timesteps", "200"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: 200 steps, ")
    assert loads.read_text() == "xxx"


# ------------------------------------------------------------------ deterministic_action


class SampleOnlyActor(nn.Module):
    """A SAC actor without deterministic_action."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        self.inner = SquashedGaussianActor(observation_space, action_space, (16,))

    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        return self.inner(observations)


class WrongDeterministicActor(SampleOnlyActor):
    def deterministic_action(self, observations: Tensor) -> Tensor:
        return self.inner.deterministic_action(observations)[:, :0]


def test_a_sac_actor_without_deterministic_action_is_named_by_train_and_evaluate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    message = ("actor SampleOnlyActor has no deterministic_action: evaluation uses its "
               "stochastic forward action")
    with pytest.warns(UserWarning, match=f"^{message}$"):
        train(load_config(small(tmp_path, "sample", "--total-timesteps", "150")),
              actor=SampleOnlyActor)
    capsys.readouterr()
    with pytest.warns(UserWarning, match=f"^{message}$"):
        evaluate(tmp_path / "runs" / "sample", episodes=1, device="cpu")
    assert capsys.readouterr().out.strip().endswith(
        "over 1 episode (stochastic actions: SampleOnlyActor has no deterministic_action)")


def test_deterministic_action_is_checked_like_forward() -> None:
    with pytest.raises(ConfigError, match=r"^WrongDeterministicActor.deterministic_action "
                       r"returned shape \(256, 0\), expected \(256, 1\)$"):
        check_actor(WrongDeterministicActor(OBS_SPACE, ACT_SPACE), kind="stochastic",
                    observation_size=3, action_size=1, device=torch.device("cpu"))


def test_a_deterministic_actor_needs_no_deterministic_action(
        recwarn: pytest.WarningsRecorder) -> None:
    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, observations: Tensor) -> Tensor:
            return torch.tanh(self.linear(observations))

    check_actor(Bare(), kind="deterministic", observation_size=3, action_size=1,
                device=torch.device("cpu"))
    assert not [w for w in recwarn if "deterministic_action" in str(w.message)]


# ------------------------------------------------------------------ built modules


def test_built_modules_repeat_when_built_after_one_seed(tmp_path: Path) -> None:
    """A built module's initial weights are its caller's (never reset); --seed seeds all else."""
    for name in ("a", "b"):
        torch.manual_seed(7)
        train(load_config(small(tmp_path, name, "--algo", "td3", "--total-timesteps", "150")),
              actor=DeterministicActor(OBS_SPACE, ACT_SPACE, (16,)))
    a, b = (load_checkpoint(tmp_path / "runs" / n)["agent"]["actor"] for n in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_one_built_module_given_twice_says_it_starts_trained(tmp_path: Path) -> None:
    actor = DeterministicActor(OBS_SPACE, ACT_SPACE, (16,))
    train(load_config(small(tmp_path, "once", "--algo", "td3", "--total-timesteps", "150")),
          actor=actor)
    with pytest.warns(UserWarning, match=r"^actor: this DeterministicActor was trained in "
                      r"place by an earlier train\(\) call and starts from those weights"):
        train(load_config(small(tmp_path, "twice", "--algo", "td3", "--total-timesteps", "150")),
              actor=actor)
    # Resumed, it holds the checkpoint's weights: nothing to say.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(load_config(small(tmp_path, "twice", "--algo", "td3", "--total-timesteps", "200",
                                "--resume", str(tmp_path / "runs" / "twice"))), actor=actor)
    assert not [w for w in caught if "trained in place" in str(w.message)]


def test_a_built_module_that_its_class_cannot_rebuild(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Recorded by its class with kwargs {}: a warning at the start, one line at resume."""
    cfg = load_config(small(tmp_path, "built", "--total-timesteps", "150"))
    with pytest.warns(UserWarning, match=r"^critic: EnsembleCritic was given built, so its "
                      r"constructor arguments are unknown .* \(EnsembleCritic\(observation_"
                      r"space, action_space\) has other parameter shapes\)"):
        train(cfg, critic=EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,)))
    run = tmp_path / "runs" / "built"
    saved = load_checkpoint(run)["config"]["critic"]
    assert saved == "rl_graphstep.networks.builtin:EnsembleCritic"
    capsys.readouterr()
    assert main(["--resume", str(run), "--total-timesteps", "200"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: the saved networks of {run} do not fit the actor "
                           "SquashedGaussianActor and critic EnsembleCritic this run built (")
    assert line.endswith("); resume with the networks and kwargs the run was trained with")


def test_a_built_module_its_class_rebuilds_resumes(tmp_path: Path) -> None:
    critic = EnsembleCritic(OBS_SPACE, ACT_SPACE)  # the constructor's own defaults
    train(load_config(small(tmp_path, "same", "--total-timesteps", "150")), critic=critic)
    assert main(["--resume", str(tmp_path / "runs" / "same"), "--total-timesteps", "200"]) == 0


# ------------------------------------------------------------------ acting after resume


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_run_resumed_without_its_buffer_acts_with_its_policy_at_once(tmp_path: Path,
                                                                       device: str) -> None:
    """TD3 without exploration noise: its actions are the actor's. The resumed run refills
    its buffer (batch 64 > the 50 steps it takes), so it never updates and its actor stays
    the checkpoint's; the old loop acted uniformly at random there. On CUDA the first part
    ran with captured graphs and the action stream."""
    args = small(tmp_path, "refill", "--algo", "td3", "--exploration-noise", "0",
                 "--batch-size", "64", "--device", device)
    train(load_config([*args, "--total-timesteps", "200"]))
    run = tmp_path / "runs" / "refill"
    trained = load_checkpoint(run)["agent"]
    assert main(["--resume", str(run), "--total-timesteps", "250", "--save-buffer"]) == 0
    state = load_checkpoint(run)
    assert state["agent"]["updates"] == trained["updates"] == 100
    rows = state["buffer"]["storage"]
    assert rows.shape[0] == 50
    actor = DeterministicActor(OBS_SPACE, ACT_SPACE, (16,))
    actor.load_state_dict(trained["actor"])
    with torch.no_grad():
        expected = actor(rows[:, :3])
    # On the GPU the actor's matmuls round differently from this CPU copy's.
    atol = 1e-6 if device == "cpu" else 1e-4
    np.testing.assert_allclose(rows[:, 3:4].numpy(), expected.numpy(), rtol=0, atol=atol)


SCRIPT = '''
from rl_graphstep.networks.builtin import DeterministicActor


class ScriptActor(DeterministicActor):
    def __init__(self, observation_space, action_space):
        super().__init__(observation_space, action_space, (16,))
'''


def run_as_main(path: Path, monkeypatch: pytest.MonkeyPatch) -> type:
    """The class ScriptActor of ``path``, executed as ``python path`` would (as __main__)."""
    module = type(sys)("__main__")
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", module)
    return module.ScriptActor


def test_a_class_of_a_script_is_recorded_by_its_file_and_copied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "train_it.py"
    ran = tmp_path / "ran"
    guarded = f'\n\nif __name__ == "__main__":\n    open({str(ran)!r}, "a").write("ran\\n")\n'
    script.write_text(SCRIPT + guarded)
    actor = run_as_main(script, monkeypatch)
    train(load_config(small(tmp_path, "script", "--algo", "td3", "--total-timesteps", "150")),
          actor=actor)
    run = tmp_path / "runs" / "script"
    assert load_checkpoint(run)["config"]["actor"] == "networks/train_it.py:ScriptActor"
    script.unlink()
    monkeypatch.chdir(ROOT)
    assert main(["--resume", str(run), "--total-timesteps", "200"]) == 0
    assert evaluate_main([str(run), "--episodes", "1", "--device", "cpu"]) == 0
    assert ran.read_text() == "ran\n"  # the copy's own work stayed under its guard


def test_a_script_without_a_main_guard_is_warned_about(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT)
    actor = run_as_main(script, monkeypatch)
    with pytest.warns(UserWarning, match=r"^actor: ScriptActor is defined in the script .*"
                      r"unguarded.py, which --resume and evaluate run again to find it"):
        assert class_spec(actor, "actor") == f"{script}:ScriptActor"


def test_an_interactive_class_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "__main__", type(sys)("__main__"))
    actor = type("Typed", (DeterministicActor,), {"__module__": "__main__"})
    with pytest.warns(UserWarning, match=r"^actor: Typed cannot be found again by name \(it is "
                      r"defined in an interactive session\)"):
        assert class_spec(actor, "actor") == "__main__:Typed"


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_keyword_arguments_for_a_default_network_are_one_line(
        role: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """They were ignored: the default networks take none, and the run trained without them."""
    assert main(small(tmp_path, "kw", f"--{role}-kwargs", "{n: 3}")) == 2
    assert one_error_line(capsys) == (
        f"error: --{role}-kwargs {{'n': 3}} is given for the default {role}, which takes no "
        f"keyword arguments (its widths are --hidden-sizes); give --{role} "
        f"package.module:ClassName too, or drop --{role}-kwargs")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("custom", "which"), [
    (["--actor", "examples.residual_actor:ResidualActor"], "--actor is a custom one"),
    (["--critic", "examples.layernorm_critic:LayerNormCritic"], "--critic is a custom one"),
    (["--actor", "examples.residual_actor:ResidualActor",
      "--critic", "examples.layernorm_critic:LayerNormCritic"],
     "--actor and --critic are custom ones"),
], ids=["actor", "critic", "both"])
def test_layer_norm_with_a_custom_network_is_one_line(
        custom: list[str], which: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--layer-norm changes the built-in networks; a custom one would silently train without."""
    assert main(small(tmp_path, "ln", "--layer-norm", *custom)) == 2
    assert one_error_line(capsys) == (
        f"error: --layer-norm is for the built-in networks, but {which}, whose layers are its "
        "own: put LayerNorm into the custom network, or drop --layer-norm")
    assert not (tmp_path / "runs").exists()


def test_layer_norm_with_a_network_given_to_train_is_refused(tmp_path: Path) -> None:
    cfg = load_config(small(tmp_path, "py", "--layer-norm"))
    with pytest.raises(ConfigError, match=r"^--layer-norm is for the built-in networks, but "
                       r"--critic is a custom one"):
        train(cfg, critic=LayerNormCritic)


def test_keyword_arguments_for_a_network_given_to_train_are_its_own(tmp_path: Path) -> None:
    cfg = load_config(small(tmp_path, "py", "--total-timesteps", "110",
                            "--critic-kwargs", "{hidden_sizes: [16]}"))
    assert train(cfg, critic=LayerNormCritic)["global_step"] == 110
