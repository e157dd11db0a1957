"""benchmarks/cli.py: every benchmark's bad input is one line and exit 2, never a traceback,
and a job of many runs refuses a bad one before the first starts."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import cli  # noqa: E402

from rl_graphstep.core.errors import ConfigError, TrainingInterrupted  # noqa: E402


def scripts() -> list[Path]:
    """The benchmarks run from the command line (those with a ``__main__`` block)."""
    return sorted(path for path in BENCHMARKS.glob("*.py")
                  if 'if __name__ == "__main__":' in path.read_text() and path.name != "cli.py")


@pytest.mark.parametrize("script", scripts(), ids=lambda path: path.name)
def test_every_benchmark_main_is_guarded(script: Path) -> None:
    """A new benchmark cannot skip the guard: its ``main`` is decorated with ``cli_main``
    and its ``__main__`` block exits with what ``main()`` returns."""
    tree = ast.parse(script.read_text())
    [main] = [node for node in tree.body
              if isinstance(node, ast.FunctionDef) and node.name == "main"]
    assert [ast.unparse(d) for d in main.decorator_list] == ["cli_main"]
    [guard] = [node for node in tree.body if isinstance(node, ast.If)
               and ast.unparse(node.test) == "__name__ == '__main__'"]
    assert [ast.unparse(line) for line in guard.body] == ["raise SystemExit(main())"]


@pytest.mark.parametrize(("kind", "text", "value"), [
    (cli.positive_int, "3", 3), (cli.nonnegative_int, "0", 0), (cli.positive_float, "0.5", 0.5),
])
def test_the_argument_types_take_what_they_name(kind, text: str, value: float) -> None:
    assert kind(text) == value


@pytest.mark.parametrize(("kind", "text", "message"), [
    (cli.positive_int, "0", "takes a positive int, got '0'"),
    (cli.positive_int, "-2", "takes a positive int, got '-2'"),
    (cli.positive_int, "1.5", "takes a positive int, got '1.5'"),
    (cli.nonnegative_int, "-1", "takes an int of 0 or more, got '-1'"),
    (cli.positive_float, "0", "takes a positive number, got '0'"),
    (cli.positive_float, "inf", "takes a positive number, got 'inf'"),
    (cli.positive_float, "nan", "takes a positive number, got 'nan'"),
    (cli.positive_float, "two", "takes a positive number, got 'two'"),
])
def test_the_argument_types_refuse_in_one_line(kind, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{message}$"):
        kind(text)


@pytest.mark.parametrize(("raised", "code", "line"), [
    (cli.BenchmarkError("results/x.csv: no such file"), 2,
     "test_benchmark_cli.py: error: results/x.csv: no such file"),
    (ConfigError("--batch-size must be a positive int, got 0"), 2,
     "test_benchmark_cli.py: error: --batch-size must be a positive int, got 0"),
    (KeyboardInterrupt(), 130, "test_benchmark_cli.py: interrupted"),
    (TrainingInterrupted(15, "stopped by SIGTERM at step 300"), 143,
     "test_benchmark_cli.py: stopped by SIGTERM at step 300"),
])
def test_cli_main_turns_a_refusal_into_one_line_and_its_exit_code(
        raised: BaseException, code: int, line: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    @cli.cli_main
    def main(argv: list[str] | None = None) -> int:
        raise raised

    assert main([]) == code
    assert capsys.readouterr().err == line + "\n"


def test_cli_main_passes_the_exit_code_and_keeps_a_bug_s_traceback() -> None:
    @cli.cli_main
    def main(code: int) -> int | None:
        if code < 0:
            raise ZeroDivisionError("a bug of the benchmark")
        return code or None

    assert main(3) == 3 and main(0) == 0
    with pytest.raises(ZeroDivisionError):
        main(-1)


def test_split_flags_splits_as_a_shell_does_and_refuses_in_one_line() -> None:
    assert cli.split_flags("--config sac_mujoco_parallel --run-name 'a b'", "--flags") == [
        "--config", "sac_mujoco_parallel", "--run-name", "a b"]
    assert cli.split_flags("", "--flags") == []
    with pytest.raises(cli.BenchmarkError,
                       match=r"^--flags: No closing quotation in \"--seed '1\"$"):
        cli.split_flags("--seed '1", "--flags")


def test_check_training_names_the_run_it_refuses() -> None:
    cli.check_training("Pendulum-v1", ["--batch-size", "64"], "arm a")
    with pytest.raises(cli.BenchmarkError, match="^arm b: unknown flag --bogus"):
        cli.check_training("Pendulum-v1", ["--bogus"], "arm b")
    with pytest.raises(cli.BenchmarkError, match="^arm c: unknown environment 'Nope-v1'"):
        cli.check_training("Nope-v1", [], "arm c")


# Bad input to the scripts themselves, run as a user runs them: one line, exit 2, before any
# run starts (the recipes' arms would run for minutes each).
@pytest.mark.parametrize(("argv", "line"), [
    (["recipes.py", "--env", "Pendulum-v1", "--arm", "a=", "--arm", "b=--bogus", "--minutes",
      "5", "--out", "{tmp}/out"], "recipes.py: error: arm b: unknown flag --bogus"),
    (["recipes.py", "--env", "Nope-v1", "--arm", "a=", "--minutes", "5", "--out", "{tmp}/out"],
     "recipes.py: error: arm a: unknown environment 'Nope-v1'"),
    (["recipes.py", "--env", "Pendulum-v1", "--arm", "a=", "--minutes", "-1", "--out",
      "{tmp}/out"], "recipes.py: error: argument --minutes: takes a positive number, got '-1'"),
    (["algos.py", "--env", "Pendulum-v1", "--arm", "a=--batch-size=-3", "--device", "cpu"],
     "algos.py: error: arm a: --batch-size must be a positive int, got -3"),
    (["vec_envs.py", "--envs", "Nope-v1"], "vec_envs.py: error: unknown environment 'Nope-v1'"),
    (["delay.py", "--updates", "-1"],
     "delay.py: error: argument --updates: takes a positive int, got '-1'"),
    (["graphstep.py", "--device", "cpu", "--updates", "0"],
     "graphstep.py: error: argument --updates: takes a positive int, got '0'"),
    (["table.py", "collect", "{tmp}/none"], "table.py: error: {tmp}/none: no such folder"),
    # Training flags in one string, with an unclosed quote (split_flags)
    (["ppo_split.py", "--device", "cpu", "--flags", "--seed '1"],
     "ppo_split.py: error: --flags: No closing quotation in \"--seed '1\""),
    (["trees.py", "--tree", "a=.", "--flags", "--seed '1"],
     "trees.py: error: --flags: No closing quotation in \"--seed '1\""),
    (["timeline.py", "--flags", "--seed '1"],
     "timeline.py: error: --flags: No closing quotation in \"--seed '1\""),
])
def test_a_script_s_bad_input_is_one_line_before_anything_runs(
        argv: list[str], line: str, tmp_path: Path) -> None:
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    done = subprocess.run([sys.executable, str(BENCHMARKS / argv[0]), *argv[1:]],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(line.replace("{tmp}", str(tmp_path)))
    assert not (tmp_path / "out").exists()  # the recipes' table folder: not even made
