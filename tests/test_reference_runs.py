"""Reference runs, bit for bit: SAC, TD3 (two envs), DDPG and a custom-network SAC, each trained
for 3,000 steps of Pendulum-v1 on the CPU from a fixed seed, must end with the recorded learning
state (a SHA-256 per tensor of the final checkpoint) and log the recorded losses, temperature
and returns (exact float hex). A change meant to leave the numerics alone shows here that it
did; a mismatch names the run, and the tensor or the tag and step that differ.

The values depend on the torch build, on the CPU kernels it picks and on the CPU's vendor (and
maybe model: torch's BLAS, Intel MKL, takes other paths on AMD than on Intel CPUs), so the data
holds one recording per platform (tests/recordings.py). The runs compare against the recording
whose torch version, CPU capability, CPU vendor and CPU model agree with this machine's (a
recording that names no model serves every model of its vendor), and skip, saying so, where
none does. Recording adds this platform's recording, or replaces the one made on the same
platform, and keeps the others. Record on a new platform, or, when a change is meant to alter
the numerics, on each recorded platform, and say so in the commit::

    python tests/test_reference_runs.py --record
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import itertools
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The repository's own package and `examples` (not part of the installed package), also when
# this file runs as a script to record.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from recordings import (  # noqa: E402
    CHECKED,
    cpu_platform,
    described,
    matching,
    read,
    record_here,
    recording_here,
    with_recording,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from torch import Tensor  # noqa: E402

from examples.residual_actor import ResidualActor  # noqa: E402
from rl_graphstep.run.checkpoint import load_checkpoint  # noqa: E402
from rl_graphstep.settings.config import Config  # noqa: E402
from rl_graphstep.train import train  # noqa: E402

DATA = Path(__file__).parent / "fixtures" / "reference_runs.json"
RECORD = "python tests/test_reference_runs.py --record"

# Small networks and batches keep the four runs near a minute on a CPU (the eager updates'
# time is mostly per-op overhead); the 2,000 updates after a 1,000-step warm-up run every
# line of the update all the same. log_interval gives ten points of losses per run.
COMMON: dict[str, Any] = {
    "env_id": "Pendulum-v1", "device": "cpu", "seed": 1, "total_timesteps": 3_000,
    "learning_starts": 1_000, "buffer_size": 10_000, "batch_size": 32,
    "hidden_sizes": (32, 32), "log_interval": 200, "progress": False,
}


@dataclasses.dataclass(frozen=True)
class Run:
    """One reference run: the config's settings beyond COMMON and the actor passed to train."""

    settings: Mapping[str, Any]
    actor: type | None = None


RUNS: dict[str, Run] = {
    "sac": Run({"algo": "sac"}),
    # Two envs take the vector path: 3,000 steps are 1,500 iterations and 1,000 updates.
    "td3_2envs": Run({"algo": "td3", "num_envs": 2}),
    "ddpg": Run({"algo": "ddpg"}),
    # A custom actor passed as a class, and a custom critic named by file in the config, whose
    # dropout draws random numbers inside the critic's forward.
    "sac_custom": Run({"algo": "sac", "actor_kwargs": {"width": 32, "blocks": 1},
                       "critic": f"{ROOT / 'examples' / 'layernorm_critic.py'}:LayerNormCritic",
                       "critic_kwargs": {"hidden_sizes": [32, 32], "dropout": 0.01}},
                      actor=ResidualActor),
}

# The logged scalars compared: everything the updates log, the temperature, the returns.
LOGGED_TAGS = ("losses/", "charts/alpha", "charts/episodic_return")


def learning_state(run_dir: Path) -> dict[str, Tensor]:
    """The tensors of the final learning state, by dotted name (``critic.weights.0``,
    ``actor_optimizer.state.3.exp_avg``, ``log_alpha``, ...): everything under the last
    checkpoint's ``agent`` key, i.e. networks, target networks, optimizers and SAC's
    temperature. The one place to adapt when the checkpoint's layout moves."""
    return dict(_tensors(load_checkpoint(run_dir)["agent"]))


def _tensors(value: Any, name: str = "") -> Iterator[tuple[str, Tensor]]:
    if isinstance(value, Tensor):
        yield name, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _tensors(item, f"{name}.{key}" if name else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _tensors(item, f"{name}.{index}")


def digest(tensor: Tensor) -> str:
    """``float32[64, 3] <sha256 of the bytes>``: dtype and shape say at once what differs."""
    data = tensor.detach().cpu().contiguous().numpy().tobytes()
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{dtype}{list(tensor.shape)} {hashlib.sha256(data).hexdigest()}"


def logged_scalars(run_dir: Path) -> dict[str, list[str]]:
    """Each compared tag's points as ``"step value-as-float-hex"``, in the order logged, from
    the run's event files (tensorboard stores float32: the hex is exact). Two envs can end
    an episode at the same step, so a step may come twice."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [f"{e.step} {float(e.value).hex()}" for e in events.Scalars(tag)]
            for tag in sorted(events.Tags()["scalars"]) if tag.startswith(LOGGED_TAGS)}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One intra-op thread, whatever OMP_NUM_THREADS says (as when recording, outside pytest's
    conftest): a reduction split over threads can round differently."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def reference_run(name: str, log_dir: Path) -> dict[str, Any]:
    """Train run ``name`` in ``log_dir``; its per-tensor digests and logged scalars."""
    run = RUNS[name]
    cfg = Config(**COMMON, **run.settings, log_dir=str(log_dir), run_name=name)
    with one_thread():
        train(cfg, actor=run.actor)
    run_dir = log_dir / name
    return {"state": {key: digest(t) for key, t in learning_state(run_dir).items()},
            "scalars": logged_scalars(run_dir)}


def platform() -> dict[str, str]:
    """What the bit-for-bit values depend on: torch's build, its CPU kernels and the CPU's
    vendor and model (checked, ``recordings.CHECKED``), and the numpy and gymnasium that step
    Pendulum (recorded, shown on a mismatch)."""
    return {**cpu_platform(), "numpy": np.__version__, "gymnasium": gym.__version__}


def differences(recorded: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """One line per logged point and per tensor that differs, naming it: the points first,
    by step, so the first line says when the runs parted."""
    points = []
    for tag in sorted(recorded["scalars"].keys() | got["scalars"].keys()):
        old, new = recorded["scalars"].get(tag, []), got["scalars"].get(tag, [])
        points += [(_step(was or now), f"{tag}: recorded {_shown(was)}, got {_shown(now)}")
                   for was, now in itertools.zip_longest(old, new) if was != now]
    points.sort(key=lambda point: point[0])  # stable: tags stay in order within a step
    state, digests = recorded["state"], got["state"]
    return [line for _, line in points] + [
        f"tensor {key}: recorded {state.get(key, 'none')}, got {digests.get(key, 'none')}"
        for key in sorted(state.keys() | digests.keys()) if state.get(key) != digests.get(key)]


def _step(point: str) -> int:
    return int(point.split()[0])


def _shown(point: str | None) -> str:
    if point is None:
        return "no point"
    step, value = point.split()
    return f"{float.fromhex(value)!r} at step {step} ({value})"


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The recording made on a platform like this one (``{"platform": ..., "runs": ...}``);
    skips where there is none."""
    if not DATA.exists():
        pytest.fail(f"{DATA.name} is missing: record it with `{RECORD}`")
    return recording_here(DATA, RECORD)


@pytest.mark.parametrize("name", list(RUNS))
def test_training_matches_the_recorded_run_bit_for_bit(name: str, reference: dict[str, Any],
                                                       tmp_path: Path) -> None:
    if name not in reference["runs"]:
        pytest.fail(f"run {name!r} has no recording: record with `{RECORD}`")
    lines = differences(reference["runs"][name], reference_run(name, tmp_path))
    if lines:
        recorded = reference["platform"]
        changed = {k: v for k, v in platform().items()
                   if k not in CHECKED and recorded.get(k) != v}
        tensors = sum(line.startswith("tensor ") for line in lines)
        pytest.fail(f"run {name} differs from its recording ({described(recorded)}) in "
                    f"{len(lines) - tensors} logged points and {tensors} tensors"
                    + (f" (with numpy or gymnasium other than recorded: {changed})"
                       if changed else "") + ":\n"
                    + "\n".join(lines[:20]) + ("\n..." if len(lines) > 20 else ""),
                    pytrace=False)


def test_differences_name_the_tag_step_and_tensor() -> None:
    recorded = {"state": {"actor.w": "float32[2] aa", "log_alpha": "float32[] bb"},
                "scalars": {"losses/critic": ["1200 0x1.0p+0", "1400 0x1.8p+0"],
                            "losses/actor": ["1400 0x1.0p+1"]}}
    got = {"state": {"actor.w": "float32[2] cc", "actor.b": "float32[2] dd",
                     "log_alpha": "float32[] bb"},
           "scalars": {"losses/critic": ["1200 0x1.0p+0", "1400 0x1.8000000000001p+0"],
                       "losses/actor": []}}
    assert differences(recorded, got) == [
        "losses/actor: recorded 2.0 at step 1400 (0x1.0p+1), got no point",
        "losses/critic: recorded 1.5 at step 1400 (0x1.8p+0), got 1.5000000000000002 at step "
        "1400 (0x1.8000000000001p+0)",
        "tensor actor.b: recorded none, got float32[2] dd",
        "tensor actor.w: recorded float32[2] aa, got float32[2] cc",
    ]
    assert differences(recorded, recorded) == []


INTEL = {"torch": "2.13.0+cpu", "cpu_capability": "AVX512", "cpu_vendor": "GenuineIntel"}
AMD = {**INTEL, "cpu_vendor": "AuthenticAMD", "cpu_model": "25/17"}


def test_a_platform_compares_against_the_recording_made_on_its_like() -> None:
    assert tuple(cpu_platform()) == CHECKED
    recordings = [{"platform": {**INTEL, "numpy": "2.4.6"}, "runs": "intel"},
                  {"platform": {**AMD, "numpy": "2.4.6"}, "runs": "amd"}]
    # No model in the Intel recording: every Intel model, and numpy is not checked.
    for model in ("6/143", "6/85", "unknown"):
        here = {**INTEL, "cpu_model": model, "numpy": "2.5.0"}
        assert matching(recordings, here)["runs"] == "intel"
    assert matching(recordings, AMD)["runs"] == "amd"
    assert matching(recordings, {**AMD, "cpu_model": "25/1"}) is None
    assert matching(recordings, {**AMD, "torch": "2.14.0+cpu"}) is None
    assert matching(recordings, {**INTEL, "cpu_model": "6/85", "torch": "2.14.0+cpu"}) is None
    assert matching(recordings, {**INTEL, "cpu_model": "6/85", "cpu_capability": "AVX2"}) is None
    # The recording that names the model wins over the vendor's, whatever their order.
    this_model = {"platform": {**INTEL, "cpu_model": "6/143"}, "runs": "intel 6/143"}
    for listed in ([*recordings, this_model], [this_model, *recordings]):
        assert matching(listed, {**INTEL, "cpu_model": "6/143"})["runs"] == "intel 6/143"
        assert matching(listed, {**INTEL, "cpu_model": "6/85"})["runs"] == "intel"
    # The data files: the recording migrated as Intel's, and this AMD EPYC's.
    for path in (DATA, ROOT / "tests" / "fixtures" / "v0.1.0_runs" / "old_sac_resumed_to_900.json"):
        recorded = read(path)
        intel = matching(recorded, {**INTEL, "cpu_model": "6/143"})
        assert intel is recorded[0] and intel["platform"]["cpu_vendor"] == "GenuineIntel"
        assert matching(recorded, AMD)["platform"]["cpu_vendor"] == "AuthenticAMD"
        assert matching(recorded, {**AMD, "torch": "0.0.0"}) is None


def test_recording_replaces_only_the_one_made_on_the_same_platform() -> None:
    vendor = {"platform": INTEL, "runs": "intel"}
    amd = {"platform": AMD, "runs": "amd"}
    again = {"platform": {**AMD, "numpy": "2.5.0"}, "runs": "amd again"}
    assert with_recording([vendor, amd], again) == [vendor, again]
    assert with_recording([amd, vendor], again) == [again, vendor]
    # An Intel model's recording joins the vendor's, which still serves the other models.
    this_model = {"platform": {**INTEL, "cpu_model": "6/143"}, "runs": "intel 6/143"}
    assert with_recording([vendor, amd], this_model) == [vendor, amd, this_model]
    assert with_recording([], amd) == [amd]


def record() -> None:
    """Train every reference run and write this platform's recording into DATA, in place of
    the one made on the same platform or added; the others are kept."""
    runs = {}
    for name in RUNS:
        began = time.perf_counter()
        with tempfile.TemporaryDirectory() as log_dir:
            runs[name] = reference_run(name, Path(log_dir))
        print(f"recorded {name} in {time.perf_counter() - began:.1f} s", flush=True)
    record_here(DATA, {"platform": platform(), "runs": runs}, ROOT)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", required=True,
                        help="train the reference runs and record them for this platform")
    parser.parse_args()
    record()
