"""The on-policy learner: PPO's update of a filled rollout on the device.

One update = GAE over the rollout, then ``update_epochs`` epochs, each a fresh random
permutation (drawn on the device) cut into ``num_minibatches`` minibatches; a minibatch is
gathered by index into the steps' fixed buffers, then the actor step and the critic step run,
each an adaptation step (a CUDA graph, or its eager twin) with its own Adam and gradient-norm
clip. As CleanRL's one ``clip_grad_norm_`` over both networks, the clips share one norm: the
critic's clip reads the actor's pre-clip norm of the same minibatch and scales the critic's
gradients by the joint norm over both. The actor's clip, run first, reads its own norm. In
1M-step Humanoid-v4 runs (the critic's gradient norm 1-10% of the actor's) the joint scale
was at least 0.97 of the actor's own in 90% of each rollout's minibatches, and at least
0.995 in half; Adam makes such a common factor all but vanish. With CUDA graphs the whole
minibatch (gather, both steps, the metrics' sums) is one graph, recorded from the two
steps' bodies as the off-policy learner's fused update is.

Nothing syncs with the host inside an update:

- the minibatch's position in the permutation is a device counter, so every minibatch
  replays the same gather;
- the learning rate is a device tensor both optimizers read, set once per rollout;
- the target-KL early stop is a device gate, (K,) for K seeds: after each epoch a seed whose
  last minibatch's approx_kl exceeds ``target_kl`` has its gate set to 0, and its optimizers
  (:class:`~rl_graphstep.core.gatedadam.GatedAdam`) leave its parameters and moments as they
  are for the rest of the update. The remaining minibatches still run (forward and backward:
  fixed work, whatever the gate) but change nothing of a stopped seed, which is CleanRL's
  ``break`` out of the epochs, per seed. Without ``target_kl`` the optimizers are plain Adam;
- the metrics are summed on the device per minibatch, weighted by the gate (a stopped seed's
  minibatches do not count), and their means over the rollout's minibatches are added to the
  log's sums once per update.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from rl_graphstep.algorithms.ppo import PPO
from rl_graphstep.core.capture import capture_graph
from rl_graphstep.core.errors import CaptureError
from rl_graphstep.core.gatedadam import GatedAdam
from rl_graphstep.core.guards import JointGradNormClip, clip_grad_norm
from rl_graphstep.data.rollout import Rollout
from rl_graphstep.graphstep import AdaptationStep, make_adaptation_step
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.learners.rolloutacting import RolloutActing
from rl_graphstep.learners.steps import RecordedLoss, StepPair
from rl_graphstep.networks.policies import ActionEvaluation
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import RunPlan

ADAM_EPS = 1e-5  # CleanRL's PPO Adam


class OnPolicyLearner(RolloutActing, StepPair):
    """PPO's updates of the rollouts in ``rollout``, on ``plan.device``.

    :meth:`build` makes the steps (captured or eager, as ``plan`` says); each
    :meth:`update` then learns from the filled rollout, adding its metrics into the log's
    sums, and empties the rollout for the next one. :meth:`act` and :meth:`values` are the
    networks' outputs the loop stores in the rollout.
    """

    def __init__(self, algorithm: PPO, rollout: Rollout, cfg: Config, plan: RunPlan) -> None:
        self.algorithm, self.rollout, self.cfg, self.plan = algorithm, rollout, cfg, plan
        self.device = plan.device
        self.seeds = cfg.num_seeds
        self.seed_shape: tuple[int, ...] = () if self.seeds == 1 else (self.seeds,)
        batch = rollout.num_steps * rollout.num_envs
        self.minibatch_size = batch // cfg.num_minibatches
        # Read by both optimizers at every step: set in place once per rollout (annealing).
        self.lr = torch.full((), cfg.learning_rate, device=self.device)
        # 1 while a seed's epochs go on, 0 once its target-KL stop holds its steps.
        self.gate = (torch.ones(self.seed_shape, device=self.device)
                     if cfg.target_kl is not None else None)
        self.critic_optimizer = self._adam(algorithm.critic.parameters())
        self.actor_optimizer = self._adam(algorithm.actor.parameters())
        self.actor_clip = clip_grad_norm(algorithm.actor.parameters(), cfg.max_grad_norm,
                                         seeds=self.seeds)
        self.critic_clip = JointGradNormClip(algorithm.critic.parameters(), cfg.max_grad_norm,
                                             self.actor_clip, seeds=self.seeds)
        layout = rollout.layout
        self.value_loss = RecordedLoss(algorithm.value_loss, layout.value_targets)
        self.policy_loss = RecordedLoss(algorithm.policy_loss, layout.policy_targets)
        self.critic_step: AdaptationStep | None = None
        self.actor_step: AdaptationStep | None = None
        self.minibatch_graph: torch.cuda.CUDAGraph | None = None
        # The permutation of the epoch, (K, T*N), and the next minibatch's place in it.
        self.permutation = torch.zeros(self.seeds, batch, dtype=torch.int64, device=self.device)
        self.position = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.batch = torch.zeros(self.seeds, self.minibatch_size, layout.width,
                                 device=self.device)
        self._metric_names: tuple[str, ...] = ()
        self._metric_sums = torch.zeros(0)  # (metrics, *seed_shape), made by build
        self._counted = torch.zeros(self.seed_shape, device=self.device)
        self.sums: MetricSums | None = None
        self.updates = 0  # rollouts learned from over the whole run (a resumed one included)

    def _adam(self, params: Any) -> torch.optim.Adam:
        """Adam at the shared device rate, CleanRL's eps; capturable on CUDA (fused where
        uncompiled, as the off-policy learner's); gated where a target KL may stop it."""
        cuda = self.device.type == "cuda"
        settings: dict[str, Any] = {"lr": self.lr, "eps": ADAM_EPS, "capturable": cuda}
        if self.gate is not None:
            return GatedAdam(params, self.gate, **settings)
        if cuda:
            return torch.optim.Adam(params, fused=not self.plan.compile or None, **settings)
        return torch.optim.Adam(params, foreach=False, **settings)  # a tensor rate needs it

    @property
    def built(self) -> bool:
        return self.critic_step is not None

    def _view(self, tensor: Tensor) -> Tensor:
        """A (K, ...) tensor as the networks take it: without K for a single run."""
        return tensor if self.seeds > 1 else tensor[0]

    # ------------------------------------------------------------------ building

    def build(self, sums: MetricSums, *, fuse: bool = True) -> RunPlan:
        """Make the two steps (and, with CUDA graphs and ``fuse``, the minibatch graph) from
        the rollout's first rows; runs no update. A step that cannot be captured or compiled
        falls back as the plan allows. Every update adds its metrics into ``sums``; returns
        the plan that holds."""
        self.sums = sums
        rows = self._view(self.rollout.flat_rows[:, : self.minibatch_size])
        self._build_steps(rows)
        self._outputs, self._columns = self._step_buffers()
        names = tuple(self._minibatch_metrics())
        self._metric_names = names
        self._metric_sums = torch.zeros(len(names), *self.seed_shape, device=self.device)
        self._build_acting()
        if self.plan.graphs and fuse:
            try:
                self.minibatch_graph, _ = capture_graph(
                    self._record_minibatch, self.device, warmup_steps=0,
                    what="PPO's minibatch")
            except CaptureError as error:  # the separate graphs work: keep those
                warnings.warn(f"{error}; replaying the separate step graphs instead",
                              stacklevel=2)
        return self.plan

    def _make_steps(self, rows: Tensor) -> None:
        layout, algorithm = self.rollout.layout, self.algorithm
        settings = {"use_graph": self.plan.graphs, "compile": self.plan.compile,
                    "skip_nonfinite": True, "seeds": self.seeds}
        self.critic_step = make_adaptation_step(
            algorithm.critic, self.critic_optimizer, rows[..., layout.critic_inputs],
            rows[..., layout.critic_targets], self.value_loss,
            gradient_transform=self.critic_clip, **settings)
        self.actor_step = make_adaptation_step(
            ActionEvaluation(algorithm.actor, layout.observation_size), self.actor_optimizer,
            rows[..., layout.actor_inputs], rows[..., layout.actor_targets], self.policy_loss,
            gradient_transform=self.actor_clip, pool=getattr(self.critic_step, "pool", None),
            **settings)

    def _step_buffers(self) -> tuple[list[Tensor], list[Tensor]]:
        """The steps' static inputs and targets, and the gathered minibatch's columns each
        one is copied from."""
        assert self.critic_step is not None and self.actor_step is not None
        layout, batch = self.rollout.layout, self._view(self.batch)
        outputs = [self.critic_step.static_inputs, self.critic_step.static_targets,
                   self.actor_step.static_inputs, self.actor_step.static_targets]
        columns = [batch[..., layout.critic_inputs], batch[..., layout.critic_targets],
                   batch[..., layout.actor_inputs], batch[..., layout.actor_targets]]
        return outputs, columns

    # ------------------------------------------------------------------ updating

    def update(self, next_values: Tensor) -> None:
        """Learn from the filled rollout: GAE with ``next_values`` (…, N), the values of the
        observations after its last step, then the epochs of minibatch steps; empties it."""
        if not self.built:
            raise RuntimeError("build the learner before its first update")
        assert self.sums is not None
        cfg = self.cfg
        self.lr.fill_(self.algorithm.learning_rate(self.updates))
        self.rollout.compute_advantages(next_values, cfg.gamma, cfg.gae_lambda)
        explained_variance = self._view(
            self.algorithm.explained_variance(*self.rollout.flat_values_and_returns))
        if self.gate is not None:
            self.gate.fill_(1.0)
        self._metric_sums.zero_()
        self._counted.zero_()
        self.position.zero_()
        for _ in range(cfg.update_epochs):
            self._draw_permutation()
            for _ in range(cfg.num_minibatches):
                self._minibatch()
            if self.gate is not None:
                self._check_kl(cfg.target_kl)
        means = self._metric_sums / self._counted.clamp(min=1.0)
        metrics = dict(zip(self._metric_names, means.unbind(0), strict=True))
        metrics["losses/explained_variance"] = explained_variance
        metrics["charts/learning_rate"] = self.lr.expand(self.seed_shape)
        self.sums.add(metrics)
        self.rollout.reset()
        self.updates += 1

    def _draw_permutation(self) -> None:
        """Each seed's fresh random order of the rollout's rows, drawn on the device."""
        batch = self.permutation.shape[1]
        order = torch.rand(self.seeds, batch, device=self.device).argsort(dim=-1)
        self.permutation.copy_(order)

    def _minibatch(self) -> None:
        """The next minibatch: one launch of the minibatch graph, or step by step."""
        assert self.critic_step is not None and self.actor_step is not None
        if self.minibatch_graph is not None:
            self.minibatch_graph.replay()
            return
        self._gather()
        self.actor_step.replay()
        self.critic_step.replay()  # after the actor's: its clip reads the actor's norm
        self._add_metrics()

    def _record_minibatch(self) -> None:
        """The next minibatch as ordinary launches, which the minibatch graph records: its
        rows gathered into the steps' buffers, the actor step, the critic step, the metrics
        added into the rollout's sums."""
        assert self.critic_step is not None and self.actor_step is not None
        self._gather()
        self.actor_step.run_update()
        self.critic_step.run_update()
        self._add_metrics()

    def _add_metrics(self) -> None:
        """The minibatch's metrics into the rollout's sums, weighted by the gate."""
        with torch.no_grad():
            values = torch.stack(list(self._minibatch_metrics().values()))
            if self.gate is None:
                self._metric_sums.add_(values)
                self._counted.add_(1.0)
                return
            # where, not a product: a stopped seed's NaN (a skipped step's) must not count.
            self._metric_sums.add_(torch.where(self.gate > 0, values, 0.0))
            self._counted.add_(self.gate)

    def _gather(self) -> None:
        """Minibatch ``position`` of the permutation into the steps' static buffers, then
        advance ``position`` (on the device: every minibatch runs the same kernels)."""
        count, size = self.cfg.num_minibatches, self.minibatch_size
        chunks = self.permutation.view(self.seeds, count, size)
        indices = chunks.index_select(1, self.position).view(self.seeds, size, 1)
        rows = self.rollout.flat_rows
        torch.gather(rows, 1, indices.expand(-1, -1, rows.shape[-1]), out=self.batch)
        self.position.add_(1).remainder_(count)
        torch._foreach_copy_(self._outputs, self._columns)

    def _minibatch_metrics(self) -> dict[str, Tensor]:
        """The last minibatch's metrics: the losses' own and both gradient norms."""
        return {**self.value_loss.values, "losses/critic_grad_norm": self.critic_clip.own_norm,
                **self.policy_loss.values, "losses/actor_grad_norm": self.actor_clip.norm}

    def _check_kl(self, target_kl: float) -> None:
        """CleanRL's ``if approx_kl > target_kl: break`` after an epoch, per seed and on the
        device: a seed whose last minibatch's approx_kl exceeds it (or is NaN) stops."""
        approx_kl = self.policy_loss.values["losses/approx_kl"]
        assert self.gate is not None
        self.gate.mul_((approx_kl <= target_kl).to(self.gate.dtype))

    # ------------------------------------------------------------------ counters

    def steps_made(self, updates: int) -> dict[str, int]:
        """The critic and actor steps of the first ``updates`` updates, over all seeds: one
        of each per minibatch of every epoch (a target-KL stop's gated steps included)."""
        steps = updates * self.cfg.update_epochs * self.cfg.num_minibatches * self.seeds
        return {"critic": steps, "actor": steps}

    # ------------------------------------------------------------------ checkpoints

    def _learning_state(self) -> dict[str, Any]:
        return {"actor": self.algorithm.actor, "critic": self.algorithm.critic,
                "actor_optimizer": self.actor_optimizer,
                "critic_optimizer": self.critic_optimizer}

    def state_dict(self) -> dict[str, Any]:
        """The networks, both optimizers' moments and the schedule's position (the rollouts
        learned from, which gives the annealed rate)."""
        state = {name: part.state_dict() for name, part in self._learning_state().items()}
        return {**state, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load before :meth:`build`: the steps are captured after it, from these values (a
        captured optimizer must never be given new state tensors)."""
        if self.built:
            raise RuntimeError("load the learner's state before its steps are built")
        for name, part in self._learning_state().items():
            if isinstance(part, torch.optim.Optimizer):
                _load_optimizer(part, state[name])
            else:
                part.load_state_dict(state[name])
        self.updates = int(state["updates"])


def _load_optimizer(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """The saved moments and step counts, this optimizer's group settings: torch's
    ``load_state_dict`` takes the saved groups' (a copy of the saved rate tensor in place of
    the shared device one, which annealing could then no longer reach)."""
    own = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, settings in zip(optimizer.param_groups, own, strict=True):
        group.update(settings)
