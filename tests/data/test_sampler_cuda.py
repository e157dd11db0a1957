"""GPU tests of the replay sampler: a captured draw matches the eager one and reads the
buffer's current fill levels, one seed's or each of K seeds'."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.sampler import BatchSampler

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


def seeds_transition(rng: np.random.Generator, seeds: int, n: int):
    total = seeds * n
    return (rng.normal(size=(total, 17)), rng.uniform(-1, 1, (total, 6)), rng.normal(size=total),
            rng.normal(size=(total, 17)), rng.random(total) < 0.05)


def test_captured_seed_sampling_matches_eager_and_reads_each_seeds_fill_level() -> None:
    seeds = 3
    buffer = ReplayBuffer(5000, 17, 6, DEVICE, seeds=seeds)
    rng = np.random.default_rng(0)
    # Seed 0 keeps 2 rows, seed 1 all 10, seed 2 one.
    keep = np.zeros(3 * 10, bool)
    keep[:2], keep[10:20], keep[20] = True, True, True
    buffer.add(*seeds_transition(rng, seeds, 10), keep=keep)
    outputs = {kind: torch.zeros(seeds, 256, 17, device=DEVICE) for kind in ("graph", "eager")}
    graph = BatchSampler(buffer, 256, [(outputs["graph"], slice(0, 17))], use_graph=True)
    eager = BatchSampler(buffer, 256, [(outputs["eager"], slice(0, 17))])
    assert graph.graph is not None
    for _ in range(3):
        draws = {}
        for kind, sampler in (("graph", graph), ("eager", eager)):
            torch.manual_seed(5)
            sampler()
            draws[kind] = outputs[kind].clone()
        assert torch.equal(draws["graph"], draws["eager"])
        for seed, size in enumerate((2, 10, 1)):
            stored = set(buffer.storage[seed, :size, 0].tolist())
            assert set(draws["graph"][seed, :, 0].tolist()) == stored
    # Rows added after capture are drawn: the graph reads the seeds' size tensor.
    buffer.add(*seeds_transition(np.random.default_rng(1), seeds, 1000))
    graph()
    counts = [len(set(outputs["graph"][seed, :, 0].tolist())) for seed in range(seeds)]
    assert min(counts) > 150
