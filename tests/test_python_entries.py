"""The public Python entries (train, load_config, evaluate, config_from_dict and the commands'
main functions) refuse an argument of the wrong type with a TypeError naming what to pass,
instead of an AttributeError from deep inside or a string parsed character by character."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rl_graphstep import evaluate, load_config, sweep, train
from rl_graphstep.run.flags import command_line_values
from rl_graphstep.settings.config import config_from_dict

ARGUMENTS = "takes a list of arguments such as ['--env', 'Pendulum-v1']"


@pytest.mark.parametrize(("call", "message"), [
    (lambda: train.train({"env_id": "Pendulum-v1"}), "train() takes a Config, such as "
     "rl_graphstep.load_config(['--env', 'Pendulum-v1']) gives, got a dict"),
    (lambda: train.train(None), "train() takes a Config, such as rl_graphstep."
     "load_config(['--env', 'Pendulum-v1']) gives, got None"),
    (lambda: load_config("--total-timesteps 3000"), f"load_config() {ARGUMENTS}, got a str "
     "(split it into a list, as shlex.split does)"),
    (lambda: load_config(["--total-timesteps", 3000]), f"load_config() {ARGUMENTS}, each a "
     "str, got 3000 (an int) at position 1"),
    (lambda: load_config({"--seed": "3"}), f"load_config() {ARGUMENTS}, got a dict"),
    (lambda: load_config([], base=["seed"]), "load_config()'s base takes a checkpoint's config "
     "mapping, got a list"),
    (lambda: command_line_values(b"--seed"), f"command_line_values() {ARGUMENTS}, got a bytes"),
    (lambda: config_from_dict([("batch_size", 64)]), "config_from_dict() takes a mapping of "
     "settings such as {'batch_size': 64}, got a list"),
    (lambda: train.main("--seed 3"), f"rl_graphstep.train.main() {ARGUMENTS}, got a str "
     "(split it into a list, as shlex.split does)"),
    (lambda: evaluate.main("runs/x"), "rl_graphstep.evaluate.main() takes a list of arguments "
     "such as ['runs/<run>', '--episodes', '10'], got a str"),
    (lambda: sweep.main("sweep.yaml"), "rl_graphstep.sweep.main() takes a list of arguments "
     "such as ['sweep.yaml', '--log-dir', 'runs'], got a str"),
    (lambda: evaluate.evaluate(None), "evaluate() takes a run folder or a checkpoint file, as a "
     "str or a Path such as 'runs/<run>', got None"),
    (lambda: evaluate.evaluate("runs/x", episodes="10"), "evaluate()'s episodes must be an int, "
     "got '10' (a str)"),
    (lambda: evaluate.evaluate(Path("runs/x"), seed=True), "evaluate()'s seed must be an int, "
     "got True (a bool)"),
    (lambda: evaluate.evaluate("runs/x", group_seed=2.0), "evaluate()'s group_seed must be an "
     "int, got 2.0 (a float)"),
])
def test_a_wrong_type_is_a_type_error_naming_what_to_pass(call: Callable[[], object],
                                                           message: str) -> None:
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)


def test_a_list_or_tuple_of_strings_is_still_taken() -> None:
    assert load_config(("--seed", "3")).seed == 3
    assert load_config(["--seed", "3"], base=None).seed == 3
