"""On a GPU: each seed of a group, evaluated on CUDA, is what a single run with that seed's
weights gives on CUDA, to the bit (the stacked weights sliced on the device)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_evaluate_seeds import TINY, single_run_of

from rl_graphstep import train
from rl_graphstep.evaluate import GroupEvaluation, evaluate

pytestmark = pytest.mark.cuda


def test_each_seed_on_cuda_is_a_single_run_of_its_weights(tmp_path: Path) -> None:
    assert train.main([*TINY, "--log-dir", str(tmp_path), "--run-name", "group"]) == 0
    group = tmp_path / "group"
    whole = evaluate(group, episodes=2, device="cuda", verbose=False)
    assert isinstance(whole, GroupEvaluation)
    for k, seed in enumerate(whole.seeds):
        single = evaluate(single_run_of(group, k, tmp_path / f"seed{k}"), episodes=2,
                          device="cuda", verbose=False)
        assert single == whole.results[k]
        assert evaluate(group, episodes=2, device="cuda", verbose=False,
                        group_seed=seed) == single
