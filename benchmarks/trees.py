"""Before and after a change, side by side in one job: the training loop of each source tree at
each K, one loop per process, the trees taking turns round after round.

One seed's speed moves 10-20% from one run to the next (its loop is bound by the host), so a
comparison needs the trees interleaved in one job, several rounds of them. Each loop is
``seeds.run_loop`` of that tree (SAC, seeds 1..K, the default vector env, compiled CUDA
graphs), run with that tree first on the path; the old tree is a checkout of the old commit:

    git worktree add /tmp/before HEAD~1      # or: git archive HEAD~1 | tar -x -C /tmp/before
    python benchmarks/trees.py --tree before=/tmp/before --tree after=. --seeds 1 8 --rounds 2
    python benchmarks/trees.py --tree before=/tmp/before --tree after=. --env Humanoid-v5 \
        --seeds 5 --steps 40000 --learning-starts 5000 \
        --flags "--config sac_mujoco_parallel --vec-env shared"

Prints a JSON line per loop, then a table: env steps/s per seed (each iteration steps every
seed's env once) and host µs per iteration, and each K against K=1 of the same tree and round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from cli import cli_main, nonnegative_int, positive_int, split_flags

_LOOP = """import json, sys, tempfile
sys.path.insert(0, "benchmarks")
from seeds import run_loop
loop = run_loop({env!r}, {seeds}, "auto", {steps}, {starts}, {device!r}, tempfile.mkdtemp(),
               {flags!r})
figures = {{"vec_env": loop.vec_env, "sps": loop.iterations, "host_us": loop.host_us}}
print("LOOP", json.dumps(figures))
"""


def run_in(tree: Path, env: str, seeds: int, steps: int, starts: int,
           device: str, flags: list[str]) -> dict[str, object]:
    """One loop in a fresh process of ``tree``: its figures, or its error's last lines."""
    path = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    code = _LOOP.format(env=env, seeds=seeds, steps=steps, starts=starts, device=device,
                        flags=flags)
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path), check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOOP ")]
    if done.returncode or not lines:
        return {"error": done.stderr.strip().splitlines()[-3:]}
    return json.loads(lines[-1].removeprefix("LOOP "))


def table(results: list[dict]) -> str:
    """The markdown table of the loops, K against K=1 of the same tree and round."""
    ones = {(r["tree"], r["round"]): r["sps"] for r in results if r["k"] == 1 and "sps" in r}
    lines = ["| round | tree | K | env steps/s per seed | in all | host µs per iteration "
             "| against K=1 |", "|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        if "sps" not in r:
            lines.append(f"| {r['round']} | {r['tree']} | {r['k']} | failed | | | |")
            continue
        one = ones.get((r["tree"], r["round"]))
        ratio = f"{r['sps'] / one:.2f}x" if one and r["k"] != 1 else ""
        host = f"{r['host_us']:.0f}" if r["host_us"] is not None else "-"
        lines.append(f"| {r['round']} | {r['tree']} | {r['k']} | {r['sps']:,.0f} | "
                     f"{r['sps'] * r['k']:,.0f} | {host} | {ratio} |")
    return "\n".join(lines)


@cli_main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                        help="a source tree to run, named (give two or more)")
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--seeds", nargs="+", type=positive_int, default=[1, 8],
                        help="the Ks to run")
    parser.add_argument("--steps", type=positive_int, default=20_000, help="env steps per seed")
    parser.add_argument("--learning-starts", type=nonnegative_int, default=1_000)
    parser.add_argument("--rounds", type=positive_int, default=2,
                        help="every tree at every K, per round")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--flags", default="", help="more training flags, one string (after "
                        "the loop's own, so they win: --flags '--config sac_mujoco_parallel "
                        "--vec-env shared'); every tree must take them")
    args = parser.parse_args(argv)
    flags = split_flags(args.flags, "--flags")
    trees = []
    for spec in args.tree:
        name, _, path = spec.partition("=")
        if not name or not path or not (Path(path) / "rl_graphstep").is_dir():
            parser.error(f"--tree takes NAME=PATH with rl_graphstep/ under PATH, got {spec!r}")
        trees.append((name, Path(path).resolve()))
    results = []
    for round_ in range(1, args.rounds + 1):
        # Each round runs the trees in the other order, so neither always goes first.
        for name, tree in trees if round_ % 2 else trees[::-1]:
            for k in args.seeds:
                loop = run_in(tree, args.env, k, args.steps, args.learning_starts, args.device,
                              flags)
                results.append({"round": round_, "tree": name, "k": k, **loop})
                print(json.dumps(results[-1]), flush=True)
    print(table(results))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
