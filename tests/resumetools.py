"""A run straight through beside the same run stopped part-way and resumed from the command
line: what the exact-resume tests compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import main, train


def straight_and_halves(log_dir: Path, args: list[str], total: int, half: int
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train ``args`` (which log to ``log_dir``) to ``total`` steps as run "straight", and to
    ``half`` as run "halves", resumed with ``--resume`` to ``total``; the last checkpoints of
    both."""
    train(load_config([*args, "--total-timesteps", str(total), "--run-name", "straight"]))
    train(load_config([*args, "--total-timesteps", str(half), "--run-name", "halves"]))
    assert main(["--resume", str(log_dir / "halves"), "--total-timesteps", str(total)]) == 0
    return load_checkpoint(log_dir / "straight"), load_checkpoint(log_dir / "halves")
