"""GPU test of n-step rows through the captured ring write: adds of one size replay the
captured write (never re-captured), and the rings end as CPU rings given the same rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.nstep import NStepRows

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("seeds", [1, 3])
def test_n_step_adds_keep_one_captured_write_and_match_the_cpu(seeds: int) -> None:
    rng = np.random.default_rng(4)
    envs, rows = 4, NStepRows(3, 0.9, seeds, 4, 5, 2)
    cuda = ReplayBuffer(64, 5, 2, "cuda", seeds=seeds)
    cpu = ReplayBuffer(64, 5, 2, "cpu", seeds=seeds)
    graphs = None
    for _ in range(60):  # the rings wrap; episodes end often, so counts per add vary
        total = seeds * envs
        rows.push(rng.normal(size=(total, 5)), rng.uniform(-1, 1, (total, 2)),
                  rng.normal(size=total), rng.normal(size=(total, 5)), rng.random(total) < 0.2,
                  rng.random(total) < 0.2, rng.random(total) < 0.95)
        ready = rows.take()
        if ready is None:
            continue
        for buffer in (cuda, cpu):
            buffer.add(*ready[:4], None, not_dones=ready.not_dones, keep=ready.keep)
        graphs = graphs or cuda._writer.graphs
        assert cuda._writer.graphs is graphs  # no re-capture: every add has one size
    torch.cuda.synchronize()
    assert graphs is not None and cuda.sizes == cpu.sizes and cuda.positions == cpu.positions
    assert torch.equal(cuda.storage.cpu(), cpu.storage)
