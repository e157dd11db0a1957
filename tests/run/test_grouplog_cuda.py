"""GPU test of a seed group's metric sums: added inside a captured CUDA graph, replay by
replay, and read back once per write, entry k into seed k's run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_grouplog import scalars

from rl_graphstep.run.grouplog import GroupLogger, seed_dir_name

pytestmark = pytest.mark.cuda
SEEDS = (1, 2, 3, 4)


def test_group_sums_added_in_a_graph(tmp_path: Path) -> None:
    with GroupLogger(tmp_path, SEEDS) as logger:
        loss = torch.zeros(len(SEEDS), device="cuda")
        values = {"losses/critic": loss}
        keys = logger.sums.prepare(values)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up the foreach kernel off the capture
            logger.sums.add_on_device(values)
        torch.cuda.current_stream().wait_stream(side)
        logger.sums.take_rows()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logger.sums.add_on_device(values)
        for step in range(1, 4):  # the graph adds the live values of each replay
            loss.copy_(torch.arange(1.0, 5.0, device="cuda") * step)
            graph.replay()
            logger.sums.count(keys)
        assert logger.write(300) == {"losses/critic": [2.0, 4.0, 6.0, 8.0]}
        loss.fill_(1.0)
        graph.replay()
        logger.sums.count(keys)
        assert logger.write(400) == {"losses/critic": [1.0] * 4}  # zeroed in place, kept
    for k, seed in enumerate(SEEDS):
        assert scalars(tmp_path / seed_dir_name(seed))["losses/critic"] == [
            (300, 2.0 * (k + 1)), (400, 1.0)]
