"""The run plan: modes resolved once from the config."""

from __future__ import annotations

import warnings

import pytest
import torch

from rl_graphstep.config import Config
from rl_graphstep.plan import plan_run, settle_action_stream


def test_the_action_stream_needs_a_policy_that_takes_host_noise() -> None:
    """``--action-stream off`` never; ``on`` where it can, with a warning that says why not;
    ``auto`` where it can, silently. Planned for a CUDA device (no GPU is touched)."""

    def settled(action_stream: str, noise_size: int) -> bool:
        plan = plan_run(Config(action_stream=action_stream, compile="off"),
                        torch.device("cuda"), updates_ahead=0)
        assert plan.graphs
        return settle_action_stream(plan, noise_size, "PlainActor").action_stream

    with pytest.warns(UserWarning, match=r"PlainActor has no sample\(observations, noise\)"):
        assert settled("on", 0) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto falls back silently
        assert settled("auto", 0) is False
        assert settled("auto", 3) is True
        assert settled("on", 3) is True
        assert settled("off", 3) is False
