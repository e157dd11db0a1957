"""The size estimate of the default networks that start-up checks against free memory."""

from __future__ import annotations

from rl_graphstep.data.memory import default_network_bytes


def test_a_distributional_critic_counts_its_atoms_outputs() -> None:
    """Two members of 4 -> 4 -> 1 (or 51 logits): (16 + 4) + (4 + 1) = 25 parameters each,
    or (16 + 4) + (4 x 51 + 51) = 275; each kept 5 times (weights, gradients, Adam's two
    moments, the target), 4 bytes each."""
    assert default_network_bytes(3, 1, (4,), 2, actor=False) == 2 * 25 * 5 * 4
    assert default_network_bytes(3, 1, (4,), 2, actor=False, atoms=51) == 2 * 275 * 5 * 4
