"""Training with --layer-norm and --weight-decay on Pendulum (CPU): the networks have their
LayerNorms and the optimizers their decay, a resumed run ends bit for bit where the straight
one does, a resume applies a new decay but refuses another --layer-norm, and evaluate builds
the actor with its LayerNorms."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from fakes import assert_same_state
from torch import nn

from rl_graphstep.evaluate import evaluate
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import main, train

ARGS = ["--env", "Pendulum-v1", "--device", "cpu", "--learning-starts", "200",
        "--batch-size", "32", "--hidden-sizes", "16", "16", "--buffer-size", "5000",
        "--log-interval", "100", "--no-progress", "--save-buffer", "--seed", "3",
        "--layer-norm", "--weight-decay", "0.01"]


@pytest.mark.parametrize(("algo", "seeds"), [("sac", 1), ("td3", 2)])
def test_a_layer_norm_adamw_run_trains_resumes_bit_for_bit_and_evaluates(
        algo: str, seeds: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = [*ARGS, "--algo", algo, "--num-seeds", str(seeds), "--log-dir", str(tmp_path)]
    train(load_config([*args, "--total-timesteps", "600", "--run-name", "straight"]))
    train(load_config([*args, "--total-timesteps", "400", "--run-name", "halves"]))
    shutil.copytree(tmp_path / "halves", tmp_path / "decayed")
    assert main(["--resume", str(tmp_path / "halves"), "--total-timesteps", "600"]) == 0
    straight, halves = (load_checkpoint(tmp_path / name) for name in ("straight", "halves"))
    assert straight["global_step"] == halves["global_step"] == 600
    assert straight["agent"]["updates"] == 400
    assert_same_state(straight["agent"], halves["agent"])

    agent = straight["agent"]
    prefix = "stacked." if seeds > 1 else ""
    # The critic's per-member LayerNorm parameters, (K,) E, width; learned away from 1 and 0.
    norm_weight = agent["critic"][f"{prefix}norm_weights.0"]
    assert norm_weight.shape == (*((seeds,) if seeds > 1 else ()), 2, 16)
    assert not torch.equal(norm_weight, torch.ones_like(norm_weight))
    assert not torch.equal(agent["critic"][f"{prefix}norm_biases.1"],
                           torch.zeros_like(agent["critic"][f"{prefix}norm_biases.1"]))
    # The actor's nn.LayerNorm, after its first Linear.
    trunk = "trunk" if algo == "sac" else "net"
    assert agent["actor"][f"{prefix}{trunk}.1.weight"].shape[-1] == 16
    assert all(torch.isfinite(t).all() for t in agent["critic"].values())
    decays = {name: [g["weight_decay"] for g in agent[name]["param_groups"]]
              for name in ("actor_optimizer", "critic_optimizer")}
    assert decays == {"actor_optimizer": [0.01, 0.0] if algo == "sac" else [0.01],
                      "critic_optimizer": [0.01]}

    # evaluate builds the actor with its LayerNorms from the run's config.
    from rl_graphstep.run import evaluation

    actors: list[nn.Module] = []
    act = evaluation.evaluation_action
    monkeypatch.setattr(evaluation, "evaluation_action",
                        lambda actor, kind, obs: actors.append(actor) or act(actor, kind, obs))
    result = evaluate(tmp_path / "straight", episodes=1, seed=5, device="cpu", verbose=False)
    results = [result] if seeds == 1 else list(result.results)
    assert len(results) == seeds and all(len(r.returns) == 1 for r in results)
    assert sum(isinstance(m, nn.LayerNorm) for m in actors[0].modules()) == 2

    # A resume with another decay applies it (the moments go on from the checkpoint).
    assert main(["--resume", str(tmp_path / "decayed"), "--total-timesteps", "450",
                 "--weight-decay", "0.1"]) == 0
    decayed = load_checkpoint(tmp_path / "decayed")
    assert [g["weight_decay"] for g in decayed["agent"]["critic_optimizer"]["param_groups"]
            ] == [0.1]
    assert decayed["config"]["weight_decay"] == 0.1


@pytest.mark.parametrize(("given", "line"), [
    ("--no-layer-norm", "--no-layer-norm does not match: the resumed run's networks have "
                        "LayerNorms (--layer-norm); drop --no-layer-norm"),
])
def test_layer_norm_cannot_change_on_resume(given: str, line: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--log-dir", str(tmp_path), "--run-name", "run",
                 "--total-timesteps", "250"]) == 0
    capsys.readouterr()
    assert main(["--resume", str(tmp_path / "run"), given, "--total-timesteps", "300"]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"


def test_layer_norm_cannot_be_added_on_resume(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    plain = [a for a in ARGS if a != "--layer-norm"]
    assert main([*plain, "--log-dir", str(tmp_path), "--run-name", "run",
                 "--total-timesteps", "250"]) == 0
    capsys.readouterr()
    assert main(["--resume", str(tmp_path / "run"), "--layer-norm",
                 "--total-timesteps", "300"]) == 2
    assert capsys.readouterr().err == ("error: --layer-norm does not match: the resumed run's "
                                       "networks have no LayerNorm; drop --layer-norm\n")
