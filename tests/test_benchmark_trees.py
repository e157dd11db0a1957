"""benchmarks/trees.py: two trees' loops taking turns, the table of their figures, and its
one-line refusal of a tree that is not a checkout (a short CPU run; speed means nothing here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import trees  # noqa: E402


def test_two_trees_take_turns_and_each_k_is_set_against_its_k1(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = trees.main(["--tree", f"a={ROOT}", "--tree", f"b={ROOT}", "--env", "Pendulum-v1",
                       "--seeds", "1", "2", "--steps", "300", "--learning-starts", "260",
                       "--rounds", "2", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and
            line[2].isdigit()]
    # Round 1 runs a then b, round 2 b then a; each tree runs K=1 then K=2.
    assert [(r[0][2:], r[1], r[2]) for r in rows] == [
        ("1", "a", "1"), ("1", "a", "2"), ("1", "b", "1"), ("1", "b", "2"),
        ("2", "b", "1"), ("2", "b", "2"), ("2", "a", "1"), ("2", "a", "2")]
    for row in rows:
        per_seed, in_all = (float(v.replace(",", "")) for v in row[3:5])
        assert per_seed > 0 and abs(in_all - per_seed * int(row[2])) <= int(row[2])  # rounding
        assert row[6].strip(" |").endswith("x") == (row[2] == "2")


def test_a_tree_without_the_package_is_one_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        trees.main(["--tree", f"old={tmp_path}", "--device", "cpu"])
    assert exit_info.value.code == 2
    assert "--tree takes NAME=PATH with rl_graphstep/ under PATH" in capsys.readouterr().err


def test_flags_reach_every_loop_and_win_over_its_own(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = trees.main(["--tree", f"a={ROOT}", "--env", "Pendulum-v1", "--seeds", "1",
                       "--steps", "300", "--learning-starts", "260", "--rounds", "1",
                       "--device", "cpu", "--flags", "--vec-env async --num-envs 2"])
    out = capsys.readouterr().out
    assert code == 0, out
    loops = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [loop["vec_env"] for loop in loops] == ["async"]  # the loop's own says "auto"
