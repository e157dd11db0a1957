"""The training loop's intra-op CPU thread count: one unless the user chose a count, and given
back when the loop ends (``torch_threads`` is in conftest.py)."""

from __future__ import annotations

import pytest
import torch

from rl_graphstep.run.threads import loop_threads


def test_the_cuda_loop_runs_on_one_cpu_thread_and_gives_the_count_back() -> None:
    previous = torch.get_num_threads()
    with loop_threads(torch.device("cuda")):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == previous
    with pytest.raises(RuntimeError), loop_threads(torch.device("cuda")):
        raise RuntimeError("the loop failed")
    assert torch.get_num_threads() == previous


def test_a_thread_count_openmp_rejects_chose_no_count(
        monkeypatch: pytest.MonkeyPatch, torch_threads: None) -> None:
    """A value OpenMP rejects (it warns, and torch keeps its default) is not the user's."""
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    with loop_threads(torch.device("cpu")):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("chosen", ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "set_num_threads"])
def test_cpu_training_keeps_a_thread_count_the_user_chose(
        chosen: str, monkeypatch: pytest.MonkeyPatch, torch_threads: None) -> None:
    if chosen == "set_num_threads":
        torch.set_num_threads(3)  # after rl_graphstep was imported
    else:
        monkeypatch.setenv(chosen, "2")
    expected = torch.get_num_threads()
    with loop_threads(torch.device("cpu")):
        assert torch.get_num_threads() == expected
    with loop_threads(torch.device("cuda")):  # the CUDA loop: one, always
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == expected
