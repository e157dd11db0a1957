"""The MuJoCo table's runs: each group (an algorithm on a task, five seeds in one process, the
shipped `configs/*_mujoco.yaml` or the `--config` named) trained one after another, each to
1M env steps.

    python benchmarks/groups.py                          # the nine SAC/TD3/DDPG groups
    python benchmarks/groups.py --only sac:Ant-v5 --job-steps 600000   # at most 600k more
    python benchmarks/groups.py --only crossq:Humanoid-v5   # one CrossQ group (issue 52)
    python benchmarks/groups.py --only crossq --only ppo    # every CrossQ and PPO group
    python benchmarks/groups.py --only sac:Humanoid-v5 --config sac_mujoco_parallel
    python benchmarks/table.py collect runs/sac_ant ...  # then the table (see table.py)

With no ``--only`` it runs the nine SAC, TD3 and DDPG groups it always ran; the five CrossQ
groups (issue 52) and the five PPO groups (issue 51) run where named, one ``--only ALGO:ENV``
at a time or ``--only ALGO`` for all of an algorithm's.

``--config NAME`` (a shipped config's name, such as ``sac_mujoco_parallel``, or a YAML file's
path) starts every new group from that file in place of its task's shipped one: the training
command gets ``--config NAME`` (rl_graphstep finds a shipped file by its name; a file that
exists where this is run goes by its full path, as the commands run from the checkout). Such a
group runs in a folder of its own beside the default one: ``run_name`` plus the file's stem
less a leading ``<algo>_mujoco_`` or ``<algo>_``, so the fourth example above trains SAC with
32 envs per seed in ``runs/sac_humanoid_parallel`` (``my/sac_big.yaml`` would give
``sac_humanoid_big``), and the table keeps it as its own group (``SAC, 32 envs``) beside
``runs/sac_humanoid``'s. A group already in its folder goes on with its own config: the resumed
command gets no ``--config`` (``--resume`` keeps the run's config, and refuses one).

Groups run one at a time: processes on one GPU take turns on it, so groups side by side make
fewer env steps in all than one after another (benchmarks/LOG.md). A group already in
``--log-dir`` goes on from its latest checkpoint and one that has reached its length is left
alone, so the same command, run again, finishes what a time-limited job left. A job ends
as a finished run does (its checkpoint and replay buffer saved), never by a signal, and the
next resumes it with the full length (``--resume RUN --total-timesteps``). Each job compiles
into an empty cache folder of its own (``<group>.compile-cache`` beside the group, removed at
its end), so a group's start-up is a first run's whichever groups ran before. A group that runs
to its end in one job needs no saved buffer: ``--no-save-buffer`` (handed on to the training
command) spares the disk and the time of its saves (13 GiB each for SAC on Humanoid-v5).

PPO groups differ in two ways. PPO keeps no replay buffer, so a PPO group is started without
``--save-buffer``, and the flags handed on that only other algorithms read (``check_settings``
refuses them) are left out of its command, with a line saying so; the same holds the other
way for PPO's own flags. And PPO anneals its learning rate over the run's
``--total-timesteps``, which a shorter job would set for good, so ``--job-steps`` is refused for
PPO groups (a 1M-step PPO group takes minutes). One stopped by a signal saves at the step it
reached and goes on from there with its schedule: the steps of the rollout under way are not
learned from, and the resumed run collects a new rollout.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from cli import check_training, cli_main, positive_int
from processes import cold_compile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl_graphstep.algorithms import is_on_policy  # noqa: E402
from rl_graphstep.run.checkpoint import checkpoint_step, latest_checkpoint  # noqa: E402
from rl_graphstep.settings.config import FIELDS  # noqa: E402

# The table's nine groups (issue order: SAC on five tasks, TD3 on three, DDPG on one): the
# groups run when no --only is given.
GROUPS = [("sac", "HalfCheetah-v5"), ("sac", "Hopper-v5"), ("sac", "Walker2d-v5"),
          ("sac", "Ant-v5"), ("sac", "Humanoid-v5"), ("td3", "HalfCheetah-v5"),
          ("td3", "Hopper-v5"), ("td3", "Walker2d-v5"), ("ddpg", "HalfCheetah-v5")]
# Issue 52's five CrossQ groups and issue 51's five PPO groups (the tasks of their references).
CROSSQ_GROUPS = [("crossq", env_id) for env_id in (
    "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")]
PPO_GROUPS = [("ppo", env_id) for env_id in (
    "HalfCheetah-v5", "Walker2d-v5", "Hopper-v5", "InvertedPendulum-v5", "Humanoid-v5")]
ALL_GROUPS = [*GROUPS, *CROSSQ_GROUPS, *PPO_GROUPS]
ALGOS = ("sac", "td3", "ddpg", "crossq", "ppo")


def config_suffix(algo: str, config: str) -> str:
    """The run folder's suffix of a group started with ``--config config``: the file's stem
    less a leading ``<algo>_mujoco_`` or ``<algo>_`` (``parallel`` for SAC with
    ``sac_mujoco_parallel``, ``big`` with ``my/sac_big.yaml``); the whole stem where neither
    leads it, or where the one that does is all of it."""
    stem = Path(config).stem
    for prefix in (f"{algo}_mujoco_", f"{algo}_"):
        if stem.startswith(prefix):
            return stem.removeprefix(prefix) or stem
    return stem


def run_name(algo: str, env_id: str, config: str | None = None) -> str:
    """``sac_halfcheetah`` for SAC on HalfCheetah-v5; with a ``--config`` file, its
    ``config_suffix`` after it: ``sac_humanoid_parallel`` for SAC on Humanoid-v5 with
    ``sac_mujoco_parallel``."""
    name = f"{algo}_{env_id.split('-')[0].lower()}"
    return f"{name}_{config_suffix(algo, config)}" if config else name


def steps_done(run_dir: Path) -> int:
    """The env steps of a group's latest checkpoint; 0 when it has none."""
    latest = latest_checkpoint(run_dir)
    return (checkpoint_step(latest) or 0) if latest else 0


def command(algo: str, env_id: str, run_dir: Path, done: int, args: argparse.Namespace,
            extra: Sequence[str]) -> list[str]:
    """The training command of this job: a new group (with ``extra``, and ``--config`` where
    ``args.config`` is given), or the old one resumed (its checkpoint holds its config: no
    ``--config``), to at most ``--job-steps`` further."""
    until = args.total_timesteps if args.job_steps is None else min(
        args.total_timesteps, done + args.job_steps)
    train = [sys.executable, "-m", "rl_graphstep.train"]
    if done:
        return [*train, "--resume", str(run_dir), "--total-timesteps", str(until),
                "--no-progress"]
    # A PPO run keeps no replay buffer: --save-buffer is a flag it refuses.
    buffer = [] if is_on_policy(algo) else ["--save-buffer"]
    config = [] if args.config is None else ["--config", args.config]
    return [*train, "--algo", algo, "--env", env_id, *config, "--num-seeds", str(args.seeds),
            "--total-timesteps", str(until), *buffer, "--log-dir", str(run_dir.parent),
            "--run-name", run_dir.name, "--checkpoint-every", "100000", "--keep-checkpoints", "1",
            "--no-progress", *settings_of(algo, extra)[0]]


def settings_of(algo: str, extra: Sequence[str]) -> tuple[list[str], list[str]]:
    """``extra`` split into the flags ``algo`` reads (with their values) and those of settings
    only other algorithms read (a field's ``algos``), which its run would refuse: so one
    command can hand ``--learning-starts`` to the SAC groups and ``--num-steps`` to the PPO
    ones. Flags that are no Config field are kept (the training command reports them)."""
    kept: list[str] = []
    left_out: list[str] = []
    keep = True
    for token in extra:
        if token.startswith("--"):  # a flag; what follows up to the next one is its values
            name = token[2:].partition("=")[0].replace("-", "_")
            if name not in FIELDS and name.startswith("no_"):
                name = name.removeprefix("no_")  # --no-save-buffer sets save_buffer
            readers = FIELDS[name].metadata.get("algos") if name in FIELDS else None
            keep = readers is None or algo in readers
        (kept if keep else left_out).append(token)
    return kept, left_out


def parse_group(text: str) -> list[tuple[str, str]]:
    """``ALGO:ENV`` as that one group; ``ALGO`` alone as all of the table's groups of ALGO."""
    algo, colon, env_id = text.partition(":")
    if algo not in ALGOS or (colon and not env_id):
        raise argparse.ArgumentTypeError(f"{text!r} is not ALGO:ENV or ALGO (such as "
                                         f"sac:Ant-v5 or crossq; ALGO one of {', '.join(ALGOS)})")
    return [(algo, env_id)] if colon else [g for g in ALL_GROUPS if g[0] == algo]


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    # No abbreviations: a training flag such as --seed, handed on, would be read as --seeds.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     epilog="Flags it does not know go to every new group's "
                                            "training command (such as --device cpu).")
    parser.add_argument("--only", type=parse_group, action="append", metavar="ALGO:ENV",
                        help="run this group (repeatable; any env id), or ALGO alone: all of "
                             "its table groups (crossq, ppo: five each); default: the nine "
                             "SAC, TD3 and DDPG groups")
    parser.add_argument("--config", metavar="NAME",
                        help="start every new group from this config (a shipped config's "
                             "name, such as sac_mujoco_parallel, or a YAML file), in a run "
                             "folder named after it (sac_humanoid_parallel); a resumed group "
                             "keeps its own")
    parser.add_argument("--log-dir", type=Path, default=Path("runs"))
    parser.add_argument("--seeds", type=positive_int, default=5)
    parser.add_argument("--total-timesteps", type=positive_int, default=1_000_000,
                        help="each group's length (default: 1,000,000)")
    parser.add_argument("--job-steps", type=positive_int, default=None,
                        help="at most this many env steps per group in this job, for a machine "
                             "held for a limited time (default: to the end)")
    args, extra = parser.parse_known_args(argv)
    args.log_dir = args.log_dir.resolve()  # the training commands run from the checkout
    if args.config is not None and Path(args.config).is_file():  # a file here, not a name
        args.config = str(Path(args.config).resolve())
    chosen = [group for named in args.only for group in named] if args.only else GROUPS
    if args.job_steps is not None and any(is_on_policy(algo) for algo, _ in chosen):
        parser.error("--job-steps would end a PPO group's first job at a shorter "
                     "--total-timesteps, over which PPO anneals its learning rate for good; "
                     "run PPO groups without --job-steps (each in one job)")
    jobs = []
    for algo, env_id in dict.fromkeys(chosen):  # each group once, in the order asked
        run_dir = args.log_dir / run_name(algo, env_id, args.config)
        done = steps_done(run_dir)
        if done >= args.total_timesteps:
            print(f"{run_dir}: done ({done:,} steps)", flush=True)
            continue
        cmd = command(algo, env_id, run_dir, done, args, extra)
        if not done:  # every new group's command is checked before the first one runs
            check_training(env_id, cmd[3:], f"the group {algo} on {env_id}")
        jobs.append((algo, run_dir, done, cmd))
    failed = 0
    for algo, run_dir, done, cmd in jobs:
        left_out = [] if done else settings_of(algo, extra)[1]
        if left_out:
            print(f"{run_dir.name}: leaves out {' '.join(left_out)} (settings that {algo} "
                  "does not read)", flush=True)
        print("$", " ".join(cmd[1:]), flush=True)
        # Compiled cold, as a first run is: the wall-clock table times each group's start-up.
        with cold_compile(run_dir.parent / f"{run_dir.name}.compile-cache") as env:
            code = subprocess.run(cmd, cwd=ROOT, check=False, env=env).returncode
        if code:
            print(f"{run_dir}: the training command exited with {code}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
