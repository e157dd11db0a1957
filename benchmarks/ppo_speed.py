"""PPO's speed against LeanRL's in one job: ``python -m rl_graphstep.train --algo ppo`` with
CleanRL's settings (1 env, 2,048 steps a rollout, 32 minibatches, 10 epochs) and with many envs
(64 x 32 steps: the same rows and updates a rollout), then LeanRL's
``ppo_continuous_action_torchcompile.py`` with the same settings in each mode asked for.

    python benchmarks/ppo_speed.py --leanrl PATH/TO/LeanRL --env HalfCheetah-v5 --deadline 540

Every arm is its own process, one after the other, each for ``--rollouts`` rollouts (a
multiple of 10: LeanRL prints its speed every 10th iteration), seed 1, the same env id for
both (LeanRL's default is HalfCheetah-v4). On CUDA ours runs with ``--compile on``, what
``compile auto`` picks for a 1M-step run (a 10-rollout run alone would stay uncompiled).

The rate, alike for both: env steps per second over the rollouts after the first
``--burn-in`` (which pay for compiling and capture), from each process's own clock.
LeanRL's is its own figure, run with ``--measure-burnin`` = burn-in + 1: the steps of
iterations burn-in + 1 .. last over the time from that iteration's start to the last one's
end, read from its progress bar's ``speed: N sps``. Ours runs with ``--log-interval`` = one
rollout, so tensorboard's ``charts/SPS`` is written once per rollout, after its update and a
host sync; the rate is the steps between the burn-in's last write and the last write over
their wall times. LeanRL's clock reads before the device finished the last update (one
rollout's update at most in flight, over several rollouts); ours after.

LeanRL runs from its checkout unchanged, with a temporary folder first on its path holding
shims that change none of its computation:

- ``wandb``: a module whose ``init`` and ``log`` do nothing (always used: the real one needs a
  login or a network, and only records).
- ``leanrl_main``: runs the script as ``__main__`` after giving gymnasium 1.x's
  ``TransformObservation`` a default ``observation_space=None``. LeanRL passes only the
  function (gymnasium 0.29's signature); ``None`` keeps the env's space, as 0.29 did.

Its other imports (tensordict 0.12.x, tyro, tqdm) must be installed: with tensordict 0.15.3
its eager mode fails ("Can't call numpy() on Tensor that requires grad", its policy's
parameter copy). Both normalise observations and rewards as CleanRL does: LeanRL with
gymnasium's wrappers, ours as ``configs/ppo_mujoco.yaml`` sets it (on a MuJoCo task).

An arm that fails (a non-zero exit, no speed printed, a timeout) is a ``failed: <its last
error line>`` row, and the job goes on; every arm's process group is ended in every outcome
(its end, a timeout, Ctrl-C, SIGTERM, SIGHUP, an error of this script; on Linux a SIGKILL of
this script kills the arm's process too). Ctrl-C prints the table of the arms that ended.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from cli import cli_main, nonnegative_int, positive_float, positive_int
from processes import end_group
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

SCRIPT = Path("leanrl") / "ppo_continuous_action_torchcompile.py"
LEANRL_MODES = {"compile+cudagraphs": ["--compile", "--cudagraphs"], "compile": ["--compile"],
                "cudagraphs": ["--cudagraphs"], "plain": []}

_WANDB = '''"""No-op wandb for benchmarks/ppo_speed.py: LeanRL only records through it."""


def init(*args, **kwargs):
    return None


def log(*args, **kwargs):
    return None


def finish(*args, **kwargs):
    return None
'''

_MAIN = '''"""Runs LeanRL's script (argv[1]) as __main__, for benchmarks/ppo_speed.py."""
import runpy
import sys

import gymnasium as gym

_Transform = gym.wrappers.TransformObservation


class TransformObservation(_Transform):
    """gymnasium 1.x's wrapper, whose observation_space may be left out (0.29's call)."""

    def __init__(self, env, func, observation_space=None):
        super().__init__(env, func, observation_space)


gym.wrappers.TransformObservation = TransformObservation
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
'''

# Sets PR_SET_PDEATHSIG (SIGKILL when the parent dies; exec keeps it), then execs argv[2:].
_ORPHAN_GUARD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(137)  # the parent died before that took hold\n"
    "os.execvp(sys.argv[2], sys.argv[2:])")

_SPEED = re.compile(r"speed:\s*([0-9]+(?:\.[0-9]*)?)\s*sps")
_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


@dataclass
class Arm:
    """One process of the job: its row's name, its command, and how its rate is read."""

    name: str
    command: list[str]
    envs: int
    steps: int
    kind: str  # "leanrl" or "ours"
    mode: str = ""  # LeanRL's flags; ours is read from the run's plan line


@dataclass
class Result:
    arm: Arm
    rate: float | None = None
    mode: str = ""
    error: str = ""


def leanrl_speed(stderr: str) -> float | None:
    """The last ``speed: N sps`` of LeanRL's tqdm bar (lines joined by carriage returns)."""
    speeds = _SPEED.findall(stderr)
    return float(speeds[-1]) if speeds else None


def error_line(text: str) -> str:
    """The line that says why a process failed: the last ``SomeError: ...`` line of its
    output, else its last non-empty line."""
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]
    errors = [line for line in lines if _ERROR.match(line)]
    line = (errors or lines or ["no output"])[-1]
    return line if len(line) <= 200 else line[:197] + "..."


def rollout_rate(log_dir: Path, burn_in: int) -> float | None:
    """Env steps/s over the rollouts after the first ``burn_in``, from the wall times of the
    run's ``charts/SPS`` (one write per rollout)."""
    runs = sorted({path.parent for path in log_dir.rglob("events.out.tfevents*")})
    for run in runs:
        events = EventAccumulator(str(run), size_guidance={"scalars": 0})
        events.Reload()
        if "charts/SPS" not in events.Tags()["scalars"]:
            continue
        writes = events.Scalars("charts/SPS")
        if len(writes) <= burn_in:
            return None
        first, last = writes[burn_in - 1], writes[-1]
        return (last.step - first.step) / (last.wall_time - first.wall_time)
    return None


def orphan_guarded(command: list[str]) -> list[str]:
    """``command``, killed on Linux when this process dies in a way that runs no clean-up
    (SIGKILL): its own session keeps it from signals sent to this one's group. Our shared
    env's workers end when their training process does."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-S", "-c", _ORPHAN_GUARD, str(os.getpid()), *command]


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM and SIGHUP end the job as Ctrl-C does: the arm's processes first."""
    raise KeyboardInterrupt


def run_arm(arm: Arm, env: dict[str, str], timeout: float, burn_in: int,
            work: Path) -> Result:
    """Run one arm to its end (or its timeout) and read its rate; never raises for the arm's
    own failure."""
    folder = Path(tempfile.mkdtemp(prefix=arm.kind + "-", dir=work))
    command = [part.replace("{log_dir}", str(folder / "runs")) for part in arm.command]
    with open(folder / "stdout", "w+") as out, open(folder / "stderr", "w+") as err:
        process = subprocess.Popen(orphan_guarded(command), stdout=out, stderr=err, env=env,
                                   cwd=folder, start_new_session=True)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            return Result(arm, error=f"timed out after {timeout:.0f} s")
        finally:
            end_group(process)
        stdout, stderr = (Path(folder / name).read_text(errors="replace")
                          for name in ("stdout", "stderr"))
    if process.returncode:
        return Result(arm, error=error_line(stderr or stdout))
    if arm.kind == "leanrl":
        rate, mode = leanrl_speed(stderr), arm.mode
    else:
        rate = rollout_rate(folder / "runs", burn_in)
        plans = [line for line in stdout.splitlines() if line.startswith("updates: ")]
        # The plan's line, less what it says of acting (PPO acts in line, in every mode).
        parts = plans[-1].removeprefix("updates: ").split(";")[0].split(", ") if plans else []
        mode = ", ".join(part for part in parts if "action" not in part)
    if rate is None:
        return Result(arm, mode=mode, error="no speed in its output: "
                      + error_line(stderr + stdout))
    return Result(arm, rate=rate, mode=mode)


def leanrl_arms(checkout: Path, modes: list[str], args: argparse.Namespace,
                shims: Path) -> list[Arm]:
    """LeanRL's script in each mode, with our settings (its defaults are CleanRL's)."""
    script = checkout / SCRIPT
    common = [sys.executable, str(shims / "leanrl_main.py"), str(script), "--env-id", args.env,
              "--seed", str(args.seed), "--num-envs", "1", "--num-steps", str(args.num_steps),
              "--num-minibatches", str(args.num_minibatches), "--update-epochs",
              str(args.update_epochs), "--total-timesteps", str(args.rollouts * args.num_steps),
              "--measure-burnin", str(args.burn_in + 1)]
    if args.device == "cpu":
        common.append("--no-cuda")
    return [Arm(f"LeanRL {mode}", [*common, *LEANRL_MODES[mode]], 1, args.num_steps, "leanrl",
                " ".join(LEANRL_MODES[mode]) or "eager") for mode in modes]


def our_arm(envs: int, steps: int, args: argparse.Namespace) -> Arm:
    """``rl_graphstep.train --algo ppo`` with ``envs`` x ``steps`` rollouts, the same updates."""
    rollout = envs * steps
    command = [sys.executable, "-m", "rl_graphstep.train", "--algo", "ppo", "--env", args.env,
               "--seed", str(args.seed), "--num-envs", str(envs), "--num-steps", str(steps),
               "--num-minibatches", str(args.num_minibatches), "--update-epochs",
               str(args.update_epochs), "--total-timesteps", str(args.rollouts * rollout),
               "--log-interval", str(rollout), "--checkpoint-every", str(10 * args.rollouts
                                                                          * rollout),
               "--device", args.device, "--log-dir", "{log_dir}", "--no-progress",
               *args.ours_flags.split()]
    return Arm(f"ours, {envs} env{'s' if envs > 1 else ''}", command, envs, steps, "ours")


def shim_folder(work: Path) -> Path:
    """The temporary folder of LeanRL's shims (see the module's docstring)."""
    shims = work / "shims"
    shims.mkdir()
    (shims / "wandb.py").write_text(_WANDB)
    (shims / "leanrl_main.py").write_text(_MAIN)
    return shims


def table(results: list[Result]) -> str:
    """The markdown table: each arm's rate, and ours against LeanRL's fastest mode that ran."""
    lean = [r for r in results if r.arm.kind == "leanrl" and r.rate is not None]
    best = max(lean, key=lambda r: r.rate) if lean else None
    lines = ["| arm | mode | envs x steps | env steps/s | vs " + (
        best.arm.name if best else "LeanRL (none ran)") + " |", "|---|---|---|---:|---:|"]
    for r in results:
        shape, mode = f"{r.arm.envs} x {r.arm.steps}", r.mode or r.arm.mode
        if r.rate is None:
            cell = "failed: " + r.error.replace("|", "/")
            lines.append(f"| {r.arm.name} | {mode} | {shape} | {cell} | |")
            continue
        ratio = f"{r.rate / best.rate:.2f}x" if best else ""
        lines.append(f"| {r.arm.name} | {mode} | {shape} | {r.rate:,.0f} | {ratio} |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leanrl", type=Path, help="a LeanRL checkout (holding " + str(SCRIPT)
                        + "); without it only our arms run")
    parser.add_argument("--leanrl-modes", nargs="*", choices=list(LEANRL_MODES),
                        default=["compile+cudagraphs", "compile", "plain"])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--num-steps", type=positive_int, default=2048,
                        help="steps a rollout, 1 env")
    parser.add_argument("--num-minibatches", type=positive_int, default=32)
    parser.add_argument("--update-epochs", type=positive_int, default=10)
    parser.add_argument("--many-envs", type=nonnegative_int, default=64,
                        help="our many-env arm's envs (0: none)")
    parser.add_argument("--many-steps", type=positive_int, default=32, help="its steps a rollout "
                        "(64 x 32: the 2,048 rows of the 1-env rollout, the same updates)")
    parser.add_argument("--ours-flags", help="more flags for our arms (default: --compile on "
                        "on CUDA, none on the CPU)")
    parser.add_argument("--rollouts", type=int, default=10, help="each arm's rollouts")
    parser.add_argument("--burn-in", type=int, default=3, help="rollouts not timed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=positive_float, default=300, help="seconds per arm "
                        "(LeanRL's compiled mode once took over 180 s to compile)")
    parser.add_argument("--deadline", type=positive_float, help="seconds for the whole job: an arm "
                        "gets what is left, and none starts with less than 30 s")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args(argv)
    if args.rollouts % 10 or not 1 <= args.burn_in < args.rollouts:
        parser.error(f"--rollouts takes a multiple of 10 (LeanRL prints its speed every 10th "
                     f"rollout) above --burn-in, itself 1 or more; got --rollouts "
                     f"{args.rollouts} --burn-in {args.burn_in}")
    if args.ours_flags is None:
        args.ours_flags = "--compile on" if args.device == "cuda" else ""
    if args.leanrl is not None and not (args.leanrl / SCRIPT).is_file():
        parser.error(f"--leanrl takes a LeanRL checkout holding {SCRIPT}; {args.leanrl} has none")
    return args


def run_arms(arms: list[Arm], args: argparse.Namespace, envs: dict[str, dict[str, str]],
             work: Path) -> tuple[list[Result], bool]:
    """Each arm in turn, within ``--timeout`` and what is left of ``--deadline``; the results,
    and whether Ctrl-C (or SIGTERM, SIGHUP) stopped the job."""
    began = time.monotonic()
    results: list[Result] = []
    try:
        for arm in arms:
            left = args.timeout
            if args.deadline is not None:
                left = min(left, args.deadline - (time.monotonic() - began))
                if left < 30:
                    results.append(Result(arm, error="not started: --deadline reached"))
                    continue
            results.append(run_arm(arm, envs[arm.kind], left, args.burn_in, work))
            r = results[-1]
            print(f"{arm.name}: " + (f"{r.rate:,.0f} env steps/s" if r.rate is not None
                                     else f"failed: {r.error}"), flush=True)
    except KeyboardInterrupt:  # the arm's process group is already ended (run_arm)
        print("interrupted: the table of the arms that ended", flush=True)
        return results, True
    return results, False


def versions(args: argparse.Namespace) -> str:
    """The machine and the versions the table was measured with."""
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    line = f"{args.device} ({device}), torch {torch.__version__}"
    if args.leanrl is not None:
        try:
            line += f", tensordict {importlib.metadata.version('tensordict')}"
        except importlib.metadata.PackageNotFoundError:
            line += ", no tensordict"
    return line


@cli_main
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    work = Path(tempfile.mkdtemp(prefix="ppo_speed-"))
    shims = shim_folder(work)
    root = str(Path(__file__).resolve().parents[1])
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    envs = {"ours": dict(os.environ, PYTHONPATH=os.pathsep.join([root, *path])),
            "leanrl": dict(os.environ, PYTHONPATH=os.pathsep.join([str(shims), *path]))}
    arms = [our_arm(1, args.num_steps, args)]
    if args.many_envs:
        arms.append(our_arm(args.many_envs, args.many_steps, args))
    if args.leanrl is not None:
        arms += leanrl_arms(args.leanrl.resolve(), args.leanrl_modes, args, shims)
    handlers = {signum: signal.signal(signum, _interrupt)
                for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        results, interrupted = run_arms(arms, args, envs, work)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.env}, {versions(args)}; env steps/s over rollouts {args.burn_in + 1}-"
          f"{args.rollouts}; minibatches {args.num_minibatches}, epochs {args.update_epochs}\n")
    print(table(results))
    if interrupted:
        return 130
    return 0 if len(results) == len(arms) and all(r.rate for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
