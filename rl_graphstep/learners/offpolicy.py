"""The off-policy learner: runs an algorithm's updates from a replay buffer on the device.

It owns the two ``CudaGraphAdaptationStep``s (critic and actor) with their optimizers and
gradient-norm clips, the replay sampling, the fused update, the non-finite skip counters and
its checkpoint state. With CUDA graphs what runs each update is the fused graph of its phase,
recorded from the two steps' bodies (one launch); the steps' own graphs replay, one after the
other, only where no fused graph could be built. The algorithm owns the losses and the
schedule (``rl_graphstep.algorithms``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.base import Metrics, OffPolicyAlgorithm
from rl_graphstep.core.errors import CaptureError
from rl_graphstep.core.guards import clip_grad_norm
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.rows import RowLayout
from rl_graphstep.data.sampler import BatchSampler
from rl_graphstep.graphstep import AdaptationStep, make_adaptation_step
from rl_graphstep.learners.fused import MAX_PHASES, FusedUpdate
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.learners.steps import RecordedLoss, StepPair
from rl_graphstep.networks.builtin import StateActionInput
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import RunPlan


class JointCriticInput(nn.Module):
    """The critic step's module for an algorithm with a joint critic forward: from the whole
    replay rows ``[s | a | r | not_done | s']`` (its inputs), the algorithm's
    :meth:`~rl_graphstep.algorithms.base.OffPolicyAlgorithm.joint_prediction`, the critic at
    (s, a) and (s', a') in one forward. Its parameters and buffers are the critic's alone: the
    actor that draws a' is read, not trained, here."""

    def __init__(self, algorithm: OffPolicyAlgorithm, layout: RowLayout) -> None:
        super().__init__()
        self.critic = algorithm.critic
        self.__dict__["algorithm"] = algorithm  # not a submodule: its actor is not the step's
        self.layout = layout

    def _get_name(self) -> str:
        return f"{self.critic._get_name()} (joint forward)"

    def forward(self, rows: Tensor) -> Any:
        layout = self.layout
        return self.algorithm.joint_prediction(rows[..., layout.observations],
                                               rows[..., layout.actions],
                                               rows[..., layout.next_observations])


class OffPolicyLearner(StepPair):
    """One update = a replay sample, a critic step, the algorithm's target update and, when
    its schedule says so, actor steps.

    :meth:`build` captures the steps (or wraps them eagerly, as ``plan`` says) from the
    buffer's first rows and, with CUDA graphs, the fused update; :meth:`update` then runs
    the iteration's ``updates_per_step`` updates with no host sync, adding their metrics
    into the log's sums.
    """

    def __init__(self, algorithm: OffPolicyAlgorithm, buffer: ReplayBuffer, cfg: Config,
                 plan: RunPlan) -> None:
        self.algorithm = algorithm
        self.buffer = buffer
        self.cfg = cfg
        self.plan = plan
        self.device = plan.device
        # K seeds stacked on a leading dimension of everything the update touches.
        self.seeds = cfg.num_seeds
        settings = algorithm.optimizer_settings()
        self.critic_optimizer = self._adam(algorithm.critic.parameters(), lr=cfg.q_lr,
                                           **settings)
        self.actor_optimizer = self._adam(algorithm.actor_parameter_groups(), **settings)
        self.critic_clip = clip_grad_norm(algorithm.critic.parameters(),
                                          cfg.critic_max_grad_norm, seeds=self.seeds)
        self.actor_clip = clip_grad_norm(algorithm.actor.parameters(), cfg.actor_max_grad_norm,
                                         seeds=self.seeds)
        self.critic_loss = RecordedLoss(algorithm.critic_loss, buffer.layout.split_targets)
        self.actor_loss = RecordedLoss(algorithm.actor_loss, lambda observations: observations)
        self.critic_step: AdaptationStep | None = None
        self.actor_step: AdaptationStep | None = None
        self.sampler: BatchSampler | None = None
        self.fused: FusedUpdate | None = None
        self.sums: MetricSums | None = None
        self.updates = 0  # updates made over the whole run (a resumed one included)

    def _adam(self, params: Any, **kwargs: Any) -> torch.optim.Adam:
        """Adam as the steps need it: on CUDA capturable (a graph reads its step count from
        the device) and, uncompiled, fused (one kernel instead of a dozen). Compiled, the
        foreach form is fused by the compiler instead, and measured faster. With
        ``--weight-decay`` > 0 it is AdamW with that decoupled decay (a parameter group that
        sets its own ``weight_decay``, SAC's temperature, keeps it)."""
        capturable = self.device.type == "cuda"
        fused = capturable and not self.plan.compile
        if self.cfg.weight_decay > 0:
            return torch.optim.AdamW(params, capturable=capturable, fused=fused or None,
                                     weight_decay=self.cfg.weight_decay, **kwargs)
        return torch.optim.Adam(params, capturable=capturable, fused=fused or None, **kwargs)

    @property
    def built(self) -> bool:
        return self.sampler is not None

    # ------------------------------------------------------------------ building

    def build(self, sums: MetricSums, *, fuse: bool = True) -> RunPlan:
        """Capture the steps, the sampling and (with CUDA graphs and ``fuse``) the fused
        update; runs no update. A step that cannot be captured or compiled falls back as the
        plan allows (``plan.fall_back``). Returns the plan that holds; every update adds its
        metrics into ``sums``."""
        if len(self.buffer) < self.cfg.batch_size:
            raise RuntimeError(f"the replay buffer holds {len(self.buffer)} rows, fewer than "
                               f"one batch ({self.cfg.batch_size})")
        self.sums = sums
        # The first rows as the example: drawing a sample would consume random numbers, and
        # a resumed run must draw exactly what the uninterrupted one would.
        batch = self.cfg.batch_size
        rows = self.buffer.storage[:batch] if self.seeds == 1 else self.buffer.storage[:, :batch]
        self._build_steps(rows)
        if self.plan.compile and self.algorithm.polyak is not None:
            self.algorithm.polyak.compile()  # before any graph records it
        assert self.critic_step is not None and self.actor_step is not None
        layout = self.buffer.layout
        self.sampler = BatchSampler(self.buffer, self.cfg.batch_size, [
            (self.critic_step.static_inputs, self._critic_inputs()),
            (self.critic_step.static_targets, layout.critic_targets),
            (self.actor_step.static_inputs, layout.observations),
            (self.actor_step.static_targets, layout.observations),
        ], use_graph=self.plan.graphs)
        period = self.algorithm.update_period()
        if fuse and self.plan.graphs and period <= MAX_PHASES:
            try:
                self.fused = FusedUpdate(self._record_update, self._announced_metrics, period,
                                         sums, self.device)
            except CaptureError as error:  # the separate graphs work: keep those
                warnings.warn(f"{error}; replaying the separate step graphs instead",
                              stacklevel=2)
        return self.plan

    def _make_steps(self, rows: Tensor) -> None:
        layout, algorithm = self.buffer.layout, self.algorithm
        observations = rows[..., layout.observations]
        settings = {"use_graph": self.plan.graphs, "compile": self.plan.compile,
                    "skip_nonfinite": True, "seeds": self.seeds}
        critic = (JointCriticInput(algorithm, layout) if algorithm.joint_critic_forward
                  else StateActionInput(algorithm.critic, layout.observation_size))
        self.critic_step = make_adaptation_step(
            critic, self.critic_optimizer, rows[..., self._critic_inputs()],
            rows[..., layout.critic_targets], self.critic_loss,
            gradient_transform=self.critic_clip, **settings)
        self.actor_step = make_adaptation_step(
            algorithm.actor_step_module(), self.actor_optimizer, observations, observations,
            self.actor_loss, gradient_transform=self.actor_clip,
            pool=getattr(self.critic_step, "pool", None), **settings)

    def _critic_inputs(self) -> slice:
        """The row columns the critic step's module reads: ``[s | a]``, or the whole row for
        a joint forward (which needs s')."""
        layout = self.buffer.layout
        return (slice(0, layout.row_size) if self.algorithm.joint_critic_forward
                else layout.critic_inputs)

    # ------------------------------------------------------------------ updating

    def update(self) -> None:
        """The iteration's ``updates_per_step`` updates, each from a fresh replay sample."""
        for _ in range(self.cfg.updates_per_step):
            if self.fused is not None:
                self.fused.replay(self.updates)
            else:
                assert self.sampler is not None and self.sums is not None
                self.sampler()
                self.sums.add(self._replay_update(self.updates))
            self.updates += 1

    def _replay_update(self, update: int) -> Metrics:
        """Update number ``update`` from the sample in the steps' buffers, step by step."""
        assert self.critic_step is not None and self.actor_step is not None
        critic_step = self.critic_step

        def critic() -> Tensor:
            critic_step.replay()
            return critic_step.static_loss  # live: the next update rewrites it

        return self._update_sequence(update, critic, self.actor_step.replay)

    def _record_update(self, update: int) -> Metrics:
        """Update number ``update`` as ordinary launches (recorded by the fused capture)."""
        assert self.sampler is not None
        assert self.critic_step is not None and self.actor_step is not None
        self.sampler.draw()
        return self._update_sequence(update, self.critic_step.run_update,
                                     self.actor_step.run_update)

    def _update_sequence(self, update: int, critic: Callable[[], Tensor],
                         actor: Callable[[], Any]) -> Metrics:
        """The critic step and the algorithm's hook after it; then, when the schedule says
        so, the actor steps and the hook after them. The schedule is read on the host: a
        skipped actor step costs nothing, where a device-side mask would run (and discard)
        the whole actor update every time."""
        critic_loss = critic()
        self.algorithm.after_critic_step(update)
        actor_steps = self.algorithm.actor_steps(update)
        for _ in range(actor_steps):
            actor()
        if actor_steps:
            self.algorithm.after_actor_steps(update)
        return self._metrics(critic_loss, actor_steps > 0)

    def _metrics(self, critic_loss: Tensor, actor_stepped: bool) -> Metrics:
        metrics = {"losses/critic": critic_loss, **self.critic_loss.values,
                   "losses/critic_grad_norm": self.critic_clip.norm}
        if actor_stepped:
            metrics.update(self.actor_loss.values)
            metrics["losses/actor_grad_norm"] = self.actor_clip.norm
        return metrics

    def _announced_metrics(self, update: int) -> Metrics:
        """The metrics update number ``update`` reports, without running it."""
        assert self.critic_step is not None
        return self._metrics(self.critic_step.static_loss,
                             self.algorithm.actor_steps(update) > 0)

    # ------------------------------------------------------------------ counters

    def steps_made(self, updates: int) -> dict[str, int]:
        """The critic and actor steps of the first ``updates`` updates, over all seeds."""
        period = self.algorithm.update_period()
        per_period = sum(self.algorithm.actor_steps(u) for u in range(period))
        whole, rest = divmod(updates, period)
        actor = whole * per_period + sum(self.algorithm.actor_steps(u) for u in range(rest))
        return {"critic": updates * self.seeds, "actor": actor * self.seeds}

    # ------------------------------------------------------------------ checkpoints

    def _learning_state(self) -> dict[str, Any]:
        algorithm = self.algorithm
        return {"actor": algorithm.actor, "critic": algorithm.critic,
                **algorithm.learning_state(),
                "actor_optimizer": self.actor_optimizer,
                "critic_optimizer": self.critic_optimizer}

    def state_dict(self) -> dict[str, Any]:
        state = {name: part.detach().clone() if isinstance(part, Tensor) else part.state_dict()
                 for name, part in self._learning_state().items()}
        return {**state, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load before :meth:`build`: the steps are captured after it, from these values (a
        captured optimizer must never be given new state tensors)."""
        if self.critic_step is not None or self.actor_step is not None:
            raise RuntimeError("load the learner's state before its steps are built")
        for name, part in self._learning_state().items():
            if isinstance(part, Tensor):
                with torch.no_grad():
                    part.copy_(state[name])
            elif isinstance(part, torch.optim.Optimizer):
                part.load_state_dict(_with_settings_of(part, state[name]))
            else:
                part.load_state_dict(state[name])
        self.algorithm.after_load()
        self.updates = int(state["updates"])


def _with_settings_of(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` (an optimizer's state dict) with the settings of ``optimizer``'s groups in
    place of its own: torch's ``load_state_dict`` takes every group setting from the saved
    one, so a resumed run would keep its old learning rates whatever its config says (and
    ``capturable``/``fused`` of the device it was trained on). Only the moments and step
    counts are the run's. Groups that do not match are left for torch to refuse."""
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        return saved
    own = [{k: v for k, v in group.items() if k not in ("params", "param_names")}
           for group in optimizer.param_groups]
    return {**saved, "param_groups": [{**group, **settings}
                                      for group, settings in zip(groups, own, strict=True)]}
