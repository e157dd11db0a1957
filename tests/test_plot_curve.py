"""benchmarks/plot_curve.py: the PNG and summary line of a resumed run, and its one-line errors."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from torch.utils.tensorboard import SummaryWriter

pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "plot_curve.py"
TAG = "charts/episodic_return"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load_script() -> ModuleType:
    """Import benchmarks/plot_curve.py (benchmarks/ is not a package; its own imports, such
    as cli, come from that folder)."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("plot_curve", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_events(run_dir: Path, order: int, points: list[tuple[int, float]],
                 purge_step: int | None = None) -> None:
    """Write `points` as one event file in `run_dir`, named so that files sort by `order`.

    SummaryWriter names files by the second and a process-wide counter, which need not sort in
    write order within one second; each file is written elsewhere and moved in under a fixed name.
    """
    scratch = run_dir.parent / f"scratch-{run_dir.name}-{order}"
    writer = SummaryWriter(str(scratch), purge_step=purge_step)
    for step, value in points:
        writer.add_scalar(TAG, value, step)
        writer.add_scalar("charts/episodic_length", 1000, step)
    writer.close()
    (written,) = scratch.glob("*tfevents*")
    run_dir.mkdir(exist_ok=True)
    written.rename(run_dir / f"events.out.tfevents.{order:010d}.test.1.0")
    scratch.rmdir()


def fake_resumed_run(run_dir: Path) -> list[tuple[int, float]]:
    """A rising noisy curve of ~300 episodes, resumed once with overlapping steps.

    Returns the points a reader should see: the first file's up to the resume step, then the
    second file's (its values differ from the first file's on the overlapping steps).
    """
    def value(step: int, shift: float) -> float:
        return 9000 * (1 - math.exp(-step / 120_000)) + 400 * math.sin(step / 7_000) + shift

    first = [(s, value(s, 0.0)) for s in range(1_000, 200_001, 1_000)]
    resume_step = 150_000
    second = [(s, value(s, 37.5)) for s in range(resume_step + 1_000, 300_001, 1_000)]
    write_events(run_dir, 1, first)
    write_events(run_dir, 2, second, purge_step=resume_step)
    return [p for p in first if p[0] < resume_step] + second


def test_resumed_run_writes_png_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "sac_halfcheetah"
    expected = fake_resumed_run(run_dir)
    out = tmp_path / "plots" / "curve.png"

    code = load_script().main([
        str(run_dir), "--out", str(out), "--smooth", "10", "--title", "test",
        "--reference", "9635", "--reference-label", "CleanRL SAC, 1M steps",
    ])

    assert code == 0
    data = out.read_bytes()
    assert len(data) > 1000
    assert data.startswith(PNG_SIGNATURE)
    summary = re.search(
        r"^sac_halfcheetah: (\d+) episodes, last step (\d+), mean of last 10 returns (\S+)$",
        capsys.readouterr().out, re.MULTILINE,
    )
    assert summary is not None
    assert int(summary.group(1)) == len(expected)
    assert int(summary.group(2)) == expected[-1][0]
    mean_last_10 = sum(v for _, v in expected[-10:]) / 10
    assert float(summary.group(3)) == pytest.approx(mean_last_10, abs=0.005)


def test_every_value_of_a_step_is_kept_in_written_order(tmp_path: Path) -> None:
    """Two envs ending episodes at step 200 are two episodes: both kept, in written order."""
    run_dir = tmp_path / "run"
    write_events(run_dir, 1, [(100, 1.0), (200, 2.0), (200, 5.0), (300, 3.0)])

    steps, values = load_script().read_scalars(run_dir, TAG)

    assert steps == [100, 200, 200, 300]
    assert values == [1.0, 2.0, 5.0, 3.0]


def test_a_csv_keeps_the_written_order_within_a_step(tmp_path: Path) -> None:
    path = tmp_path / "run.csv"
    path.write_text("step,value\n300,3.0\n200,5.0\n200,2.0\n100,1.0\n")
    assert load_script().read_csv(path) == ([100, 200, 200, 300], [1.0, 5.0, 2.0, 3.0])


def test_trailing_mean_averages_what_exists_at_the_start() -> None:
    assert load_script().trailing_mean([1.0, 2.0, 3.0, 4.0, 5.0], 3) == [1.0, 1.5, 2.0, 3.0, 4.0]


def test_missing_tag_lists_present_tags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    write_events(run_dir, 1, [(1_000, 1.0), (2_000, 2.0)])
    out = tmp_path / "curve.png"

    code = load_script().main([str(run_dir), "--out", str(out), "--tag", "charts/sps"])

    assert code == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'charts/sps'" in err
    assert "charts/episodic_length, charts/episodic_return" in err


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_missing_or_empty_folder_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str
) -> None:
    run_dir = tmp_path / "run"
    if make == "empty":
        run_dir.mkdir()

    code = load_script().main([str(run_dir), "--out", str(tmp_path / "curve.png")])

    assert code == 2
    err = capsys.readouterr().err.strip()
    expected = "no such folder" if make == "missing" else "no tensorboard event files"
    assert expected in err
    assert len(err.splitlines()) == 1


def test_a_written_csv_reads_back_as_the_same_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "hc1m"
    write_events(run_dir, 1, [(3_000, -12.5), (1_000, -405.74), (2_000, 240.7)])
    script = load_script()
    code = script.main([str(run_dir), "--out", str(tmp_path / "a.png"),
                        "--csv-dir", str(tmp_path / "csv")])
    written = tmp_path / "csv" / "hc1m.csv"
    assert code == 0
    assert written.read_text().splitlines() == [
        "step,episodic_return", "1000,-405.74", "2000,240.70", "3000,-12.50"]

    capsys.readouterr()
    code = script.main([str(written), str(run_dir), "--out", str(tmp_path / "b.png")])

    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    # The CSV curve is named by its file and summarised exactly as the run folder it came from.
    assert lines[0] == lines[1] == (
        "hc1m: 3 episodes, last step 3000, mean of last 3 returns -59.18")
    assert script.read_csv(written) == ([1000, 2000, 3000], [-405.74, 240.7, -12.5])


def test_a_csv_without_step_value_rows_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("step,episodic_return\n1000,high\n")

    code = load_script().main([str(bad), "--out", str(tmp_path / "curve.png")])

    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "bad.csv: not a step,value CSV with a header row" in err
