"""Where a PPO rollout's wall time goes: its env steps (acting, the envs, the host's
bookkeeping) against its update (GAE and every minibatch of every epoch), and the steps'
host parts (``STEP_PARTS``, each timed where it is called; "other" is the loop's rest).

The real loop (``rl_graphstep.train.train --algo ppo``) runs for ``--rollouts`` rollouts; each
update is timed from its call to the device's end of it (the device is synchronised before
and after), the rest of the rollout is the steps. The first ``--burn-in`` rollouts (capture,
compilation) are not counted. Without synchronising, the update's kernels would overlap the
next rollout's first steps; synchronised, each part is its own.

    python benchmarks/ppo_split.py --env HalfCheetah-v5                       # CleanRL's settings
    python benchmarks/ppo_split.py --env HalfCheetah-v5 --flags "--num-envs 64 --num-steps 32"
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from cli import cli_main, split_flags

import rl_graphstep.train as training
from rl_graphstep.data.normalizer import ObservationNormalizer, RewardNormalizer
from rl_graphstep.data.rollout import Rollout
from rl_graphstep.envs.vector import EnvStepper
from rl_graphstep.learners.onpolicy import OnPolicyLearner
from rl_graphstep.run.flags import load_config
from rl_graphstep.run.rollouts import RolloutCollector
from rl_graphstep.train import train

# The host's parts of an env step, in the order a step calls them: (owner, method, label).
# Acting is queued (launch) and read back (wait); the parts after the next step's launch run
# on the host while the device acts.
STEP_PARTS = (
    (OnPolicyLearner, "actions", "acting wait"),
    (EnvStepper, "start", "envs"),
    (EnvStepper, "finish", "envs"),
    (OnPolicyLearner, "values", "bootstrap values"),
    (ObservationNormalizer, "observe", "observation statistics"),
    (OnPolicyLearner, "start_acting", "acting launch"),
    (RolloutCollector, "_checked", "non-finite checks"),
    (RewardNormalizer, "scale", "reward scaling"),
    (Rollout, "record", "rollout row"),
    (training, "_episode_ended", "episode ended"),
    (training, "_log", "log"),
)


@contextlib.contextmanager
def timed_parts(seconds: Counter[str]) -> Iterator[None]:
    """``STEP_PARTS`` each adding its calls' wall time into ``seconds`` (by label), while in
    the block: a part called inside another (the values inside the acting) is the outer's,
    and nothing inside an update is timed (the update, wrapped untimed, is a part of its own)."""
    wrapped = [*STEP_PARTS, (OnPolicyLearner, "update", None)]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in wrapped]
    inside = [False]  # in a timed part or an update

    def timed(function: Any, label: str | None) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if inside[0]:
                return function(*args, **kwargs)
            inside[0] = True
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if label is not None:
                    seconds[label] += time.perf_counter() - began
                inside[0] = False
        return wrapper

    try:
        for (owner, name, label), (_, _, function) in zip(wrapped, originals, strict=True):
            setattr(owner, name, timed(function, label))
        yield
    finally:
        for owner, name, function in originals:
            setattr(owner, name, function)


def split_rollouts(cfg_args: list[str], device: torch.device,
                   step_parts: list[Counter[str]] | None = None) -> list[tuple[float, float]]:
    """Train as ``cfg_args`` say; per rollout, (seconds of its steps, seconds of its update).
    ``step_parts``, where given, gets per rollout the seconds of its steps' host parts
    (``STEP_PARTS``, by label)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    original = OnPolicyLearner.update
    parts: list[tuple[float, float]] = []
    last = [time.perf_counter()]  # when the last update ended (or the run began)
    running: Counter[str] = Counter()  # the host parts of the rollout under way

    def timed(self: OnPolicyLearner, next_values: torch.Tensor) -> None:
        sync()
        called = time.perf_counter()
        if step_parts is not None:
            step_parts.append(running.copy())
            running.clear()
        original(self, next_values)
        sync()
        done = time.perf_counter()
        parts.append((called - last[0], done - called))
        last[0] = done

    OnPolicyLearner.update = timed  # type: ignore[method-assign]
    try:  # timed_parts keeps what this timed update calls out of the parts
        with timed_parts(running) if step_parts is not None else contextlib.nullcontext():
            train(load_config(cfg_args))
    finally:
        OnPolicyLearner.update = original  # type: ignore[method-assign]
    return parts


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--burn-in", type=int, default=2, help="rollouts not counted")
    parser.add_argument("--flags", default="", help="more training flags, one string")
    parser.add_argument("--device", choices=["cuda", "cpu"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if not 0 <= args.burn_in < args.rollouts:
        parser.error(f"--burn-in takes 0 .. --rollouts - 1; got {args.burn_in} of "
                     f"{args.rollouts}")
    with tempfile.TemporaryDirectory() as log_dir:
        base = ["--algo", "ppo", "--env", args.env, "--device", args.device, "--log-dir",
                log_dir, "--no-progress", *split_flags(args.flags, "--flags")]
        cfg = load_config(base)
        rollout = cfg.num_envs * cfg.num_steps  # env steps of a seed's rollout
        cfg_args = [*base, "--total-timesteps", str(args.rollouts * rollout),
                    "--checkpoint-every", str(10 * args.rollouts * rollout)]
        step_parts: list[Counter[str]] = []
        parts = split_rollouts(cfg_args, torch.device(args.device), step_parts)[args.burn_in:]
    if not parts:
        raise SystemExit("no rollout was timed: raise --rollouts")
    steps = statistics.median(p[0] for p in parts)
    update = statistics.median(p[1] for p in parts)
    vector_steps = cfg.num_steps
    print(f"{args.env}, {args.device}, {cfg.num_seeds} seed(s) x {cfg.num_envs} env(s) x "
          f"{cfg.num_steps} steps, {cfg.num_minibatches} minibatches x {cfg.update_epochs} "
          f"epochs; medians of rollouts {args.burn_in + 1}-{args.rollouts}")
    print("| part | ms per rollout | µs per vector step | share |")
    print("|---|---:|---:|---:|")
    total = steps + update
    for name, seconds in (("env steps (acting, envs, bookkeeping)", steps),
                          ("update (GAE, minibatches)", update)):
        print(f"| {name} | {seconds * 1e3:,.1f} | {seconds * 1e6 / vector_steps:,.1f} | "
              f"{seconds / total:.0%} |")
    minibatches = cfg.num_minibatches * cfg.update_epochs
    print(f"env steps/s: {rollout / total:,.0f}; update: {update * 1e6 / minibatches:,.0f} µs "
          f"per minibatch ({minibatches} a rollout)")
    print_step_parts(step_parts[args.burn_in:], steps * 1e6 / vector_steps, vector_steps)
    return 0


def print_step_parts(step_parts: list[Counter[str]], step_us: float, vector_steps: int
                     ) -> None:
    """The env steps' host parts, each the median over the counted rollouts in µs per
    vector step; "other" is the rest of the median step (the loop's own lines)."""
    print("| step part | µs per vector step |")
    print("|---|---:|")
    medians = {label: statistics.median(p[label] for p in step_parts) * 1e6 / vector_steps
               for label in dict.fromkeys(label for _, _, label in STEP_PARTS)}
    for label, us in medians.items():
        print(f"| {label} | {us:,.1f} |")
    print(f"| other (the loop's and the collector's own lines) | "
          f"{step_us - sum(medians.values()):,.1f} |")


if __name__ == "__main__":
    raise SystemExit(main())
