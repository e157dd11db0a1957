"""What both learners share about their two adaptation steps (the critic's and the actor's):
losses that record their metrics for the captured graphs, building the steps with the run
plan's fallbacks, and the steps' counts of what their non-finite guards skipped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rl_graphstep.algorithms.base import Metrics
from rl_graphstep.core.errors import CaptureError
from rl_graphstep.graphstep import AdaptationStep
from rl_graphstep.settings.plan import RunPlan, fall_back


class RecordedLoss:
    """A step's ``loss_function`` made from an algorithm's loss, which returns ``(loss,
    metrics)``: each metric is written in place into a tensor of its own (made at the first
    call, before any capture), which a captured graph then rewrites on every replay."""

    def __init__(self, loss: Callable[[Any, Any], tuple[Tensor, Metrics]],
                 targets: Callable[[Tensor], Any]) -> None:
        self.loss = loss
        self.targets = targets
        self.values: Metrics = {}
        self.__qualname__ = getattr(loss, "__qualname__", type(loss).__name__)

    def __call__(self, prediction: Any, targets: Tensor) -> Tensor:
        loss, metrics = self.loss(prediction, self.targets(targets))
        for name, value in metrics.items():
            kept = self.values.get(name)
            if kept is None:
                self.values[name] = value.detach().clone()
            else:
                kept.copy_(value.detach())
        return loss


class StepPair:
    """A learner's ``critic_step`` and ``actor_step`` (None until built), on its ``device``,
    as its ``plan`` runs them: built by the learner's ``_make_steps``, and counted."""

    critic_step: AdaptationStep | None
    actor_step: AdaptationStep | None
    device: torch.device
    plan: RunPlan

    def _make_steps(self, rows: Tensor) -> None:
        raise NotImplementedError

    def _build_steps(self, rows: Tensor) -> None:
        """The two steps from the example ``rows``; a step that cannot be captured (or
        compiled) falls back as the plan allows (``plan.fall_back``), and both are built
        again under the plan that holds."""
        while True:
            try:
                self._make_steps(rows)
                return
            except CaptureError as error:
                self.critic_step = self.actor_step = None
                self.plan = fall_back(self.plan, error)

    def skipped_updates(self) -> tuple[Tensor, Tensor]:
        """(total, longest current run) of steps skipped for non-finite values, on the
        device; zeros before the steps exist."""
        guards = [s.guard for s in (self.critic_step, self.actor_step)
                  if s is not None and s.guard is not None]
        if not guards:
            zero = torch.zeros((), dtype=torch.int64, device=self.device)
            return zero, zero
        return (torch.stack([g.skipped for g in guards]).sum(),
                torch.stack([g.consecutive for g in guards]).max())

    def skipped_steps(self) -> dict[str, int]:
        """Critic and actor steps skipped in this process, by kind, over all seeds (reads
        the device)."""
        counts = {}
        for kind, step in (("critic", self.critic_step), ("actor", self.actor_step)):
            guard = None if step is None else step.guard
            counts[kind] = 0 if guard is None else int(guard.skipped.sum().item())
        return counts
