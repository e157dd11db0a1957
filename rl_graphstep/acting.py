"""Acting: the policy's actions for the environments, fetched with one host sync.

Observations go host → pinned memory → device without blocking, the policy runs (a captured
CUDA graph on CUDA: one launch instead of a few dozen), and the actions come back through
pinned memory with one event. The loop queues this before the updates, so waiting for the
actions never waits for the updates, and the host steps the environments while they run.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rl_graphstep.errors import CaptureError
from rl_graphstep.graphstep import capture_graph

Policy = Callable[..., Tensor]
"""Maps observations (N, O) on the device to actions (N, A); given a second argument, the
standard normal noise (N, K) to explore with, it draws nothing on the device."""


class ActionPipe:
    """Sends observations to ``policy`` and brings its actions back, in [-1, 1] (for the
    replay buffer) and scaled onto the action space's bounds (for the environments), both
    computed on the device and brought home in one transfer.

    Args:
        policy: the acting policy (e.g. ``agent.explore``), actions in [-1, 1].
        num_envs, observation_size: the fixed shape (N, O) of the observations.
        action_space: the single env's Box; its bounds scale the actions.
        device: where the policy runs.
        use_graph: capture the policy as a CUDA graph; ``None``: try, and act eagerly with a
            warning when it cannot be captured; ``False``: eager.
        noise_size: K > 0: draw the exploration noise (N, K) on the host, from numpy's global
            generator (seeded and checkpointed with the run), send it in with the
            observations and pass it to the policy: acting then draws nothing on the device.
        refresh: ``(copies, originals)``: the tensors of the actor copy the policy reads and
            of the learned actor, copied over before each action (see
            ``ActorCritic.separate_behaviour_actor``). With a graph and host noise, the action
            then runs on a stream of its own, beside the updates queued after it.

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
        use_graph: bool | None = False,
        noise_size: int = 0,
        refresh: tuple[list[Tensor], list[Tensor]] | None = None,
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
        self._ready = torch.cuda.Event() if on_cuda else None
        # Fetched once: current_stream() costs more than the copies it would order.
        self._stream = torch.cuda.current_stream(device) if on_cuda else None
        self._pending = False
        self.graph: torch.cuda.CUDAGraph | None = None
        self._actions: Tensor | None = None
        # Whether the graph also makes the two copies (one launch per request, not three).
        self.copies_in_graph = False
        if use_graph is not False and on_cuda:
            try:
                self.graph, self._actions = self._capture(device)
            except CaptureError as error:
                if use_graph:
                    raise
                warnings.warn(f"{error}; selecting actions eagerly instead", stacklevel=2)
        # The action's own stream: only for a graph that draws no random numbers (replays
        # on two streams would share the generator's device-side offset) and reads a copy
        # of the actor (the update queued after it rewrites the actor). A high priority: the
        # host waits for the action alone, so its blocks go before the update's.
        self.side_stream: torch.cuda.Stream | None = None
        if self.graph is not None and noise_size and refresh is not None:
            self.side_stream = torch.cuda.Stream(device, priority=-1)
            self._refreshed = torch.cuda.Event()

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
        if self._refresh is not None:
            # On the updates' stream, after those queued so far and before the next: the
            # copy holds the actor as the action must see it. The last action read it before
            # this request returned from its wait, so rewriting it here is safe.
            with torch.no_grad():
                torch._foreach_copy_(*self._refresh)
        if self.side_stream is None:
            self._launch()
            if self._ready is not None:
                self._ready.record(self._stream)
        else:
            self._refreshed.record(self._stream)
            self.side_stream.wait_event(self._refreshed)
            with torch.cuda.stream(self.side_stream):
                self._launch()
            self._ready.record(self.side_stream)
        self._pending = True

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
