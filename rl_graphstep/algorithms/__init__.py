"""The off-policy actor-critic algorithms, by the name ``--algo`` takes."""

from rl_graphstep.algorithms.base import OffPolicyAlgorithm
from rl_graphstep.algorithms.ddpg import DDPG
from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.algorithms.td3 import TD3

ALGORITHMS: dict[str, type[OffPolicyAlgorithm]] = {"sac": SAC, "td3": TD3, "ddpg": DDPG}

__all__ = ["ALGORITHMS", "DDPG", "SAC", "TD3", "OffPolicyAlgorithm"]
