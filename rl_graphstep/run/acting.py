"""Acting: the policy's actions for the environments, fetched with one host sync.

Observations go host → pinned memory → device without blocking, the policy runs (a captured
CUDA graph on CUDA: one launch instead of a few dozen), and the actions come back through
pinned memory with one event. The loop queues this before the updates, so waiting for the
actions never waits for the updates, and the host steps the environments while they run.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rl_graphstep.core.capture import capture_graph
from rl_graphstep.core.errors import CaptureError

if TYPE_CHECKING:
    from rl_graphstep.algorithms.base import OffPolicyAlgorithm
    from rl_graphstep.data.normalizer import ObservationNormalizer
    from rl_graphstep.settings.plan import RunPlan

Policy = Callable[..., Tensor]
"""Maps observations (N, O) on the device to actions (N, A); given a second argument, the
standard normal noise (N, K) to explore with, it draws nothing on the device."""


class ActionPipe:
    """Sends observations to ``policy`` and brings its actions back, in [-1, 1] (for the
    replay buffer) and scaled onto the action space's bounds (for the environments), both
    computed on the device and brought home in one transfer.

    Args:
        policy: the acting policy, actions in [-1, 1].
        num_envs, observation_size: the fixed shape (N, O) of the observations.
        action_space: the single env's Box; its bounds scale the actions.
        device: where the policy runs.
        use_graph: capture the policy as a CUDA graph (on CUDA).
        graph_fallback: where the policy cannot be captured, act eagerly with a warning
            instead of raising.
        noise_size: K > 0: draw the exploration noise (N, K) on the host, from numpy's global
            generator (seeded and checkpointed with the run), send it in with the
            observations and pass it to the policy: acting then draws nothing on the device.
        refresh: ``(copies, originals)``: the tensors of the actor copy the policy reads and
            of the learned actor (see :func:`behaviour_copy`). Each action
            then reads the actor as it was at the previous request, one round of updates
            behind: that actor is final before the update queued after the previous request
            starts, so with a graph and host noise the action runs on a stream of its own,
            beside that update, and waits for no update at all.
        staged: with ``refresh``, the tensors :meth:`staged_actor` returned when a run was
            checkpointed, so that a resumed run's first action reads what it would have.

    :meth:`request` and :meth:`wait` alternate: request queues the work and returns at once,
    wait blocks until the actions are on the host and returns them. Both are issued on the
    CUDA stream current when the pipe was made.
    """

    def __init__(
        self,
        policy: Policy,
        num_envs: int,
        observation_size: int,
        action_space: gym.spaces.Box,
        device: torch.device,
        *,
        use_graph: bool = False,
        graph_fallback: bool = False,
        noise_size: int = 0,
        refresh: tuple[list[Tensor], list[Tensor]] | None = None,
        staged: list[Tensor] | None = None,
    ) -> None:
        self.policy = policy
        on_cuda = device.type == "cuda"
        self.action_size = action_space.shape[0]
        self._low = torch.as_tensor(action_space.low, dtype=torch.float32, device=device)
        self._high = torch.as_tensor(action_space.high, dtype=torch.float32, device=device)
        # (high - low) / 2, made once: (a + 1) * it equals scale_action's (a + 1) * 0.5 *
        # (high - low) to the bit (halving is exact), with two kernels fewer per action.
        self._half_range = (self._high - self._low) * 0.5
        # [observations | noise] rows: one transfer in.
        self._noise_shape = (num_envs, noise_size)
        width = observation_size + noise_size
        self._host_inputs = torch.zeros(num_envs, width, pin_memory=on_cuda)
        self._inputs = torch.zeros(num_envs, width, device=device)
        self._observations = self._inputs[:, :observation_size]
        self._noise = self._inputs[:, observation_size:] if noise_size else None
        self._host_actions = torch.zeros(num_envs, 2 * self.action_size, pin_memory=on_cuda)
        # numpy views made once: the loop touches them every step.
        self._host_inputs_view = self._host_inputs.numpy()
        self._host_observations_view = self._host_inputs_view[:, :observation_size]
        self._host_noise_view = self._host_inputs_view[:, observation_size:]
        self._host_actions_view = self._host_actions.numpy()
        self._refresh = refresh
        # The actor as it was at the last request, which the next action reads: copied on the
        # updates' stream between the update queued before that request and the one after.
        self._staged: list[Tensor] = []
        if refresh is not None:
            source = refresh[1] if staged is None else staged
            if [t.shape for t in source] != [t.shape for t in refresh[1]]:
                raise ValueError("staged: the saved actor tensors do not match this actor's "
                                 "(a checkpoint of another actor?)")
            self._staged = [t.detach().to(o.device, copy=True)
                            for t, o in zip(source, refresh[1], strict=True)]
        self._ready = torch.cuda.Event() if on_cuda else None
        # Fetched once: current_stream() costs more than the copies it would order.
        self._stream = torch.cuda.current_stream(device) if on_cuda else None
        self._pending = False
        self.graph: torch.cuda.CUDAGraph | None = None
        self._actions: Tensor | None = None
        # Whether the graph also makes the two copies (one launch per request, not three).
        self.copies_in_graph = False
        if use_graph and on_cuda:
            try:
                self.graph, self._actions = self._capture(device)
            except CaptureError as error:
                if not graph_fallback:
                    raise
                warnings.warn(f"{error}; selecting actions eagerly instead", stacklevel=2)
        # The action's own stream: only for a graph that draws no random numbers (replays
        # on two streams would share the generator's device-side offset) and reads a copy
        # of the actor (the update running beside it rewrites the actor). A high priority:
        # the host waits for the action alone, so its blocks go before the update's.
        self.side_stream: torch.cuda.Stream | None = None
        if self.graph is not None and noise_size and refresh is not None:
            self.side_stream = torch.cuda.Stream(device, priority=-1)
            self._staged_ready = torch.cuda.Event()  # the staged actor is written
            self._staged_taken = torch.cuda.Event()  # the action's copy has read it
            self._staged_ready.record(self._stream)

    def _capture(self, device: torch.device) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """The policy as a graph that also copies the observations in from pinned memory and
        the actions out to it; failing that, the policy alone (copied around outside)."""
        what = "the policy's action selection"
        try:
            captured = capture_graph(self._copy_act_copy, device, warmup_steps=2,
                                     what=f"{what} with its copies")
        except CaptureError as with_copies:
            # Raises the policy's own error when it cannot be captured at all.
            captured = capture_graph(self._act, device, what=what, warmup_steps=2)
            warnings.warn(f"{with_copies}; copying outside the graph", stacklevel=3)
            return captured
        self.copies_in_graph = True
        return captured

    def _copy_act_copy(self) -> Tensor:
        self._inputs.copy_(self._host_inputs, non_blocking=True)
        actions = self._act()
        self._host_actions.copy_(actions, non_blocking=True)
        return actions

    @torch.no_grad()
    def _act(self) -> Tensor:
        """[actions in [-1, 1] | actions on the env's bounds], (N, 2A)."""
        if self._noise is None:
            actions = self.policy(self._observations)
        else:
            actions = self.policy(self._observations, self._noise)
        scaled = self._low + (actions + 1.0) * self._half_range
        return torch.cat([actions, scaled.clamp(self._low, self._high)], dim=1)

    def request(self, observations: np.ndarray) -> None:
        """Queue the policy on ``observations`` (N, O) and the copy of its actions home."""
        if self._pending:
            self.wait()  # the pinned buffers are about to be rewritten
        self._host_observations_view[:] = observations
        if self._noise is not None:
            self._host_noise_view[:] = np.random.standard_normal(self._noise_shape)
        if self._refresh is None:
            self._launch_in_line()
        else:
            self._launch_one_round_behind(*self._refresh)
        self._pending = True

    @torch.no_grad()
    def _launch_one_round_behind(self, copies: list[Tensor], originals: list[Tensor]) -> None:
        """The action from the actor staged at the last request, then the actor staged anew.

        Why one round behind: the actor as it is now is final only once the update queued
        before this request has run, and waiting for that is what kept the action from
        running beside the updates. The staged actor was final before that update started.
        """
        side = self.side_stream
        if side is None:
            torch._foreach_copy_(copies, self._staged)
            self._launch_in_line()
        else:
            side.wait_event(self._staged_ready)
            with torch.cuda.stream(side):
                torch._foreach_copy_(copies, self._staged)
                self._staged_taken.record(side)
                self._launch()
                self._ready.record(side)
            self._stream.wait_event(self._staged_taken)
        # On the updates' stream: after the updates queued so far, before the next one.
        torch._foreach_copy_(self._staged, originals)
        if side is not None:
            self._staged_ready.record(self._stream)

    def staged_actor(self) -> list[Tensor]:
        """The actor tensors the next action will read (empty without ``refresh``): a
        checkpoint keeps them, and ``staged=`` gives them to the resumed run's pipe."""
        return [t.clone() for t in self._staged]

    def _launch_in_line(self) -> None:
        """The action on the updates' stream, marked ready there."""
        self._launch()
        if self._ready is not None:
            self._ready.record(self._stream)

    def _launch(self) -> None:
        """The copy in, the policy and the copy out, on the current stream."""
        if self.graph is not None and self.copies_in_graph:
            self.graph.replay()
            return
        non_blocking = self._ready is not None
        self._inputs.copy_(self._host_inputs, non_blocking=non_blocking)
        if self.graph is not None:
            self.graph.replay()
            actions = self._actions
        else:
            actions = self._act()
        self._host_actions.copy_(actions, non_blocking=non_blocking)

    def wait(self) -> tuple[np.ndarray, np.ndarray]:
        """The requested actions as fresh host arrays (N, A): in [-1, 1], and scaled onto the
        action space's bounds."""
        if not self._pending:
            raise RuntimeError("wait() without a request(): ask for actions first")
        if self._ready is not None:
            self._ready.synchronize()
        self._pending = False
        both = self._host_actions_view.copy()
        return both[:, : self.action_size], both[:, self.action_size :]


def behaviour_copy(actor: nn.Module) -> tuple[nn.Module, tuple[list[Tensor], list[Tensor]]]:
    """A copy of ``actor`` that never learns, to act beside the updates, and ``(copies,
    originals)``, its tensors and the actor's in pairs (``ActionPipe``'s ``refresh``)."""
    duplicate = copy.deepcopy(actor).requires_grad_(False)
    for parameter in duplicate.parameters():
        parameter.grad = None  # the copy never learns: no gradient buffers
    return duplicate, ([*duplicate.parameters(), *duplicate.buffers()],
                       [*actor.parameters(), *actor.buffers()])


class PerSeedPolicy:
    """A policy of K seeds (networks batched on a leading seed dimension) acting on the pipe's
    flat rows: rows k*n .. k*n+n-1 are seed k's n envs, and so are the noise and the actions."""

    def __init__(self, policy: Policy, seeds: int) -> None:
        self.policy = policy
        self.seeds = seeds

    def __call__(self, observations: Tensor, noise: Tensor | None = None) -> Tensor:
        by_seed = observations.reshape(self.seeds, -1, observations.shape[-1])
        if noise is None:
            actions = self.policy(by_seed)
        else:
            actions = self.policy(by_seed, noise.reshape(self.seeds, -1, noise.shape[-1]))
        return actions.reshape(-1, actions.shape[-1])


def policy_pipe(algorithm: OffPolicyAlgorithm, plan: RunPlan, num_envs: int,
                observation_size: int, action_space: gym.spaces.Box, *,
                staged: list[Tensor] | None = None,
                normalizer: ObservationNormalizer | None = None) -> ActionPipe:
    """The pipe the learned policy acts through, as ``plan`` says. With the action stream,
    the action runs beside the updates, so it draws nothing on the device (two streams would
    share the generator's offset): its noise comes from the host, and it reads a copy of the
    actor one round of updates behind, so it waits for no update. ``staged``: a resumed run's
    staged actor (see :meth:`ActionPipe.staged_actor`). ``num_envs``: all the envs, K x n
    with K seeds. ``normalizer``: with ``--obs-norm``, the observation statistics the policy
    acts through; beside the updates, a copy of them staged with the actor's tensors (the
    last of the staged list), so the action reads statistics and actor of one round."""
    if not plan.action_stream:
        normalize = None if normalizer is None else normalizer.normalize
        return ActionPipe(acting_policy(algorithm, algorithm.actor, normalize), num_envs,
                          observation_size, action_space, plan.device, use_graph=plan.graphs,
                          graph_fallback=plan.graph_fallback)
    actor, refresh = behaviour_copy(algorithm.actor)
    normalize = None
    if normalizer is not None:
        stats = normalizer.stats.clone()
        refresh[0].append(stats)
        refresh[1].append(normalizer.stats)
        normalize = functools.partial(normalizer.normalize, stats=stats)
    return ActionPipe(acting_policy(algorithm, actor, normalize), num_envs, observation_size,
                      action_space, plan.device, use_graph=True,
                      graph_fallback=plan.graph_fallback,
                      noise_size=algorithm.exploration_noise_size(), refresh=refresh,
                      staged=staged)


class NormalizedPolicy:
    """A policy acting on normalised observations (``--obs-norm``): ``normalize`` maps the
    (n, O) observations of one seed, or (K, n, O) of K, to what the actor learned on."""

    def __init__(self, policy: Policy, normalize: Callable[[Tensor], Tensor]) -> None:
        self.policy = policy
        self.normalize = normalize

    def __call__(self, observations: Tensor, noise: Tensor | None = None) -> Tensor:
        observations = self.normalize(observations)
        return self.policy(observations) if noise is None else self.policy(observations, noise)


def acting_policy(algorithm: OffPolicyAlgorithm, actor: nn.Module,
                  normalize: Callable[[Tensor], Tensor] | None = None) -> Policy:
    """``algorithm.explore`` with ``actor``, on the pipe's flat rows of every seed's envs;
    on observations through ``normalize`` first where given (see NormalizedPolicy)."""
    policy: Policy = functools.partial(algorithm.explore, actor)
    if normalize is not None:
        policy = NormalizedPolicy(policy, normalize)
    seeds = algorithm.seed_shape[0] if algorithm.seed_shape else 1
    return policy if seeds == 1 else PerSeedPolicy(policy, seeds)
