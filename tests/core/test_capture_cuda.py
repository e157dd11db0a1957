"""GPU tests of capture_graph: a captured function replays on its tensors' current values,
capturing consumes no random numbers, a capture returns with nothing of its own still queued,
and a failed capture names its cause and leaves CUDA usable."""

from __future__ import annotations

import pytest
import torch

from rl_graphstep.core.capture import capture_graph
from rl_graphstep.core.errors import CaptureError

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda", 0)


def test_a_captured_function_replays_on_current_values_and_draws_fresh_noise() -> None:
    source = torch.arange(4.0, device=DEVICE)
    out = torch.zeros(4, device=DEVICE)

    def shifted_noise() -> torch.Tensor:
        out.copy_(source + torch.rand(4, device=DEVICE))
        return out

    torch.manual_seed(0)
    states = torch.get_rng_state(), torch.cuda.get_rng_state(DEVICE)
    graph, result = capture_graph(shifted_noise, DEVICE, what="a draw", warmup_steps=2)
    assert result is out
    assert torch.equal(torch.get_rng_state(), states[0])
    assert torch.equal(torch.cuda.get_rng_state(DEVICE), states[1])  # no number consumed
    graph.replay()
    first = out.clone()
    source.add_(10.0)
    graph.replay()
    torch.cuda.synchronize()
    noise = out - source
    assert bool(((noise >= 0) & (noise < 1)).all())  # read the new source
    assert not torch.equal(noise, first - (source - 10.0))  # and drew new numbers


def test_a_failed_capture_names_the_cause_and_leaves_random_draws_working() -> None:
    x = torch.ones(3, device=DEVICE)
    caller = torch.cuda.current_stream(DEVICE)

    def host_sync() -> torch.Tensor:
        return x * 2 if x.sum().item() > 0 else x

    message = (r"could not capture the test's function \(at tests/core/test_capture_cuda.py:\d+\): "
               r".*remove \.item\(\)")
    with pytest.raises(CaptureError, match=message):
        capture_graph(host_sync, DEVICE, what="the test's function")
    assert torch.cuda.current_stream(DEVICE) == caller  # not the capture's side stream
    assert torch.randn(3, device=DEVICE).isfinite().all()


def test_a_failed_capture_leaves_earlier_graphs_on_the_seeded_generator() -> None:
    """Graphs captured before a failed one still follow ``torch.manual_seed``, and eager draws
    continue after their numbers instead of repeating them."""
    out = torch.zeros(4, device=DEVICE)

    def draw() -> torch.Tensor:
        return out.copy_(torch.rand(4, device=DEVICE))

    graph, _ = capture_graph(draw, DEVICE, what="a draw")
    torch.manual_seed(3)
    graph.replay()
    seeded = out.clone()
    x = torch.ones(3, device=DEVICE)
    with pytest.raises(CaptureError):
        capture_graph(lambda: x * 2 if x.sum().item() > 0 else x, DEVICE, what="a sync")
    torch.manual_seed(3)
    graph.replay()
    assert torch.equal(out, seeded)
    eager = torch.rand(4, device=DEVICE)
    graph.replay()
    assert not torch.equal(eager, seeded) and not torch.equal(out, seeded)
    assert not torch.equal(out, eager)


def test_a_capture_returns_with_nothing_left_queued_on_its_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch writes the generator's seed and offset on the capture stream just before
    capturing: here behind a kernel of tens of milliseconds, which the capture must have
    waited for, so no later replay on another stream can have them overwritten."""
    streams: list[torch.cuda.Stream] = []
    begin = torch.cuda.CUDAGraph.capture_begin

    def slow_begin(self: torch.cuda.CUDAGraph, *args: object, **kwargs: object) -> None:
        streams.append(torch.cuda.current_stream(DEVICE))
        torch.cuda._sleep(50_000_000)  # GPU cycles, queued before torch's seed writes
        begin(self, *args, **kwargs)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", slow_begin)
    noise = torch.zeros(4, device=DEVICE)
    capture_graph(lambda: noise.normal_(), DEVICE, what="the noise")
    assert len(streams) == 1 and streams[0] != torch.cuda.current_stream(DEVICE)
    assert streams[0].query()
