"""PPO's acting: one env step's actions, sampled on the device, written into the rollout.

Each step the host's observations (and, under ``--obs-norm``, their statistics) go into one
pinned staging buffer; one launch (a captured CUDA graph) copies it to the device, normalises,
samples the actions and their log-probabilities, computes the values, writes the rollout's
next row at a step counter kept on the device and copies the actions home; one event is the
step's one host sync. Where the run compiles, the device work between the two copies is
compiled before it is captured (its two dozen small kernels fused into fewer); a body the
compiler fails on, or whose compiled kernels will not capture, runs uncompiled, and an actor
that cannot be captured at all acts eagerly, each with one warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rl_graphstep.algorithms.ppo import PPO
from rl_graphstep.core.capture import capture_graph
from rl_graphstep.core.compiling import compile_now
from rl_graphstep.core.errors import CaptureError
from rl_graphstep.data.rollout import Rollout
from rl_graphstep.settings.plan import RunPlan


class RolloutActing:
    """The acting half of :class:`~rl_graphstep.learners.onpolicy.OnPolicyLearner`: its
    :meth:`act` and :meth:`values`, and :meth:`start_acting` / :meth:`actions`, built by
    :meth:`_build_acting` when the learner is built."""

    algorithm: PPO
    rollout: Rollout
    plan: RunPlan
    device: torch.device
    seeds: int
    seed_shape: tuple[int, ...]
    acting_graph: torch.cuda.CUDAGraph | None = None
    _act_on_device: Callable[[], Tensor]  # _act_and_write, compiled where the plan says

    @torch.no_grad()
    def act(self, observations: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A sampled action, its log-probability and the observation's value, for the rollout:
        (…, N, A), (…, N), (…, N)."""
        actions, log_probs = self.algorithm.actor(observations)
        return actions, log_probs, self.values(observations)

    @torch.no_grad()
    def values(self, observations: Tensor) -> Tensor:
        """The critic's values (…, N) of ``observations`` (…, N, O): the rollout's, a truncated
        episode's final observation's, and the one after the rollout's last step."""
        return self.algorithm.critic(observations).squeeze(-1)

    def start_acting(self, observations: np.ndarray) -> None:
        """Queue one env step's acting and return at once: the host observations (K*N, O),
        non-finite rows already zeros, go to the device; the policy samples actions for them
        (normalised first under ``--obs-norm``), and the rollout's next row gets the
        observations as acted on, the actions, their log-probabilities and the values. One
        launch with CUDA graphs.

        Under ``--obs-norm`` the caller has counted the observations on the host
        (:meth:`ObservationNormalizer.observe`); their statistics travel in the same staging
        and copy as the observations, and the acting writes them into the normaliser's
        ``stats`` before it reads them (so does everything queued after it)."""
        if self._pending:
            self.actions()  # the staging is about to be rewritten: its last copy must be done
        self._observations_rows[:] = observations
        normalizer = self.rollout.normalizer
        if normalizer is not None and self._stats_rows is not None:
            normalizer.write_stats(self._stats_rows)
        if self.acting_graph is None:
            self._copy_act_into_rollout()
        elif self._copies_in_graph:
            self.acting_graph.replay()
        else:
            self._inputs.copy_(self._inputs_host, non_blocking=True)
            self.acting_graph.replay()
        if self._acted is not None:
            self._acted.record(self._stream)
        self._pending = True

    def actions(self) -> np.ndarray:
        """The actions (K*N, A) of the last :meth:`start_acting`, on the host (its one sync),
        in a buffer the next acting overwrites; its staging is then free again."""
        if self._acted is not None:
            self._acted.synchronize()
        self._pending = False
        return self._actions_rows

    def _build_acting(self) -> None:
        """The fixed buffers of :meth:`start_acting` (pinned host staging on CUDA), and its
        graph where the plan captures: with the copy in from the staging where that can be
        captured, else the copy outside; where the acting itself cannot be captured (an
        actor's ``forward`` that waits for the GPU, which the protocol allows), its eager
        twin, with a warning."""
        rows = self.seeds * self.rollout.num_envs
        layout, cuda = self.rollout.layout, self.device.type == "cuda"
        size, normalizer = layout.observation_size, self.rollout.normalizer
        # [observations (K*N rows) | the statistics' mean (K) | divisor (K)]: one copy in.
        stats_rows = 0 if normalizer is None else 2 * self.seeds
        self._inputs_host = torch.zeros(rows + stats_rows, size, pin_memory=cuda)
        self._inputs = torch.zeros(rows + stats_rows, size, device=self.device)
        self._observations = self._inputs[:rows]
        self._stats_in = (None if normalizer is None
                          else self._inputs[rows:].view(normalizer.stats.shape))
        self._actions_host = torch.zeros(rows, layout.action_size, pin_memory=cuda)
        # Their numpy views, made once (``Tensor.numpy()`` costs microseconds a call).
        host_rows = self._inputs_host.numpy()
        self._observations_rows = host_rows[:rows]
        self._stats_rows = (None if normalizer is None
                            else host_rows[rows:].reshape(2, self.seeds, size))
        self._actions_rows = self._actions_host.numpy()
        self._acted = torch.cuda.Event() if cuda else None
        # Fetched once: current_stream() costs more than recording the event on it.
        self._stream = torch.cuda.current_stream(self.device) if cuda else None
        self._pending = False
        self._copies_in_graph = False
        if normalizer is not None:  # what the capture's warm-up reads: the current statistics
            normalizer.write_stats(self._stats_rows)
            self._inputs.copy_(self._inputs_host)
        self._act_on_device = self._acting_body()
        if not self.plan.graphs:
            return
        # The compiled body first, where there is one; where its kernels will not capture,
        # the plain ones may.
        failed: CaptureError | None = None
        for body in dict.fromkeys((self._act_on_device, self._act_and_write)):
            self._act_on_device = body
            try:
                self.acting_graph = self._capture_acting()
            except CaptureError as error:
                failed = error
                continue
            if failed is not None:
                warnings.warn(f"{failed}; capturing it uncompiled", stacklevel=3)
            break
        else:
            warnings.warn(f"{failed}; acting eagerly instead", stacklevel=3)
        self.rollout.position.zero_()  # the warm-up's row is the first step's to overwrite

    def _capture_acting(self) -> torch.cuda.CUDAGraph:
        """The acting's graph with the copy in from the staging, or, where that copy cannot
        be captured, without it (with a warning); raises :class:`CaptureError` where the
        acting itself cannot be captured."""
        try:
            graph, _ = capture_graph(self._copy_act_into_rollout, self.device,
                                     what="PPO's acting with its copy in")
            self._copies_in_graph = True
            return graph
        except CaptureError as with_copy:
            graph, _ = capture_graph(self._act_into_rollout, self.device, what="PPO's acting")
            warnings.warn(f"{with_copy}; copying outside the graph", stacklevel=4)
            return graph

    def _acting_body(self) -> Any:
        """:meth:`_act_and_write`, compiled where the plan compiles: its two dozen small
        kernels (normalise, sample, log-probability, value, the row) fused into fewer, which
        shortens both the graph's launch and the device's acting, the one-env step's path.
        Uncompiled, with a one-line warning, where the compiler fails on it. Compiling runs
        it once: the step counter is reset (the first action overwrites that row) and the
        generators are put back, so building draws nothing."""
        if not self.plan.compile:
            return self._act_and_write
        devices = [self.device] if self.device.type == "cuda" else []
        # Without gradients, as :meth:`_act_into_rollout` calls it: the compiler guards on
        # the grad mode and would compile it again at the first action.
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            compiled = compile_now(self._act_and_write, what="PPO's acting")
        self.rollout.position.zero_()
        return compiled or self._act_and_write

    def _copy_act_into_rollout(self) -> None:
        """The staging's copy to the device, then :meth:`_act_into_rollout`."""
        self._inputs.copy_(self._inputs_host, non_blocking=True)
        self._act_into_rollout()

    @torch.no_grad()
    def _act_into_rollout(self) -> None:
        """:meth:`start_acting`'s device work, from the inputs on the device to the actions in
        the host buffer: the same launches every step."""
        actions = self._act_on_device()
        self._actions_host.copy_(actions.reshape(self._actions_host.shape), non_blocking=True)

    @torch.no_grad()
    def _act_and_write(self) -> Tensor:
        """Normalise the inputs on the device (under ``--obs-norm``), sample the actions, and
        write the rollout's next row; the actions. No copy between host and device (the
        compiler is given none to place)."""
        observations = self._observations.view(*self.seed_shape, self.rollout.num_envs, -1)
        normalizer = self.rollout.normalizer
        if normalizer is not None:
            normalizer.stats.copy_(self._stats_in)
            observations = normalizer.normalize(observations)
        actions, log_probs, values = self.act(observations)
        self.rollout.write_acted(observations, actions, log_probs, values)
        return actions
