"""Learners: how an algorithm's updates run on the device. ``offpolicy`` trains from a replay
buffer (SAC, TD3, DDPG); an on-policy learner fits beside it."""

from rl_graphstep.learners.offpolicy import OffPolicyLearner

__all__ = ["OffPolicyLearner"]
