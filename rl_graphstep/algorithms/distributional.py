"""The maths of a distributional (C51) critic (Bellemare et al., 2017), as FastTD3 and FastSAC
use it: values as categorical distributions over a fixed support of atoms, their expected
values, the projection of a TD target distribution back onto the support, and the
cross-entropy loss towards it (``--critic-atoms``, ``--v-min``, ``--v-max``).

Everything runs inside a captured update: fixed shapes, no host syncs, no boolean masks, and
no atomic adds, so a replay computes exactly what the eager step and the other graphs compute.
Any leading dimensions pass through (K seeds, the batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["CategoricalSupport"]


class CategoricalSupport:
    """The atoms ``z_j = v_min + j * delta``, j = 0 .. A-1, on the device, and what is computed
    over them.

    Args:
        atoms: A >= 2, the number of atoms.
        v_min, v_max: the lowest and the highest atom.
        device: where the atoms live (the critic's device).
    """

    def __init__(self, atoms: int, v_min: float, v_max: float, device: torch.device) -> None:
        if atoms < 2 or not v_min < v_max:
            raise ValueError(f"a support needs 2 or more atoms on v_min < v_max, got {atoms} "
                             f"atoms on [{v_min}, {v_max}]")
        self.atoms = int(atoms)
        self.v_min, self.v_max = float(v_min), float(v_max)
        self.delta = (self.v_max - self.v_min) / (self.atoms - 1)
        self.z = torch.linspace(self.v_min, self.v_max, self.atoms, device=device)
        # The atoms' numbers 0 .. A-1, where a target atom's position is measured.
        self.index = torch.arange(self.atoms, dtype=self.z.dtype, device=device)

    def expected(self, logits: Tensor) -> Tensor:
        """The expected values ``sum_j softmax(logits)_j z_j`` of logits (..., A): (...)."""
        return (torch.softmax(logits, dim=-1) * self.z).sum(dim=-1)

    def lowest_member(self, logits: Tensor) -> Tensor:
        """Per row, the probabilities (..., B, A) of the member of ``logits`` (..., B, E, A)
        whose expected value is lowest: clipped double Q for distributions, as FastTD3 takes
        it (the first member where two are equal)."""
        probabilities = torch.softmax(logits, dim=-1)
        values = (probabilities * self.z).sum(dim=-1)  # (..., B, E)
        lowest = values.argmin(dim=-1, keepdim=True)  # (..., B, 1)
        index = lowest.unsqueeze(-1).expand(*lowest.shape, self.atoms)  # (..., B, 1, A)
        return probabilities.gather(-2, index).squeeze(-2)

    @torch.no_grad()
    def project(self, probabilities: Tensor, rewards: Tensor, discounts: Tensor) -> Tensor:
        """The distribution of ``rewards + discounts * Z`` (Z with ``probabilities`` (..., B, A)
        on the atoms; rewards and discounts (..., B, 1)) projected onto the atoms: (..., B, A).

        Each target atom ``r + d z_j``, clamped to [v_min, v_max], lies at the position
        ``b_j = (r + d z_j - v_min) / delta`` between atoms ``l = floor(b_j)`` and
        ``u = ceil(b_j)``; its mass is split ``p_j (u - b_j)`` to l and ``p_j (b_j - l)`` to u,
        and a target that falls on an atom gives it all its mass (C51's ``l == u`` case,
        where that split would lose it). Both are one formula: atom i receives
        ``p_j max(0, 1 - |b_j - i|)``. It is summed over j here rather than scattered with
        ``index_add_``: on the GPU that adds atomically, in an order that varies from run to
        run, and the updates would no longer be reproducible to the bit. The price is a
        transient (..., B, A, A) tensor (334 MB for a batch of 8192 and 101 atoms; compiled,
        the sum is fused and it is never stored). A target is not differentiated: no grad.
        """
        # Clamped as positions rather than values: the top atom is then at A - 1 exactly,
        # where (v_max - v_min) / delta may round to a hair above it and lose that hair.
        positions = ((rewards + discounts * self.z - self.v_min) / self.delta).clamp(
            0, self.atoms - 1)  # (..., B, A)
        # max(0, 1 - |b_j - i|) for source j (dim -2) and atom i (dim -1), computed in place:
        # this (..., B, A, A) tensor is the projection's one large allocation.
        shares = (positions.unsqueeze(-1) - self.index).abs_().neg_().add_(1).clamp_(min=0)
        return shares.mul_(probabilities.unsqueeze(-1)).sum(dim=-2)

    @staticmethod
    def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
        """``-sum_j m_j log softmax(logits)_j`` of each member's logits (..., B, E, A) against
        the target distribution m (..., B, A), shared by the members: (..., B, E)."""
        return -(target.unsqueeze(-2) * F.log_softmax(logits, dim=-1)).sum(dim=-1)
