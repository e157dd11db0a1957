"""GPU tests of the ring's writes: each add replays a captured write that ends as the CPU
write does, for one ring and for K seeds' rings, and a capture that fails writes eagerly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_graphstep.core.errors import CaptureError
from rl_graphstep.data import ringwrite
from rl_graphstep.data.buffer import ReplayBuffer

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")
OBS, ACT = 3, 2


def batch(start: int, n: int):
    """n transitions whose values encode their index i = start .. start+n-1."""
    i = np.arange(start, start + n, dtype=np.float32)[:, None]
    observations = i + np.array([0.0, 0.1, 0.2], dtype=np.float32)
    actions = -i + np.array([0.0, -0.5], dtype=np.float32)
    terminations = np.array([bool(k % 2) for k in range(start, start + n)])
    return observations, actions, 10 * i[:, 0], observations + 1000, terminations


def seeds_transition(rng: np.random.Generator, seeds: int, n: int):
    total = seeds * n
    return (rng.normal(size=(total, 17)), rng.uniform(-1, 1, (total, 6)), rng.normal(size=total),
            rng.normal(size=(total, 17)), rng.random(total) < 0.05)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_cuda_adds_replay_a_write_graph_that_equals_the_plain_write(n: int) -> None:
    """Each add replays a captured write (two graphs, one per pinned staging buffer): the
    ring ends as a CPU buffer given the same adds, position and fill level included."""
    replay, reference = ReplayBuffer(7, OBS, ACT, "cuda"), ReplayBuffer(7, OBS, ACT, "cpu")
    replay.add(*batch(0, n))  # captures the write graphs
    reference.add(*batch(0, n))
    # Every tensor the graphs read must outlive them: claim the freed small blocks with a
    # large number, so a graph that reads a freed one writes its rows out of place.
    clutter = [torch.full((64,), 10**6, dtype=torch.int64, device="cuda") for _ in range(4096)]
    for start in range(n, 40 * n, n):
        for buffer in (replay, reference):
            buffer.add(*batch(start, n))
    del clutter
    assert replay._writer.graphs is not None and len(replay._writer.graphs) == 2
    torch.testing.assert_close(replay.storage.cpu(), reference.storage, rtol=0, atol=0)
    assert replay.position_tensor.item() == replay.position == reference.position
    assert replay.size_tensor.item() == len(replay) == 7
    # A batch longer than the ring (a staging of its own, its graphs captured anew) keeps its
    # last rows, as on the CPU, and keeps the device counters right.
    replay.add(*batch(1000, 9))
    reference.add(*batch(1000, 9))
    torch.testing.assert_close(replay.storage.cpu(), reference.storage, rtol=0, atol=0)
    assert replay.position_tensor.item() == replay.position == reference.position
    assert replay._writer.graphs is not None


def test_cuda_adds_write_plainly_when_the_write_cannot_be_captured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(function: object, device: torch.device, *, what: str, **_: object) -> None:
        raise CaptureError(f"could not capture {what}: RuntimeError: boom")

    monkeypatch.setattr(ringwrite, "capture_graph", fails)
    replay, reference = ReplayBuffer(7, OBS, ACT, "cuda"), ReplayBuffer(7, OBS, ACT, "cpu")
    with pytest.warns(UserWarning, match="could not capture the replay buffer's write: "
                                         "RuntimeError: boom; writing the replay buffer "
                                         "without a graph"):
        replay.add(*batch(0, 2))
    reference.add(*batch(0, 2))
    for start in range(2, 20, 2):
        replay.add(*batch(start, 2))
        reference.add(*batch(start, 2))
    torch.testing.assert_close(replay.storage.cpu(), reference.storage, rtol=0, atol=0)
    assert replay._writer.graphs is None
    assert replay.position_tensor.item() == replay.position == reference.position


@pytest.mark.parametrize("n", [1, 3])
def test_seed_adds_replay_a_write_graph_that_equals_the_cpu_write(n: int) -> None:
    """K seeds' adds, each seed keeping its own rows (some none), replay a captured write
    (one per pinned staging buffer); the rings, fill levels and positions end as on the CPU."""
    seeds = 4
    replay = ReplayBuffer(7, 17, 6, DEVICE, seeds=seeds)
    reference = ReplayBuffer(7, 17, 6, "cpu", seeds=seeds)
    rng = np.random.default_rng(0)
    # Freed small blocks claimed with a large number: a graph that read a freed tensor would
    # write its rows out of place.
    clutter: list[torch.Tensor] = []
    for step in range(30):
        transition = seeds_transition(rng, seeds, n)
        keep = rng.random(seeds * n) < 0.7
        for buffer in (replay, reference):
            buffer.add(*transition, keep=keep)
        if step == 0:
            clutter = [torch.full((64,), 10**6, dtype=torch.int64, device=DEVICE)
                       for _ in range(4096)]
    del clutter
    assert replay._writer.graphs is not None and len(replay._writer.graphs) == 2
    assert torch.equal(replay.storage.cpu(), reference.storage)
    assert replay.sizes == reference.sizes and replay.positions == reference.positions
    assert replay.size_tensor.tolist() == list(replay.sizes)
    assert replay.position_tensor.tolist() == list(replay.positions)


def test_seed_adds_write_plainly_when_the_write_cannot_be_captured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(function: object, device: torch.device, *, what: str, **_: object) -> None:
        raise CaptureError(f"could not capture {what}: RuntimeError: boom")

    monkeypatch.setattr(ringwrite, "capture_graph", fails)
    replay = ReplayBuffer(5, 17, 6, DEVICE, seeds=3)
    reference = ReplayBuffer(5, 17, 6, "cpu", seeds=3)
    rng = np.random.default_rng(1)
    adds = [(seeds_transition(rng, 3, 2), rng.random(6) < 0.5) for _ in range(9)]
    with pytest.warns(UserWarning, match="writing the replay buffer without a graph"):
        replay.add(*adds[0][0], keep=adds[0][1])
    for transition, keep in adds[1:]:
        replay.add(*transition, keep=keep)
    for transition, keep in adds:
        reference.add(*transition, keep=keep)
    assert replay._writer.graphs is None
    assert torch.equal(replay.storage.cpu(), reference.storage)
    assert replay.position_tensor.tolist() == list(reference.positions)




def test_a_buffer_is_taken_again_only_once_the_copy_that_read_it_has_run() -> None:
    """A copy queued behind a long kernel still reads buffer 1 when buffer 0 is taken; taking
    buffer 1 again waits for that copy, so the host may then overwrite it."""
    turns = ringwrite.InTurns()
    stream = torch.cuda.current_stream()
    host = torch.ones(4, pin_memory=True)
    device = torch.empty(4, device=DEVICE)
    assert turns.take() == 1
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time before the copy
    device.copy_(host, non_blocking=True)
    turns.queued(stream)
    assert turns.take() == 0
    assert not stream.query()  # the copy has not run yet
    assert turns.take() == 1
    assert stream.query()  # taking buffer 1 waited for it
    host.fill_(2.0)
    assert device.tolist() == [1.0] * 4
