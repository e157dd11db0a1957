"""GPU tests of the replay sampling: a captured draw matches the eager one and reads the
buffer's current fill level."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_graphstep.buffer import BatchSampler, ReplayBuffer

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")


def test_captured_sampling_matches_eager_draws_and_reads_the_fill_level() -> None:
    buffer = ReplayBuffer(5000, 17, 6, DEVICE)
    rng = np.random.default_rng(0)
    buffer.add(rng.normal(size=(10, 17)), rng.uniform(-1, 1, (10, 6)), rng.normal(size=10),
               rng.normal(size=(10, 17)), rng.random(10) < 0.05)
    outputs = {kind: torch.zeros(256, 17, device=DEVICE) for kind in ("graph", "eager")}
    graph = BatchSampler(buffer, 256, [(outputs["graph"], slice(0, 17))], use_graph=True)
    eager = BatchSampler(buffer, 256, [(outputs["eager"], slice(0, 17))])
    assert graph.graph is not None and eager.graph is None
    for _ in range(3):
        draws = {}
        for kind, sampler in (("graph", graph), ("eager", eager)):
            torch.manual_seed(5)
            sampler()
            draws[kind] = outputs[kind].clone()
        torch.testing.assert_close(draws["graph"], draws["eager"], rtol=0, atol=0)
        assert len(set(draws["graph"][:, 0].tolist())) <= 10
    # Rows added after capture are drawn: the graph reads the buffer's size tensor.
    rng = np.random.default_rng(1)
    buffer.add(rng.normal(size=(2000, 17)), np.zeros((2000, 6)), np.zeros(2000),
               np.zeros((2000, 17)), np.zeros(2000, bool))
    graph()
    first = outputs["graph"].clone()
    assert len(set(first[:, 0].tolist())) > 200
    graph()
    assert not torch.equal(outputs["graph"], first)
