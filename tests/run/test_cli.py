"""Every mistake a user can make on the command line is one line and exit 2 (130 for a
Ctrl-C), never a traceback: a table of bad inputs run in-process, and Ctrl-C by subprocess."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from processtools import Children, run

from rl_graphstep import evaluate, train
from rl_graphstep.core.errors import ConfigError, TrainingInterrupted
from rl_graphstep.data import buffer as buffer_module
from rl_graphstep.data import memory
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.run import cli
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config

ROOT = Path(__file__).resolve().parents[2]
# Tiny runs: nothing in the table gets as far as an update.
SMALL = ["--device", "cpu", "--total-timesteps", "300", "--learning-starts", "100",
         "--batch-size", "32", "--buffer-size", "1000", "--hidden-sizes", "16", "16",
         "--no-progress"]


@pytest.fixture
def bad_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder (the working one) of broken user files: modules, networks, configs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "needs_missing.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "bad_syntax.py").write_text("def f(:\n")
    (tmp_path / "nets.py").write_text(
        "from torch import nn\n"
        "class Raises(nn.Module):\n"
        "    def __init__(self, observation_space, action_space, **kwargs):\n"
        "        raise RuntimeError('constructor boom')\n"
        "class NotModule:\n"
        "    pass\n")
    (tmp_path / "broken_envs.py").write_text(
        "import gymnasium as gym\n"
        "import numpy as np\n"
        "class Fails(gym.Env):\n"
        "    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)\n"
        "    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)\n"
        "    def __init__(self, where='init'):\n"
        "        self.where = where\n"
        "        if where == 'init':\n"
        "            raise ValueError('constructor boom')\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        if self.where == 'reset':\n"
        "            raise ValueError('reset boom')\n"
        "        return np.zeros(3, np.float32), {}\n"
        "    def step(self, action):\n"
        "        raise ValueError('step boom')\n"
        "for where in ('init', 'reset', 'step'):\n"
        "    gym.register(f'Fails{where.title()}-v0', entry_point='broken_envs:Fails',\n"
        "                 kwargs={'where': where})\n")
    for name, text in {"seed_huge": "seed: 1e30\n", "seed_int": "seed: 4294967296\n",
                       "lr_inf": "q_lr: .inf\n", "name_nul": 'run_name: "a\\0b"\n',
                       "envs_huge": "num_envs: 100000000\n",
                       "old_async": "num_envs: 2\nasync_envs: true\n"}.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    return tmp_path


BAD_TRAIN_INPUTS = [
    (["--env", "no_such_module_xyz:Foo-v0"],
     "cannot import module 'no_such_module_xyz' of environment 'no_such_module_xyz:Foo-v0': "
     "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    (["--env", "needs_missing:Foo-v0"], "No module named 'no_such_dependency_xyz' (at "),
    (["--env", "raises_on_import:Foo-v0"], "RuntimeError: boom at import (at "),
    (["--env", "bad_syntax:Foo-v0"], "SyntaxError: invalid syntax"),
    (["--env", "a:b:c"], "must be EnvId or module:EnvId"),
    (["--env", "broken_envs:FailsInit-v0"],
     "environment 'broken_envs:FailsInit-v0' could not be made: ValueError: constructor boom "
     "(at broken_envs.py:9)"),
    (["--env", "broken_envs:FailsReset-v0"],
     "the environment's reset raised ValueError: reset boom (at "),
    (["--env", "broken_envs:FailsStep-v0"],
     "the environment's step raised ValueError: step boom (at "),
    (["--resume", "a\x00b"], "run folder 'a\\x00b' must not contain control characters"),
    (["--resume", "a\nb"], "run folder 'a\\nb' must not contain control characters"),
    (["--seed", "4294967296"],
     "--seed must be at most 4294967295 (2**32 - 1, numpy's seed range), got 4294967296"),
    (["--config", "seed_huge.yaml"], "seed must be at most 4294967295"),
    (["--config", "seed_int.yaml"], "seed must be at most 4294967295"),
    (["--config", "lr_inf.yaml"], "q_lr must be a finite number > 0, got inf"),
    (["--config", "name_nul.yaml"], "run_name must not contain control characters"),
    (["--config", "envs_huge.yaml"], "num_envs must be at most 4096"),
    (["--log-dir", "afile"], "afile is a file, not a folder"),
    (["--log-dir", "afile/sub"], "afile is a file, not a folder"),
    (["--run-name", "x" * 300], "longer than 255 bytes"),
    (["--run-name", "../../x"], "--run-name must be one folder name"),
    (["--run-name", "a/b"], "--run-name must be one folder name"),
    (["--run-name", "a\nb"], "--run-name must not contain control characters"),
    (["--log-dir", "a\x00b"], "--log-dir must not contain control characters"),
    (["--resume", ""], "no run given: give a run folder (such as runs/<run name>) or a .pt "
                       "checkpoint"),
    (["--learning", "0"], "unknown flag --learning (did you mean --learning-rate?)"),
    (["--learnin-starts", "5"], "unknown flag --learnin-starts (did you mean --learning-starts?)"),
    (["--batch-size=3", "--zzzz"], "unknown flag --zzzz"),
    (["stray"], "unexpected argument 'stray'"),
    # Removed flags and keys name what replaced them (the nearest-flag hint never offers one).
    (["--async-envs"],
     "error: --async-envs was replaced by --vec-env async (--vec-env auto is the default)\n"),
    (["--env-worker"], "error: --env-worker was removed: it never measured faster than the "
                       "default; use --vec-env async to step the environments in subprocesses\n"),
    (["--no-overlap"], "error: --no-overlap was removed: the loop always steps the "
                       "environments while the GPU updates\n"),
    (["--config", "old_async.yaml"], "error: config key 'async_envs' in old_async.yaml was "
     "replaced by vec_env: async (vec_env: auto is the default)\n"),
    (["--vec-env", "spawn"],
     "error: --vec-env must be one of auto, sync, async, shared, got 'spawn'\n"),
    (["--seed", "x"], "--seed must be an int, got 'x'"),
    (["--gamma", "y"], "--gamma must be a number, got 'y'"),
    (["--seed"], "--seed needs a value"),
    (["--hidden-sizes"], "--hidden-sizes needs one or more values"),
    (["--num-envs", "1000000000"], "--num-envs must be at most 4096, got 1000000000"),
    (["--buffer-size", str(10**30)], "--buffer-size must be at most 9223372036854775807"),
    (["--total-timesteps", str(10**40)], "--total-timesteps must be at most"),
    (["--hidden-sizes", "1000000000"], "use smaller --hidden-sizes"),
    (["--algo", "crossq", "--critic-hidden-sizes", "1000000000"],
     "use smaller --critic-hidden-sizes"),
    (["--q-lr", "nan"], "--q-lr must be a finite number > 0, got nan"),
    (["--policy-lr", "inf"], "--policy-lr must be a finite number > 0, got inf"),
    (["--gamma", "nan"], "--gamma must be in [0, 1], got nan"),
    (["--tau", "inf"], "--tau must be in (0, 1], got inf"),
    (["--checkpoint-every", "-5"], "--checkpoint-every must be a positive int, got -5"),
    (["--actor", "nets.py:Raises"],
     "actor: cannot build Raises: RuntimeError: constructor boom (at nets.py:4)"),
    (["--actor", "nets:Raises"], "actor: cannot build Raises: RuntimeError: constructor boom"),
    (["--critic", "nets.py:NotModule"], "is not a torch.nn.Module subclass"),
    (["--actor", "bad_syntax.py:X"], "SyntaxError: invalid syntax"),
    (["--actor", "raises_on_import:X"], "RuntimeError: boom at import (at "),
    # The seed group: bad input, and a group before its learner exists.
    (["--num-seeds", "0"], "error: --num-seeds must be a positive int, got 0\n"),
    (["--num-seeds", "3", "--seeds", "1", "2", "3"],
     "--seeds and --num-seeds cannot both be given"),
    (["--seeds", "3", "5", "3"], "--seeds must differ from each other, got 3 twice in 3 5 3"),
]


def one_line_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")
    return err


@pytest.mark.parametrize(("args", "message"), BAD_TRAIN_INPUTS,
                         ids=[" ".join(a)[:40] for a, _ in BAD_TRAIN_INPUTS])
def test_bad_train_input_is_one_line(args: list[str], message: str, bad_code: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = train.main([*SMALL, "--log-dir", str(bad_code / "runs"), *args])
    assert message in one_line_error(capsys, code)
    if "FailsStep" not in args[-1]:  # the env steps only in a run already logging
        assert not (bad_code / "runs").exists()  # nothing made


def test_help_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        train.main(["--help"])
    assert info.value.code == 0
    assert "--learning-starts" in capsys.readouterr().out


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run with 16 16 networks and its checkpoint."""
    log_dir = tmp_path_factory.mktemp("runs")
    assert train.main([*SMALL, "--log-dir", str(log_dir), "--run-name", "run"]) == 0
    return log_dir / "run"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hidden-sizes", "32"], "(--hidden-sizes is 32 here, 16 16 in the checkpoint); "
                                   "drop --hidden-sizes to resume it"),
        (["--hidden-sizes", "16", "16", "16"], "drop --hidden-sizes to resume it"),
    ],
)
def test_resume_with_other_networks_names_the_flag(
        small_run: Path, args: list[str], message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.name: p.read_bytes() for p in (small_run / "checkpoints").iterdir()}
    code = train.main(["--resume", str(small_run), "--total-timesteps", "400", *args])
    err = one_line_error(capsys, code)
    assert f"the networks of {small_run} do not match the ones this run builds" in err
    assert message in err
    assert {p.name: p.read_bytes() for p in (small_run / "checkpoints").iterdir()} == before


@pytest.mark.parametrize(("args", "message"), [
    (["--num-seeds", "2"], "--num-seeds 2 does not match: the resumed run has 1 seed (1), and "
                           "a run resumes with its own seeds; drop --num-seeds"),
    (["--seeds", "1", "2"], "--seeds 1 2 does not match: the resumed run has 1 seed (1)"),
])
def test_a_resume_with_another_group_size_is_one_line(
        small_run: Path, args: list[str], message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(p.relative_to(small_run) for p in small_run.rglob("*"))
    code = train.main(["--resume", str(small_run), "--total-timesteps", "400", *args])
    assert message in one_line_error(capsys, code)
    assert sorted(p.relative_to(small_run) for p in small_run.rglob("*")) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--episodes", "1", "--seed", "4294967296"], "--seed must be at most 4294967295"),
        (["--episods", "1"], "unknown flag --episods (did you mean --episodes?)"),
        (["--epi", "1"], "unknown flag --epi (did you mean --episodes?)"),
        (["--episodes", "x"], "--episodes must be an int, got 'x'"),
    ],
)
def test_bad_evaluate_input_is_one_line(small_run: Path, args: list[str], message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = evaluate.main([str(small_run), *args])
    assert message in one_line_error(capsys, code)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: RUN"),
        ([""], "no run given: give a run folder"),
        (["a\x00b"], "run folder 'a\\x00b' must not contain control characters"),
        (["a\nb"], "run folder 'a\\nb' must not contain control characters"),
        (["no/such/run"], "run folder no/such/run does not exist"),
    ],
)
def test_evaluate_without_a_run_is_one_line(args: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = evaluate.main(args)
    assert message in one_line_error(capsys, code)


def test_memory_available_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemFree:          100000 kB\n"
                       "MemAvailable:    2000000 kB\n")
    assert memory.meminfo_available(str(meminfo)) == 2_000_000 * 1024
    meminfo.write_text("MemTotal:       32000000 kB\n")
    assert memory.meminfo_available(str(meminfo)) is None
    assert memory.meminfo_available(str(tmp_path / "missing")) is None


def test_the_cpu_buffer_check_uses_available_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "meminfo_available", lambda: 2**30)
    free, where = memory.available_memory(torch.device("cpu"))
    assert (free, where) == (2**30, "this machine has 1.0 GiB of memory available")
    with pytest.raises(ConfigError, match=r"needs 3\.7 GiB but this machine has 1\.0 GiB of "
                                          r"memory available; use a smaller --buffer-size "
                                          r"\(at most 26,843,544 fit\)"):
        ReplayBuffer(100_000_000, 3, 2, "cpu")  # rows of 10 float32


def test_a_failed_buffer_allocation_is_the_same_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffer_module, "_available_memory", lambda device: (2**40, "lots"))

    def no_memory(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't "
                           "allocate memory: you tried to allocate 40000 bytes.")

    monkeypatch.setattr(buffer_module.torch, "zeros", no_memory)
    with pytest.raises(ConfigError) as info:
        ReplayBuffer(1000, 3, 2, "cpu")
    assert str(info.value) == ("replay buffer of 1,000 rows x 10 needs 0.0 GiB but lots and "
                               "the allocation failed; use a smaller --buffer-size (at most "
                               "27,487,790,693 fit)")


# What the rl-graphstep-train console script runs (pyproject.toml's project.scripts).
CONSOLE_SCRIPT = "from rl_graphstep import train_command; train_command()"


def start(children: Children, module: str, *args: str) -> subprocess.Popen[str]:
    command = ["-c", CONSOLE_SCRIPT] if module == "console script" else ["-m", module]
    return children.python(*command, *args, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)


@pytest.mark.parametrize("module", ["rl_graphstep.train", "rl_graphstep.evaluate",
                                    "console script"])
def test_ctrl_c_during_start_up_is_one_line(module: str, tmp_path: Path,
                                            children: Children) -> None:
    """Ctrl-C at several moments of the imports (torch's take about a second or more)."""
    for delay in (0.3, 0.8, 1.5):
        process = start(children, module, str(tmp_path)) if module.endswith("evaluate") else (
            start(children, module, "--device", "cpu", "--no-progress", "--log-dir",
                  str(tmp_path)))
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        assert "Traceback" not in err, (delay, err)
        if process.returncode != 2:  # 2: evaluate got as far as reporting the empty folder
            assert process.returncode == 130, (delay, err)
            # On a busy machine evaluate may have started when the Ctrl-C comes: its own line.
            assert err.strip() in ("stopped: interrupted during start-up",
                                   "stopped: interrupted before the evaluation ended (no result)"
                                   ), (delay, err)


def test_a_ctrl_c_during_the_interpreters_teardown_keeps_the_exit_code(
        tmp_path: Path, children: Children) -> None:
    """evaluate has reported the empty folder (exit 2) and the interpreter is tearing torch
    down, about half a second: a Ctrl-C then changes nothing (it used to kill the process
    by SIGINT, from about 7 ms after the report on)."""
    for delay in (0.005, 0.02, 0.05, 0.1, 0.2):
        process = start(children, "rl_graphstep.evaluate", str(tmp_path))
        assert process.stderr is not None
        assert process.stderr.readline().startswith("error: "), delay
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        assert (process.returncode, err) == (2, ""), delay


def test_ctrl_c_held_down_saves_once_and_exits_130(tmp_path: Path, children: Children) -> None:
    """Ctrl-C after Ctrl-C (every 3 ms, from one step until the process is gone): those
    while the first one's checkpoint is saved, the logs flushed and the interpreter shuts
    down are noted or end it quietly. One 'stopped:' line, exit 130, the checkpoint loads."""
    process = start(children, "rl_graphstep.train", *SMALL, "--total-timesteps", "1000000",
                    "--log-dir", str(tmp_path), "--run-name", "run", "--save-buffer")
    assert process.stdout is not None
    while "updates:" not in (line := process.stdout.readline()):
        assert line, "the run ended before its updates started"
    time.sleep(0.3)
    give_up = time.monotonic() + 5
    while process.poll() is None and time.monotonic() < give_up:
        process.send_signal(signal.SIGINT)
        time.sleep(0.003)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("stopped: SIGINT at step "), err
    assert load_checkpoint(tmp_path / "run")["global_step"] > 100


def test_main_as_a_command_leaves_ctrl_c_ignored_for_the_exit(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run as a command (the start-up guard in place), main does not give Ctrl-C back its
    KeyboardInterrupt after the run has said how it ended: a Ctrl-C held down would raise it
    before exit_quietly takes Ctrl-C over (a traceback seen once in the held-down test)."""
    monkeypatch.setattr(atexit, "register", lambda *_: None)  # the guard's exit handler
    handler = signal.getsignal(signal.SIGINT)
    try:
        cli.startup_guard()
        assert train.main(["--env", "Pendulum-v1", "--num-seeds", "0"]) == 2
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, handler)
    assert capsys.readouterr().err.startswith("error: ")


def test_setting_the_ctrl_c_handler_outlasts_a_ctrl_c_landing_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that lands while the handler changes raises from the handler being replaced;
    the change is made again, not abandoned with a traceback."""
    calls: list[object] = []
    set_handler = signal.signal

    def interrupted_once(signum: int, handler: object) -> object:
        calls.append(handler)
        previous = set_handler(signum, handler)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return previous

    handler = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(signal, "signal", interrupted_once)
    try:
        train._set_ctrl_c(signal.SIG_IGN)
        assert calls == [signal.SIG_IGN, signal.SIG_IGN]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        set_handler(signal.SIGINT, handler)


def test_a_ctrl_c_while_the_stop_is_on_its_way_out_still_reports_the_stop(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C held down goes on after the loop gave Ctrl-C back: one that lands while the
    first one's stop leaves the run reports that stop, not a start-up interruption; and main
    gives the caller's Ctrl-C handler back."""

    def stopped_then_interrupted(cfg: object) -> None:
        try:
            raise TrainingInterrupted(signal.SIGINT, "SIGINT at step 300: checkpoint x "
                                      "saved and logs flushed; continue with --resume r")
        finally:
            raise KeyboardInterrupt  # the next Ctrl-C, during the unwinding

    handler = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(train, "train", stopped_then_interrupted)
    assert train.main(["--env", "Pendulum-v1"]) == 130
    assert capsys.readouterr().err == ("stopped: SIGINT at step 300: checkpoint x saved and "
                                       "logs flushed; continue with --resume r\n")
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_stream_closed_at_the_start_is_the_null_device_and_keeps_its_descriptor(
        tmp_path: Path) -> None:
    """With stdout closed, the next file opened would be descriptor 1, and every print (an env
    worker's, a library's) would land in it: the startup guard fills the gap first."""
    script = ("import os, sys\n"
              "from rl_graphstep.run.cli import startup_guard\n"
              "assert sys.stdout is None\n"
              "startup_guard()\n"
              "with open('log', 'w') as log:\n"
              "    print('to stdout', flush=True)\n"
              "    os.write(1, b'to descriptor 1')\n"
              "    log.write(str(log.fileno()))\n")
    result = run(["sh", "-c", 'exec "$0" "$@" >&-', sys.executable, "-c", script],
                 cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                 stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert int((tmp_path / "log").read_text()) > 2  # the file's own descriptor, nothing else


def test_a_file_system_refusal_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A name longer than the system takes (and any other OSError: a full disk, a run folder
    deleted under the run) is one line and exit 2 in train, evaluate and --config."""
    monkeypatch.chdir(tmp_path)
    long = "x" * 300
    for command, args in ((evaluate.main, [long]), (train.main, ["--resume", long]),
                          (train.main, ["--config", f"{long}.yaml", *SMALL])):
        assert command(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: File name too long: xxxx") and err.count("\n") == 1, err
        assert len(err) < 140


def test_a_config_file_cannot_resume_a_run(tmp_path: Path) -> None:
    """--config with resume: would replace the run's own settings with the file's and the
    defaults; the command line refuses --config with --resume, and so does the file."""
    (tmp_path / "c.yaml").write_text(f"resume: {tmp_path / 'run'}\ntotal_timesteps: 800\n")
    with pytest.raises(ConfigError, match="sets resume: a run is resumed with --resume RUN"):
        load_config(["--config", str(tmp_path / "c.yaml")])


def test_updates_per_step_has_an_upper_bound() -> None:
    """10**9 updates in one iteration would never reach the loop's stop check."""
    with pytest.raises(ConfigError, match="--updates-per-step must be at most 1000"):
        load_config(["--updates-per-step", "1000000000"])
    assert load_config(["--updates-per-step", "1000"]).updates_per_step == 1000
