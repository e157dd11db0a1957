"""The fused update: one CUDA graph per phase of the update schedule, recorded from the two
adaptation steps' bodies, so that an update is one launch.

This is what the learner replays. The separate step graphs (``CudaGraphAdaptationStep``)
run the same kernels one graph at a time: a replay sample, the critic step, the target update
and the actor steps are four to six launches, each with its own random-number offset update,
so they are kept as the fallback. The fused graph records the same kernels in the same order,
and also adds the update's metrics into the log's sums.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rl_graphstep.core.capture import capture_graph
from rl_graphstep.learners.metrics import MetricSums

# Fused graphs are built for schedules that repeat within this many updates; a longer period
# (unusual frequencies) replays the separate step graphs instead.
MAX_PHASES = 16


class FusedUpdate:
    """The update of each phase ``update % period`` as one graph.

    Args:
        record: ``record(update)`` runs one whole update as ordinary launches (sampling,
            critic step, target update, actor steps when due) and returns its metrics; called
            once per phase, inside the capture.
        announced: ``announced(update)``, the metrics ``record`` returns (any tensors of their
            shapes, in their order), known before the capture so that their sums exist
            before a graph adds into them.
        period: the schedule's period.
        sums: where each replay adds its metrics.
        device: the CUDA device.
    """

    def __init__(self, record: Callable[[int], dict[str, Tensor]],
                 announced: Callable[[int], dict[str, Tensor]], period: int,
                 sums: MetricSums, device: torch.device) -> None:
        self.sums = sums
        self.phases: list[tuple[torch.cuda.CUDAGraph, tuple[str, ...]]] = []
        self.metrics: list[dict[str, Tensor]] = []
        for phase in range(period):
            keys = sums.prepare(announced(phase))

            def update(phase: int = phase, keys: tuple[str, ...] = keys) -> dict[str, Tensor]:
                metrics = record(phase)
                # Checked before the add, which would fail on unknown keys less clearly.
                if tuple(metrics) != keys:
                    raise RuntimeError(f"the fused update's metrics {tuple(metrics)} are not "
                                       f"the keys announced for it, {keys}")
                sums.add_on_device(metrics)
                return metrics

            graph, metrics = capture_graph(update, device, warmup_steps=0,
                                           what=f"the fused update (phase {phase})")
            self.phases.append((graph, keys))
            # The graph's outputs: each replay rewrites them.
            self.metrics.append(metrics)

    def replay(self, update: int) -> None:
        """Run update number ``update``: one launch; its metrics land in the sums."""
        graph, keys = self.phases[update % len(self.phases)]
        graph.replay()
        self.sums.count(keys)
