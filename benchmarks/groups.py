"""The MuJoCo table's runs: each group (an algorithm on a task, five seeds in one process, the
shipped `configs/*_mujoco.yaml`) trained one after another, each to 1M env steps.

    python benchmarks/groups.py                          # all nine groups, each to the end
    python benchmarks/groups.py --only sac:Ant-v5 --job-steps 600000   # at most 600k more
    python benchmarks/table.py collect runs/sac_ant ...  # then the table (see table.py)

Groups run one at a time: processes on one GPU take turns on it, so groups side by side make
fewer env steps in all than one after another (benchmarks/LOG.md). A group already in
``--log-dir`` goes on from its latest checkpoint and one that has reached its length is left
alone, so the same command, run again, finishes what a time-limited job left. A job ends
as a finished run does (its checkpoint and replay buffer saved), never by a signal, and the
next resumes it with the full length (``--resume RUN --total-timesteps``). A group that runs
to its end in one job needs no saved buffer: ``--no-save-buffer`` (handed on to the training
command) spares the disk and the time of its saves (13 GiB each for SAC on Humanoid-v5).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl_graphstep.run.checkpoint import checkpoint_step, latest_checkpoint  # noqa: E402

# The table's nine groups (issue order: SAC on five tasks, TD3 on three, DDPG on one).
GROUPS = [("sac", "HalfCheetah-v5"), ("sac", "Hopper-v5"), ("sac", "Walker2d-v5"),
          ("sac", "Ant-v5"), ("sac", "Humanoid-v5"), ("td3", "HalfCheetah-v5"),
          ("td3", "Hopper-v5"), ("td3", "Walker2d-v5"), ("ddpg", "HalfCheetah-v5")]


def run_name(algo: str, env_id: str) -> str:
    """``sac_halfcheetah`` for SAC on HalfCheetah-v5."""
    return f"{algo}_{env_id.split('-')[0].lower()}"


def steps_done(run_dir: Path) -> int:
    """The env steps of a group's latest checkpoint; 0 when it has none."""
    latest = latest_checkpoint(run_dir)
    return (checkpoint_step(latest) or 0) if latest else 0


def command(algo: str, env_id: str, run_dir: Path, done: int, args: argparse.Namespace,
            extra: Sequence[str]) -> list[str]:
    """The training command of this job: a new group (with ``extra``), or the old one resumed
    (its checkpoint holds its config), to at most ``--job-steps`` further."""
    until = args.total_timesteps if args.job_steps is None else min(
        args.total_timesteps, done + args.job_steps)
    train = [sys.executable, "-m", "rl_graphstep.train"]
    if done:
        return [*train, "--resume", str(run_dir), "--total-timesteps", str(until),
                "--no-progress"]
    return [*train, "--algo", algo, "--env", env_id, "--num-seeds", str(args.seeds),
            "--total-timesteps", str(until), "--save-buffer", "--log-dir", str(run_dir.parent),
            "--run-name", run_dir.name, "--checkpoint-every", "100000", "--keep-checkpoints", "1",
            "--no-progress", *extra]


def parse_group(text: str) -> tuple[str, str]:
    algo, _, env_id = text.partition(":")
    if algo not in ("sac", "td3", "ddpg") or not env_id:
        raise argparse.ArgumentTypeError(f"{text!r} is not ALGO:ENV (such as sac:Ant-v5; "
                                         "ALGO one of sac, td3, ddpg)")
    return algo, env_id


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Flags it does not know go to every new group's "
                                            "training command (such as --device cpu).")
    parser.add_argument("--only", type=parse_group, action="append", metavar="ALGO:ENV",
                        help="run this group (repeatable; any env id); default: the table's nine")
    parser.add_argument("--log-dir", type=Path, default=Path("runs"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--total-timesteps", type=int, default=1_000_000,
                        help="each group's length (default: 1,000,000)")
    parser.add_argument("--job-steps", type=int, default=None,
                        help="at most this many env steps per group in this job, for a machine "
                             "held for a limited time (default: to the end)")
    args, extra = parser.parse_known_args(argv)
    args.log_dir = args.log_dir.resolve()  # the training commands run from the checkout
    failed = 0
    for algo, env_id in args.only or GROUPS:
        run_dir = args.log_dir / run_name(algo, env_id)
        done = steps_done(run_dir)
        if done >= args.total_timesteps:
            print(f"{run_dir}: done ({done:,} steps)", flush=True)
            continue
        cmd = command(algo, env_id, run_dir, done, args, extra)
        print("$", " ".join(cmd[1:]), flush=True)
        code = subprocess.run(cmd, cwd=ROOT, check=False).returncode
        if code:
            print(f"{run_dir}: the training command exited with {code}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
