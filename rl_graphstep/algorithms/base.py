"""What every off-policy actor-critic shares: the two adaptation steps, their optimizers and
clipping, the target critic, the delayed actor schedule and the capture fallback.

An algorithm subclasses :class:`ActorCritic` and supplies its two losses, how it explores,
and what happens after each critic and actor update (target updates).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.buffer import BatchSampler, ReplayBuffer
from rl_graphstep.capture import capture_graph
from rl_graphstep.compiling import compile_now
from rl_graphstep.config import Config
from rl_graphstep.errors import CaptureError, CompileError
from rl_graphstep.graphstep import AdaptationStep, CudaGraphAdaptationStep, make_adaptation_step
from rl_graphstep.guards import clip_grad_norm
from rl_graphstep.metrics import MetricSums
from rl_graphstep.networks import EnsembleCritic, StateActionInput
from rl_graphstep.plugins import evaluation_action

# Fused update graphs are built for schedules that repeat within this many updates; a longer
# period (unusual frequencies) replays the separate graphs instead.
MAX_FUSED_PHASES = 16


class FusedUpdate(NamedTuple):
    """One phase's fused update graph, the live metrics it writes, their key set, and the
    metric sums it adds them into (None: it adds them nowhere)."""

    graph: Any
    metrics: dict[str, Tensor]
    keys: tuple[str, ...]
    adds_into: MetricSums | None


class PolyakAverage:
    """target <- (1 - tau) * target + tau * source for each (target, source) module pair, in
    place (a target is never re-created) and in one fused launch for all pairs.

    :meth:`compile` makes that launch one compiled kernel (``torch._foreach_lerp_`` runs as
    a multi-tensor kernel that took ~9 µs per call inside the update graph on an H200).
    """

    def __init__(self, pairs: list[tuple[nn.Module, nn.Module]], tau: float) -> None:
        self.targets = [p for target, _ in pairs for p in target.parameters()]
        self.sources = [p for _, source in pairs for p in source.parameters()]
        if len(self.targets) != len(self.sources):
            raise ValueError("each target network must have its source's parameters")
        self.tau = tau
        # The compiled form and its weight, a device tensor: 0 while it compiles.
        self._compiled: Callable[[Tensor], None] | None = None
        self._weight: Tensor | None = None

    def compile(self) -> None:
        """Compile the average now, outside any capture (compiling inside one would fail),
        so that a graph recording it later records the compiled kernel. Compiled once, by a
        call with weight 0, which leaves every finite target as it is. Where the compiler
        fails, the average stays as it was, with a warning."""
        if self._compiled is not None or not self.targets:
            return
        weight = torch.zeros((), device=self.targets[0].device, dtype=self.targets[0].dtype)
        with torch.no_grad():
            self._compiled = compile_now(self._step, weight, what="the target update")
        weight.fill_(self.tau)
        self._weight = weight

    def _step(self, weight: Tensor) -> None:
        """targets += weight * (sources - targets), the formula ``lerp`` uses for weights
        below 0.5, in foreach ops: ``_foreach_lerp_`` takes no tensor weight."""
        differences = torch._foreach_sub(self.sources, self.targets)
        torch._foreach_add_(self.targets, torch._foreach_mul(differences, weight))

    @torch.no_grad()
    def __call__(self) -> None:
        if self._compiled is not None:
            self._compiled(self._weight)
        else:
            torch._foreach_lerp_(self.targets, self.sources, self.tau)


class ActorCritic:
    """The shared machinery of SAC, TD3 and DDPG.

    Each ``update(rows)`` runs one critic step on a replay sample and, every
    ``policy_frequency`` updates, ``actor_updates_per_delay`` actor steps; ``update_from(buffer)``
    does the same on a sample drawn straight into the steps (the training loop's fast path).
    The steps are captured (or wrapped eagerly) on the first update, from that first sample;
    with ``use_graph=None`` a step that cannot be captured falls back to eager with a warning,
    and with ``compile=None`` one that cannot be compiled runs uncompiled.

    Subclasses set ``actor_optimizer`` before calling ``update`` and implement
    ``critic_loss``, ``actor_loss``, ``explore`` and the two hooks.
    """

    name: ClassVar[str]
    actor_kind: ClassVar[str]  # "stochastic" (action, log_prob) or "deterministic" (action)
    num_critics: ClassVar[int] = 2
    actor_updates_per_delay: ClassVar[int] = 1

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        cfg: Config,
        *,
        observation_size: int,
        action_size: int,
        device: torch.device,
        use_graph: bool | None = None,
        compile: bool | None = False,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.observation_size = observation_size
        self.action_size = action_size
        self.actor = actor.to(device)
        # The actor that acts (explore): the learned one, or a copy of it refreshed before
        # each action, so acting can run beside an update (see separate_behaviour_actor).
        self.behaviour_actor: nn.Module = self.actor
        self.critic = critic.to(device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.use_graph = device.type == "cuda" if use_graph is None else use_graph
        self.graph_fallback = use_graph is None
        self.capturable = device.type == "cuda"
        # torch.compile of the step bodies; `None`: compiled, and uncompiled (with a warning)
        # when compiling fails.
        self.compile = True if compile is None else compile
        self.compile_fallback = compile is None

        self.critic_optimizer = self.adam(self.critic.parameters(), lr=cfg.q_lr)
        self.actor_optimizer: torch.optim.Optimizer
        self.critic_clip = clip_grad_norm(self.critic.parameters(), cfg.critic_max_grad_norm)
        self.actor_clip = clip_grad_norm(self.actor.parameters(), cfg.actor_max_grad_norm)
        # Written in place by actor_loss (inside a graph, too), read by the logger.
        self.actor_loss_value = torch.zeros((), device=device)
        self.critic_step: AdaptationStep | None = None
        self.actor_step: AdaptationStep | None = None
        self.sampler: BatchSampler | None = None
        # One per phase of the update schedule; see update_from.
        self.fused_updates: list[FusedUpdate] | None = None
        # Where update_from adds its metrics (bound by build); None: nowhere.
        self.metric_sums: MetricSums | None = None
        self.updates = 0

    def adam(self, params: Any, **kwargs: Any) -> torch.optim.Adam:
        """Adam as the steps need it: on CUDA capturable (a graph reads its step count from
        the device) and, uncompiled, fused: one kernel instead of a dozen. Compiled, the
        foreach form is fused by the compiler instead, and measured faster (the fused kernel
        took 24 µs per call on an H200, the compiled update as a whole 30 µs less)."""
        fused = self.capturable and not self.compile
        return torch.optim.Adam(params, capturable=self.capturable, fused=fused or None,
                                **kwargs)

    @classmethod
    def default_critic(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                       cfg: Config) -> nn.Module:
        return EnsembleCritic(observation_space, action_space, cfg.hidden_sizes,
                              num_critics=cls.num_critics)

    # ---------------------------------------------------------------- what subclasses supply

    def critic_loss(self, q_values: Tensor, targets: Tensor) -> Tensor:
        """The TD loss; ``targets`` are packed rows ``[reward | not_done | next_obs]``."""
        raise NotImplementedError

    def actor_loss(self, prediction: Tensor | tuple[Tensor, Tensor], observations: Tensor
                   ) -> Tensor:
        raise NotImplementedError

    def explore(self, observations: Tensor, noise: Tensor | None = None) -> Tensor:
        """Actions in [-1, 1] to take in the environment while learning, from
        ``behaviour_actor``. ``noise`` (B, :meth:`exploration_noise_size`), a standard normal
        draw made by the caller, replaces the one made on the device."""
        raise NotImplementedError

    def exploration_noise_size(self) -> int:
        """Columns of the standard normal noise :meth:`explore` can take from its caller; 0
        when it draws its own (then acting draws on the device)."""
        return 0

    def separate_behaviour_actor(self) -> tuple[list[Tensor], list[Tensor]]:
        """Let a copy of the actor act from now on; return the copy's tensors and the actor's,
        in pairs, for filling the copy before each action (``ActionPipe`` fills it with the
        actor as it was one request earlier). An action then reads the copy while an update
        rewrites the actor, so the two can run at once on two streams."""
        if self.behaviour_actor is self.actor:
            self.behaviour_actor = copy.deepcopy(self.actor).requires_grad_(False)
            for parameter in self.behaviour_actor.parameters():
                parameter.grad = None  # the copy never learns: no gradient buffers
        originals = [*self.actor.parameters(), *self.actor.buffers()]
        copies = [*self.behaviour_actor.parameters(), *self.behaviour_actor.buffers()]
        return copies, originals

    def after_critic_update(self) -> None:
        """Called after every critic step (e.g. a target update)."""

    def after_actor_updates(self) -> None:
        """Called after each round of delayed actor steps (e.g. target updates)."""

    def frozen_critic(self, observations: Tensor, actions: Tensor) -> Tensor:
        """The critic as a function of its inputs alone, for the actor's loss: its parameters
        enter detached, so the actor's backward computes no critic weight gradients (a
        compiled backward would compute them and throw them away)."""
        detached = {name: t.detach() for name, t in (*self.critic.named_parameters(),
                                                      *self.critic.named_buffers())}
        return torch.func.functional_call(self.critic, detached, (observations, actions))

    def actor_metrics(self) -> dict[str, Tensor]:
        return {"losses/actor": self.actor_loss_value,
                "losses/actor_grad_norm": self.actor_clip.norm}

    # ---------------------------------------------------------------- the shared update

    def _make_steps(self, rows: Tensor, use_graph: bool, compile: bool) -> None:
        split = self.observation_size + self.action_size
        observations = rows[:, : self.observation_size]
        self.critic_step = make_adaptation_step(
            StateActionInput(self.critic, self.observation_size), self.critic_optimizer,
            rows[:, :split], rows[:, split:], self.critic_loss,
            use_graph=use_graph, gradient_transform=self.critic_clip, skip_nonfinite=True,
            compile=compile,
        )
        self.actor_step = make_adaptation_step(
            self.actor, self.actor_optimizer, observations, observations, self.actor_loss,
            use_graph=use_graph, gradient_transform=self.actor_clip, skip_nonfinite=True,
            pool=getattr(self.critic_step, "pool", None), compile=compile,
        )

    def capture(self, rows: Tensor) -> None:
        """Build both steps from an example batch. Where allowed (``None`` settings), a step
        that cannot be compiled runs uncompiled and one that cannot be captured runs eagerly
        (and uncompiled: eagerly, a compiler failure would surface mid-run), each with a
        one-line warning."""
        while True:
            try:
                self._make_steps(rows, self.use_graph, self.compile)
                break
            except CaptureError as error:
                self.critic_step = self.actor_step = None
                if isinstance(error, CompileError) and self.compile and self.compile_fallback:
                    warnings.warn(f"{error}; running the updates uncompiled instead",
                                  stacklevel=2)
                    self.compile = False
                elif (not isinstance(error, CompileError) and self.use_graph
                      and self.graph_fallback):
                    warnings.warn(f"{error}; running the updates eagerly instead", stacklevel=2)
                    self.use_graph = False
                    self.compile = self.compile and not self.compile_fallback
                else:
                    raise
        if self.compile:
            # Before any graph records them (the fused updates do).
            for average in self.target_averages():
                average.compile()

    def target_averages(self) -> list[PolyakAverage]:
        """The target updates this agent holds (its :class:`PolyakAverage` attributes)."""
        return [value for value in vars(self).values() if isinstance(value, PolyakAverage)]

    def _static_columns(self) -> list[tuple[Tensor, slice]]:
        """Where each column range of a packed replay row goes: the steps' static buffers."""
        assert self.critic_step is not None and self.actor_step is not None
        observations = slice(0, self.observation_size)
        split = self.observation_size + self.action_size
        return [
            (self.critic_step.static_inputs, slice(0, split)),
            (self.critic_step.static_targets, slice(split, None)),
            (self.actor_step.static_inputs, observations),
            (self.actor_step.static_targets, observations),
        ]

    def update(self, rows: Tensor) -> dict[str, Tensor]:
        """One critic step on ``rows`` (packed replay rows) and, every ``policy_frequency``
        updates, the delayed actor steps. Returns device tensors to log; no host sync."""
        if self.critic_step is None or self.actor_step is None:
            self.capture(rows)
        columns = self._static_columns()
        if rows.shape[0] != columns[0][0].shape[0]:
            raise ValueError(f"rows has {rows.shape[0]} rows, the steps were built for "
                             f"{columns[0][0].shape[0]} (a captured step has a fixed shape)")
        for step in (self.critic_step, self.actor_step):
            if isinstance(step, CudaGraphAdaptationStep):
                step.check_layout()
        with torch.no_grad():
            torch._foreach_copy_([t for t, _ in columns], [rows[:, c] for _, c in columns])
        return self._replay_steps()

    def update_from(self, buffer: ReplayBuffer) -> dict[str, Tensor]:
        """:meth:`update` on a fresh replay sample drawn straight into the steps' static
        buffers: the training loop's fast path. With CUDA graphs the whole update (sampling,
        critic step, target update, actor steps when due) is one fused graph per phase of
        the update schedule: one launch per update.

        Its metrics are live tensors that the next update overwrites: copy them at once if
        you keep them. Where :meth:`build` bound ``metrics``, they are also added into
        those sums, by the fused graph itself where there is one."""
        self.build(buffer)
        assert self.sampler is not None
        sums = self.metric_sums
        if self.fused_updates is not None:
            fused = self.fused_updates[self.updates % len(self.fused_updates)]
            fused.graph.replay()
            self.updates += 1
            if sums is not None:
                if fused.adds_into is sums:
                    sums.count(fused.keys)
                else:
                    sums.add(fused.metrics)
            return fused.metrics
        self.sampler()
        metrics = self._replay_steps(live=True)
        if sums is not None:
            sums.add(metrics)
        return metrics

    def update_period(self) -> int | None:
        """The number of updates after which the update sequence repeats: ``after_*`` hooks
        and the actor delay may depend on ``self.updates`` only modulo this period. ``None``
        when they depend on it otherwise (no fused update graphs are built then)."""
        return math.lcm(self.cfg.policy_frequency, self.cfg.target_network_frequency)

    def build(self, buffer: ReplayBuffer, *, fuse: bool = True,
              metrics: MetricSums | None = None) -> None:
        """Capture the steps (from an example sample) and the sampling from ``buffer``, if
        not done yet; runs no update. With CUDA graphs and ``fuse``, also capture the fused
        update graphs :meth:`update_from` replays (see :meth:`update_period`).

        ``metrics`` binds the sums :meth:`update_from` adds each update's metrics into (the
        training loop passes its logger's); the fused graphs then make the add themselves.
        Bind them at the first build: graphs built before keep adding nowhere."""
        if metrics is not None:
            self.metric_sums = metrics
        if self.sampler is not None and self.sampler.buffer is buffer:
            return
        if self.critic_step is None or self.actor_step is None:
            # The first rows as the example: drawing one would consume random numbers, and a
            # resumed run must draw exactly what the uninterrupted one would.
            if len(buffer) < self.cfg.batch_size:
                raise RuntimeError(f"the replay buffer holds {len(buffer)} rows, fewer than "
                                   f"one batch ({self.cfg.batch_size})")
            self.capture(buffer.storage[: self.cfg.batch_size])
        self.sampler = BatchSampler(buffer, self.cfg.batch_size, self._static_columns(),
                                    use_graph=self.use_graph)
        self.fused_updates = None
        period = self.update_period()
        if fuse and self.use_graph and period is not None and period <= MAX_FUSED_PHASES:
            try:
                self.fused_updates = self._capture_fused_updates(period)
            except CaptureError as error:  # the separate graphs work: keep those
                warnings.warn(f"{error}; replaying the separate step graphs instead",
                              stacklevel=2)

    def _capture_fused_updates(self, period: int) -> list[FusedUpdate]:
        """One graph per phase of the update schedule, each recording the sampling and the
        steps' updates in the order :meth:`_replay_steps` replays them: the same kernels in
        the same order, with one launch (and one random-number offset update) per update
        instead of one per graph and per target update. With bound metric sums, the graph
        also adds its metrics into them: no launch of its own for the logging."""
        assert self.sampler is not None
        assert self.critic_step is not None and self.actor_step is not None
        sampler, critic, actor = self.sampler, self.critic_step, self.actor_step
        sums = self.metric_sums

        def fused_update(add: bool) -> dict[str, Tensor]:
            sampler.draw()
            metrics = self._update_sequence(critic.run_update, actor.run_update)
            if add:
                assert sums is not None
                sums.add_on_device(metrics)
            return metrics

        def capture(phase: int, add: bool) -> tuple[Any, dict[str, Tensor]]:
            return capture_graph(lambda: fused_update(add), self.device, warmup_steps=0,
                                 what=f"the fused update (phase {phase})")

        updates = self.updates
        fused = []
        try:
            for phase in range(period):
                self.updates = phase  # the hooks take this phase's branches
                graph, metrics = capture(phase, add=False)
                if sums is None:
                    fused.append(FusedUpdate(graph, metrics, tuple(metrics), None))
                    continue
                # That capture named the phase's metrics: their sums must exist before the
                # graph that adds into them is recorded (made inside, they would be reset on
                # every replay). Capturing records only, so recording again is free of effects.
                keys = sums.prepare(metrics)
                del graph, metrics
                graph, metrics = capture(phase, add=True)
                fused.append(FusedUpdate(graph, metrics, keys, sums))
        finally:
            self.updates = updates
        return fused

    def _update_sequence(self, critic: Callable[[], Tensor], actor: Callable[[], Any]
                         ) -> dict[str, Tensor]:
        """One update: the critic step and its hook, and when the delay is due the actor
        steps and theirs. ``critic`` and ``actor`` run one step each (replay, or record)."""
        metrics = {
            "losses/critic": critic(),
            "losses/critic_grad_norm": self.critic_clip.norm,
        }
        self.after_critic_update()
        # The delay is a host-side counter: a skipped actor step costs nothing, where a
        # device-side mask would run (and discard) the whole actor update every iteration.
        if self.updates % self.cfg.policy_frequency == 0:
            for _ in range(self.actor_updates_per_delay):
                actor()
            self.after_actor_updates()
            metrics.update(self.actor_metrics())
        return metrics

    def _replay_steps(self, live: bool = False) -> dict[str, Tensor]:
        assert self.critic_step is not None and self.actor_step is not None
        critic_step = self.critic_step

        def critic() -> Tensor:
            if live:  # the step's own loss tensor: read it before the next update
                critic_step.replay()
                return critic_step.static_loss
            return critic_step.replay()

        metrics = self._update_sequence(critic, self.actor_step.replay)
        self.updates += 1
        return metrics

    # ---------------------------------------------------------------- checkpoints

    def checkpointed(self) -> dict[str, Any]:
        """Everything that defines the agent's learning state, by name."""
        parts: dict[str, Any] = {
            "actor": self.actor, "critic": self.critic, "target_critic": self.target_critic,
            "actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer,
        }
        for name in ("target_actor", "log_alpha"):
            if hasattr(self, name):
                parts[name] = getattr(self, name)
        return parts

    def state_dict(self) -> dict[str, Any]:
        state = {name: part.detach().clone() if isinstance(part, Tensor) else part.state_dict()
                 for name, part in self.checkpointed().items()}
        return {**state, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load before the first update: the steps are captured after it, from these values
        (a captured optimizer must never be given new state tensors)."""
        if self.critic_step is not None or self.actor_step is not None:
            raise RuntimeError("load the agent's state before its steps are built")
        for name, part in self.checkpointed().items():
            if isinstance(part, Tensor):
                with torch.no_grad():
                    part.copy_(state[name])
            else:
                part.load_state_dict(state[name])
        self.updates = int(state["updates"])

    def skipped_updates(self) -> tuple[Tensor, Tensor]:
        """(total, longest current run) of updates skipped for non-finite values, on the
        device; zeros before the steps exist."""
        guards = [s.guard for s in (self.critic_step, self.actor_step)
                  if s is not None and s.guard is not None]
        if not guards:
            zero = torch.zeros((), dtype=torch.int64, device=self.device)
            return zero, zero
        return (torch.stack([g.skipped for g in guards]).sum(),
                torch.stack([g.consecutive for g in guards]).max())

    @torch.no_grad()
    def deterministic_action(self, observations: Tensor) -> Tensor:
        """The policy's action without exploration, in [-1, 1] (for evaluation); see
        ``rl_graphstep.plugins.evaluation_action`` for actors without ``deterministic_action``."""
        return evaluation_action(self.actor, self.actor_kind, observations)
