"""How many intra-op CPU threads the training loop runs with.

Torch starts with one intra-op thread per physical core. Eager updates of the built-in
networks are small matrix products (batch 256, 256 units): on a busy CPU each parallel region
waits for worker threads that other processes have pushed off their cores, and a busy 2-CPU
machine ran SAC's and TD3's updates 8-28x slower with two threads than with one
(``benchmarks/cpu_threads.py``; the table is in ``benchmarks/LOG.md``). One thread is the
robust default; a count the user chose is kept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

# The variables through which a user sets torch's thread count before it starts.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Torch's count when rl_graphstep was imported: a different count when training starts was
# set by the caller (torch.set_num_threads), and is kept.
_IMPORT_COUNT = torch.get_num_threads()


def user_chose_threads() -> bool:
    """Whether the thread count is the user's choice: an environment variable above, or
    ``torch.set_num_threads`` called since rl_graphstep was imported."""
    return (any(_positive_int(os.environ.get(name, "")) for name in THREAD_VARIABLES)
            or torch.get_num_threads() != _IMPORT_COUNT)


def _positive_int(text: str) -> bool:
    # OpenMP ignores any other value ("abc", "0") with a warning of its own, and torch then
    # starts with its default count: that was no choice of a count.
    return text.strip().isdigit() and int(text) > 0


def loop_thread_count(device: torch.device) -> int | None:
    """The intra-op thread count for training on ``device``; ``None`` keeps the current one.

    On CUDA always one: the host's torch work is a few tiny tensors. On the CPU one, unless
    the user chose a count (see ``user_chose_threads``)."""
    if device.type == "cuda":
        return 1
    return None if user_chose_threads() else 1


@contextlib.contextmanager
def loop_threads(device: torch.device) -> Iterator[None]:
    """One intra-op CPU thread while inside, unless on the CPU the user chose a count
    (:func:`loop_thread_count`); the process's count is restored after. On CUDA the host's
    torch work is a few tiny tensors, and idle worker threads made the loop's own Python and
    the env steps slower; on the CPU, idle workers spinning against other processes made
    the small eager updates several times slower on a busy machine (see benchmarks/)."""
    count = loop_thread_count(device)
    if count is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
