"""Bit-for-bit recordings kept per platform, for the tests that compare training results
exactly (tests/test_reference_runs.py, tests/run/test_state.py).

Exact values depend on the torch build and the CPU kernels it picks, and, beyond torch's CPU
capability, on the CPU's vendor: torch's CPU build does its BLAS with Intel MKL, which takes
different code paths on Intel and AMD CPUs (and may on different models), so the last bits
differ between two machines with the same torch and capability. A data file therefore holds
a list of recordings, ``{"recordings": [{"platform": {...}, ...payload...}, ...]}``, and a test
compares against the one recorded on a platform like this one, or skips.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import pytest
import torch

# The platform's keys a recording must agree on to be compared against. A key a recording's
# platform leaves out matches any value (a recording without "cpu_model" serves every model of
# its vendor); other keys (numpy, gymnasium) are informative only.
CHECKED = ("torch", "cpu_capability", "cpu_vendor", "cpu_model")


def cpu_platform() -> dict[str, str]:
    """This machine's values of CHECKED: torch's version, the CPU capability torch picks its
    kernels by, and the CPU's vendor and ``"<family>/<model>"``, which pick MKL's paths."""
    info = _cpuinfo()
    family, model = info.get("cpu family"), info.get("model")
    return {"torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_vendor": info.get("vendor_id") or platform.processor() or "unknown",
            "cpu_model": f"{family}/{model}" if family and model else "unknown"}


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def matching(recordings: list[dict[str, Any]], here: dict[str, str]) -> dict[str, Any] | None:
    """The recording whose platform agrees with ``here`` on every CHECKED key it has (a key
    it leaves out matches anything), the one agreeing on the most keys where several do;
    None where none does."""
    best, agreed = None, -1
    for recording in recordings:
        keys = [key for key in CHECKED if key in recording["platform"]]
        if all(recording["platform"][key] == here.get(key) for key in keys) and len(keys) > agreed:
            best, agreed = recording, len(keys)
    return best


def with_recording(recordings: list[dict[str, Any]],
                   recording: dict[str, Any]) -> list[dict[str, Any]]:
    """``recordings`` with ``recording`` in place of the one made on the same platform (the
    same CHECKED keys and values), or added; the others kept, in order. A recording that only
    matches this platform, such as one for any model of this vendor, stays: it serves the
    other machines it matches."""
    def same(other: dict[str, Any]) -> bool:
        return all(other["platform"].get(key) == recording["platform"].get(key)
                   for key in CHECKED)
    kept = [other for other in recordings if not same(other)]
    at = next((i for i, other in enumerate(recordings) if same(other)), len(kept))
    return [*kept[:at], recording, *kept[at:]]


def described(values: dict[str, str]) -> str:
    """A platform's CHECKED keys as ``key=value``, those it has: ``torch=2.13.0+cpu
    cpu_capability=AVX512 cpu_vendor=GenuineIntel``."""
    return " ".join(f"{key}={values[key]}" for key in CHECKED if key in values)


def no_recording(here: dict[str, str], recordings: list[dict[str, Any]], record: str) -> str:
    """One line for a skip: this platform, the recorded ones, and the command ``record`` that
    records this one."""
    recorded = "; ".join(described(r["platform"]) for r in recordings) or "none"
    return (f"no recording for this platform ({described(here)}); recorded: {recorded}. "
            "Exact values differ between torch builds, CPU kernels and CPU vendors (MKL); "
            f"record this platform with `{record}`")


def read(path: Path) -> list[dict[str, Any]]:
    """The recordings in the data file ``path``."""
    return json.loads(path.read_text())["recordings"]


def write(path: Path, recordings: list[dict[str, Any]]) -> None:
    """Write ``recordings`` to the data file ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"recordings": recordings}, indent=1) + "\n")


def recording_here(path: Path, record: str) -> dict[str, Any]:
    """The recording in ``path`` made on a platform like this one; skips, in one line naming
    the command ``record`` that records it, where there is none."""
    recordings, here = read(path), cpu_platform()
    recording = matching(recordings, here)
    if recording is None:
        pytest.skip(no_recording(here, recordings, record))
    return recording


def record_here(path: Path, recording: dict[str, Any], root: Path) -> None:
    """Write ``recording`` (this platform's) into ``path``, in place of the one made on the
    same platform or added, keep the others, and say so (``path`` shown from ``root``)."""
    recordings = with_recording(read(path) if path.exists() else [], recording)
    write(path, recordings)
    print(f"wrote this platform's recording ({described(recording['platform'])}) in "
          f"{path.relative_to(root)}")
    for other in recordings:
        if other is not recording:
            print(f"kept the recording for {described(other['platform'])}: if the numerics "
                  "were meant to change, re-record it on its platform")
