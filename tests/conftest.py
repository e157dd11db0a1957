"""Shared test set-up: `cuda` tests skip cleanly on a machine without a GPU, and `slow` tests
(minutes of training) run without the stack dump of `faulthandler_timeout`."""

from __future__ import annotations

import faulthandler

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # pytest arms the timed dump before the test's setup and cancels it after its teardown; a
    # learning run passes the timeout by design, and 80 lines of stack then read like a hang.
    if "slow" in item.keywords:
        faulthandler.cancel_dump_traceback_later()
