"""The sampler that draws replay batches straight into a step's fixed inputs."""

from __future__ import annotations

import torch

from rl_graphstep.core.capture import capture_graph
from rl_graphstep.data.buffer import ReplayBuffer

__all__ = ["BatchSampler"]


class BatchSampler:
    """One replay sample per call, written straight into fixed tensors (a step's static
    inputs and targets), so nothing is copied or gathered in Python between steps.

    Args:
        buffer: the replay buffer to draw from (uniformly, with replacement).
        batch_size: rows per sample.
        outputs: ``(tensor, columns)`` pairs: each ``tensor`` (batch_size, width) receives the
            sample's ``columns`` (a slice of the packed row); with a buffer of K seeds each
            is (K, batch_size, width), seed k's sample in row k.
        use_graph: capture the draw as a CUDA graph (the buffer must be on CUDA): one launch
            per sample, reading the buffer's current fill level from its device tensor.
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        batch_size: int,
        outputs: list[tuple[torch.Tensor, slice]],
        *,
        use_graph: bool = False,
    ) -> None:
        if len(buffer) == 0:
            raise RuntimeError("cannot sample from an empty replay buffer; add transitions first")
        self.buffer = buffer
        self.batch_size = batch_size
        seeds = () if buffer.seeds == 1 else (buffer.seeds,)
        self.rows = torch.empty(*seeds, batch_size, buffer.row_size, dtype=buffer.dtype,
                                device=buffer.device)
        self._outputs = [tensor for tensor, _ in outputs]
        self._columns = [self.rows[..., columns] for _, columns in outputs]
        for tensor, column in zip(self._outputs, self._columns, strict=True):
            if tensor.shape != column.shape or tensor.device != self.rows.device:
                raise ValueError(
                    f"sample output of shape {tuple(tensor.shape)} on {tensor.device} does not "
                    f"match its columns, {tuple(column.shape)} on {self.rows.device}"
                )
        # With --obs-norm the sample's observations and next observations, normalised in
        # place before they are copied out (raw in the ring; part of any captured draw).
        self._normalizer, layout = buffer.normalizer, buffer.layout
        self._normalized = [self.rows[..., layout.observations],
                            self.rows[..., layout.next_observations]]
        self.graph = (capture_graph(self.draw, self.rows.device, what="the replay sampling")[0]
                      if use_graph else None)

    def draw(self) -> None:
        """Draw a new sample into the outputs as ordinary launches, not as the graph (inside
        another capture, this records the sampling into that graph)."""
        self.buffer.sample(self.batch_size, out=self.rows)
        if self._normalizer is not None:
            for columns in self._normalized:
                self._normalizer.normalize_(columns)
        torch._foreach_copy_(self._outputs, self._columns)

    def __call__(self) -> None:
        """Draw a new sample into the outputs."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self.draw()
