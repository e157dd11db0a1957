"""DDPG (Lillicrap et al., 2016): one critic, a deterministic actor, Gaussian exploration.

It is TD3 without the twin critic and without target policy smoothing; the actor and the
targets are updated every ``policy_frequency`` critic steps, as in CleanRL.
"""

from __future__ import annotations

from rl_graphstep.algorithms.td3 import TD3


class DDPG(TD3):
    """Deep deterministic policy gradient; arguments as :class:`TD3`, with E >= 1 critics
    (the first one learns the actor)."""

    name = "ddpg"
    num_critics = 1
    target_smoothing = False
