"""Gradient guards run inside an update: gradient-norm clipping, and the non-finite guard that
skips a bad update on the device; each in a per-seed form for K seeds stacked on a leading
dimension, where one seed's gradients never reach another's clip or skip."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from rl_graphstep.core.capture import selected_parameters, state_tensors
from rl_graphstep.core.compiling import outside_compiler


class GradNormClip:
    """Clip the gradients' total 2-norm to ``max_norm``; keep the pre-clip norm in ``self.norm``.

    ``self.norm`` is a preallocated 0-dim float32 tensor updated in place, so inside a CUDA
    graph every replay refreshes it and a logger can read it without re-allocations. The
    clipping itself never syncs with the host (``clip_grad_norm_`` scales by
    ``min(1, max_norm / (norm + 1e-6))`` on the device). ``max_norm=inf`` only records.
    """

    def __init__(self, parameters: Iterable[Tensor], max_norm: float) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        if not self.parameters:
            raise ValueError("clip_grad_norm needs at least one parameter that requires grad")
        if not max_norm > 0:
            raise ValueError(f"max_norm must be > 0, got {max_norm}")
        self.max_norm = float(max_norm)
        self.norm = torch.zeros((), dtype=torch.float32, device=self.parameters[0].device)

    def __call__(self) -> None:
        total = nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        self.norm.copy_(total)


def _check_seeds(seeds: int) -> int:
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an int >= 1, got {seeds!r}")
    return seeds


def _check_stacked(parameters: list[Tensor], seeds: int) -> None:
    for index, parameter in enumerate(parameters):
        if parameter.dim() == 0 or parameter.shape[0] != seeds:
            raise ValueError(
                f"parameter {index} has shape {tuple(parameter.shape)}; with {seeds} seeds "
                f"every parameter is stacked as ({seeds}, ...)"
            )


def seed_view(values: Tensor, like: Tensor) -> Tensor:
    """``values`` (K,) shaped to broadcast over ``like``'s leading K dimension."""
    return values.view(-1, *(1,) * (like.dim() - 1))


def seed_grad_norms(grads: list[Tensor], seeds: int) -> Tensor:
    """The (K,) 2-norms of K seeds' gradients, each over its own slices of every tensor alone:
    seed k's norm reads only seed k's elements, so another seed's values (NaN included)
    cannot change it by a bit.

    Compiled, one row reduction per tensor over its (K, -1) view (:func:`_row_norms`); else
    one foreach norm over the K x P slices (:func:`_slice_norms`), a single multi-tensor
    kernel, where the compiler would make each slice a reduction kernel of its own."""
    if torch.compiler.is_compiling():
        return _row_norms(grads, seeds)
    return _slice_norms(grads, seeds)


def _row_norms(grads: list[Tensor], seeds: int) -> Tensor:
    """Per tensor the K row norms of its (K, -1) view, then each seed's norm over its row of
    the (P, K) table."""
    table = torch.stack([torch.linalg.vector_norm(g.reshape(seeds, -1), dim=1) for g in grads])
    return torch.linalg.vector_norm(table, dim=0)


def _slice_norms(grads: list[Tensor], seeds: int) -> Tensor:
    """One foreach norm over the K x P slices, then each seed's column of the (P, K) table."""
    slices = [piece for grad in grads for piece in grad.unbind(0)]
    table = torch.stack(torch._foreach_norm(slices)).view(len(grads), seeds)
    return torch.linalg.vector_norm(table, dim=0)


class SeedGradNormClip(GradNormClip):
    """Clip each of K seeds' gradients to ``max_norm`` by its own 2-norm, never one norm across
    seeds; keep the K pre-clip norms in ``self.norm``, a preallocated (K,) float32 tensor.

    Every parameter is stacked as (K, ...); seed k's gradients scale by
    ``min(1, max_norm / (norm_k + 1e-6))``, torch's ``clip_grad_norm_`` formula, on the
    device. A seed whose norm is not finite gets non-finite gradients (as torch's would),
    which the non-finite guard then zeroes; the other seeds are untouched by it.
    """

    def __init__(self, parameters: Iterable[Tensor], max_norm: float, seeds: int) -> None:
        super().__init__(parameters, max_norm)
        self.seeds = _check_seeds(seeds)
        _check_stacked(self.parameters, seeds)
        self.norm = torch.zeros(seeds, dtype=torch.float32, device=self.parameters[0].device)

    def __call__(self) -> None:
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if not grads:
            self.norm.zero_()  # as clip_grad_norm_, which reports 0 for no gradients
            return
        norms = seed_grad_norms(grads, self.seeds)
        scale = (self.max_norm / (norms + 1e-6)).clamp_(max=1.0)
        # A list of broadcasting (K, 1, ...) factors: one multiply per gradient tensor.
        torch._foreach_mul_(grads, [seed_view(scale.to(g.dtype), g) for g in grads])
        self.norm.copy_(norms)


class JointGradNormClip(GradNormClip):
    """Clip ``parameters`` by one 2-norm over their gradients and the gradients another clip
    has just measured (``other.norm``, its pre-clip norm), as one ``clip_grad_norm_`` over
    both sets would; keep that joint norm in ``self.norm`` (what the non-finite guard reads)
    and this clip's own gradients' norm in ``self.own_norm``.

    CleanRL's PPO clips its actor's and critic's gradients together, by one norm; two steps
    that each clip their own network reproduce it when the second step's clip reads the
    first's norm. Per seed with ``seeds=K > 1`` (``other`` then a (K,) per-seed clip). A
    non-finite norm on either side makes the joint norm, and so the guard's skip, non-finite.
    """

    def __init__(self, parameters: Iterable[Tensor], max_norm: float, other: GradNormClip,
                 seeds: int = 1) -> None:
        super().__init__(parameters, max_norm)
        self.seeds = _check_seeds(seeds)
        if seeds > 1:
            _check_stacked(self.parameters, seeds)
        if other.norm.shape != (() if seeds == 1 else (seeds,)):
            raise ValueError(f"a joint clip of {seeds} seeds needs another clip of as many, "
                             f"got one whose norm has shape {tuple(other.norm.shape)}")
        self.other = other
        self.norm = torch.zeros(other.norm.shape, dtype=torch.float32,
                                device=self.parameters[0].device)
        self.own_norm = torch.zeros_like(self.norm)

    def __call__(self) -> None:
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if not grads:
            own = torch.zeros_like(self.norm)
        elif self.seeds > 1:
            own = seed_grad_norms(grads, self.seeds)
        else:
            own = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        joint = torch.linalg.vector_norm(torch.stack([own, self.other.norm.to(own.dtype)]),
                                         dim=0)
        if grads:
            scale = (self.max_norm / (joint + 1e-6)).clamp_(max=1.0)
            if self.seeds > 1:
                torch._foreach_mul_(grads, [seed_view(scale.to(g.dtype), g) for g in grads])
            else:
                torch._foreach_mul_(grads, scale)
        self.norm.copy_(joint)
        self.own_norm.copy_(own)


def clip_grad_norm(parameters: Iterable[Tensor], max_norm: float,
                   seeds: int = 1) -> GradNormClip:
    """A capture-safe :data:`~rl_graphstep.graphstep.GradientTransform` clipping
    ``parameters`` to ``max_norm``: one norm over all of them for ``seeds=1``, else each
    seed's own norm over its slices of parameters stacked as (K, ...)
    (:class:`SeedGradNormClip`)."""
    if _check_seeds(seeds) == 1:
        return GradNormClip(parameters, max_norm)
    return SeedGradNormClip(parameters, max_norm, seeds)


class _SeedLayout:
    """What an optimizer step over K stacked seeds changes, split by how a skip restores it.

    Per-seed tensors (the parameters, and state shaped as its parameter: Adam's ``exp_avg``,
    ``exp_avg_sq``) are restored seed by seed through 0/1 weights; each dtype's weights come from
    one gather of the (K,) ``keep`` by a precomputed index of every element's seed, so the
    restore is a gather and a foreach lerp whatever the number of tensors or seeds. Shared state (a
    0-dim tensor: Adam's ``step``) is restored only when every seed skips.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device,
                 seeds: int) -> None:
        per_seed: dict[torch.dtype, list[Tensor]] = {}
        shared: list[Tensor] = []
        for parameter in selected_parameters(optimizer):
            if parameter.is_floating_point() and parameter.device == device:
                per_seed.setdefault(parameter.dtype, []).append(parameter)
        for parameter, key, value in state_tensors(optimizer):
            if not (value.is_floating_point() and value.device == device):
                continue
            if value.shape == parameter.shape:
                per_seed.setdefault(value.dtype, []).append(value)
            elif value.dim() == 0:
                shared.append(value)
            else:
                raise ValueError(
                    f"{type(optimizer).__name__} state {key!r} has shape {tuple(value.shape)}, "
                    f"neither its parameter's {tuple(parameter.shape)} (one slice per seed) nor "
                    "a scalar shared by the seeds; a per-seed guard cannot restore it"
                )
        self.tensors = [t for group in per_seed.values() for t in group] + shared
        self.groups = [(group, [t.detach().clone() for t in group], self._seed_index(group, seeds))
                       for group in per_seed.values()]
        self.shared, self.shared_backups = shared, [t.detach().clone() for t in shared]

    @staticmethod
    def _seed_index(tensors: list[Tensor], seeds: int) -> Tensor:
        """Each element's seed, tensor after tensor (seed k's elements are its k-th slice)."""
        seed = torch.arange(seeds, dtype=torch.int32, device=tensors[0].device)
        return torch.cat([seed.repeat_interleave(t[0].numel()) for t in tensors])

    def back_up(self) -> None:
        for tensors, backups, _ in self.groups:
            torch._foreach_copy_(backups, tensors)
        if self.shared:
            torch._foreach_copy_(self.shared_backups, self.shared)

    def restore(self, keep: Tensor) -> None:
        """lerp(t, b, 1 - keep) per seed: one gather of the weights and one foreach lerp per
        dtype, exact at both ends (torch's lerp is ``t + w*(b - t)`` for w < 0.5, which is t at
        w=0, and ``b - (b - t)*(1 - w)`` otherwise, which is b at w=1)."""
        for tensors, backups, seed_index in self.groups:
            weights = (1.0 - keep.to(tensors[0].dtype)).index_select(0, seed_index)
            torch._foreach_lerp_(tensors, backups, _masks(weights, tensors))
        if self.shared:
            # One seed's step keeps the shared count's step (see NonFiniteGuard).
            stepped = keep.amax()
            torch._foreach_mul_(self.shared, stepped)
            torch._foreach_addcmul_(self.shared, self.shared_backups,
                                    [1.0 - stepped] * len(self.shared))


def _masks(flat: Tensor, tensors: list[Tensor]) -> list[Tensor]:
    """``flat`` cut into views shaped as ``tensors``, one after another."""
    pieces = flat.split([t.numel() for t in tensors])
    return [piece.view(t.shape) for piece, t in zip(pieces, tensors, strict=True)]


def _nothing_to_undo(keep: Tensor) -> bool:
    """On the CPU, eagerly, a finite update (every seed's) needs no backup and no restore:
    there the check costs no device sync, and skipping them saves a third of a seed group's
    eager update (the restore's masks cover every parameter and state element). On a GPU, in
    a graph or compiled, both always run, as data-dependent branches cannot."""
    return (keep.device.type == "cpu" and not torch.compiler.is_compiling()
            and bool(keep.all()))


class NonFiniteGuard:
    """Skips, on the device and without a host sync, an update whose loss or gradients are
    not finite, so one bad batch cannot corrupt the parameters.

    Before the optimizer step it zeroes the gradients of a bad update (so the step itself
    stays finite) and copies the parameters and optimizer state aside; after the step it
    puts them back exactly when the update was bad (on the CPU, eagerly, a finite update
    skips both: see :func:`_nothing_to_undo`). ``skipped`` counts skipped updates,
    ``consecutive`` the current run of them (both int64 device tensors).

    With ``seeds=K > 1`` every parameter is stacked as (K, ...) and each seed is guarded on
    its own: the loss is the (K,) per-seed losses, the gradient norm the (K,) per-seed norms,
    a bad seed's gradients are zeroed and its slices of the parameters and optimizer state
    restored, while the other seeds step as if it were not there; ``skipped`` and
    ``consecutive`` are (K,). State shared by the seeds, such as Adam's ``step`` (one count per
    parameter tensor, and torch's Adam has no per-seed one), is restored only when every seed
    skips: when some seeds skip, the count still advances, so a seed that skipped s updates
    bias-corrects with s steps more than it made. That changes its Adam update by a factor
    within 1 +- 0.5% from its 100th step on per skip (1 +- 0.03% from the 1,000th; up to 26%
    on its first steps), in proportion for a few skips, and a run with many skips stops
    anyway (``--nonfinite-limit``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device,
                 seeds: int = 1) -> None:
        self.optimizer = optimizer
        self.seeds = _check_seeds(seeds)
        counts = () if seeds == 1 else (seeds,)
        self.skipped = torch.zeros(counts, dtype=torch.int64, device=device)
        self.consecutive = torch.zeros(counts, dtype=torch.int64, device=device)
        # The tensors' device, indexed ("cuda" -> "cuda:0"), so that it compares equal to the
        # parameters' devices: with "cuda" nothing would be backed up and a skip not undone.
        self.device = self.skipped.device
        self._tensors: list[Tensor] = []
        self._backups: list[Tensor] = []
        self._layout: _SeedLayout | None = None
        if seeds > 1:
            _check_stacked(selected_parameters(optimizer), seeds)

    def _guarded(self) -> tuple[list[Tensor], list[Tensor]]:
        tensors = [
            t for t in (*selected_parameters(self.optimizer),
                        *(v for _, _, v in state_tensors(self.optimizer)))
            if t.is_floating_point() and t.device == self.device
        ]
        # The state appears after the first eager step; inside a graph this never changes.
        if len(tensors) != len(self._tensors) or any(
            a is not b for a, b in zip(tensors, self._tensors, strict=True)
        ):
            self._tensors, self._backups = tensors, [t.detach().clone() for t in tensors]
        return self._tensors, self._backups

    @torch.no_grad()
    def before_step(self, loss: Tensor, parameters: list[Tensor],
                    grad_norm: Tensor | None = None, *, masked_step: bool = False) -> Tensor:
        """Check the update, neutralise a bad one's gradients, back up what the step changes;
        returns the 0-dim float ``keep`` (1: finite update, 0: skip). ``grad_norm``: the
        gradients' total norm when already known (a clip computed it; it is finite exactly
        when every gradient is), saving its recomputation. ``masked_step``: the step itself
        leaves a skipped update (or seed) untouched (``maskedadam``), so nothing is
        neutralised or backed up and :meth:`after_step` is not called."""
        if self.seeds > 1:
            return self._before_seed_step(loss, parameters, grad_norm, masked_step)
        grads = [p.grad for p in parameters if p.grad is not None]
        finite = torch.isfinite(loss.detach())
        if grads:
            if grad_norm is None:
                grad_norm = torch.stack(torch._foreach_norm(grads)).sum()
            finite = finite & torch.isfinite(grad_norm)
            if not masked_step:
                for grad in grads:
                    grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
                torch._foreach_mul_(grads, finite.to(grads[0].dtype))
        self.skipped.add_(~finite)
        self.consecutive.mul_(~finite).add_(~finite)
        keep = finite.float()
        if not masked_step and not _nothing_to_undo(keep):
            tensors, backups = self._guarded()
            torch._foreach_copy_(backups, tensors)
        return keep

    @torch.no_grad()
    def after_step(self, keep: Tensor) -> None:
        """Undo the step when ``keep`` is 0: t*1 + b*0 = t and t*0 + b*1 = b, exactly (with
        K seeds ``keep`` is (K,), and each seed's slices follow its own factor)."""
        if _nothing_to_undo(keep):
            return
        if self.seeds > 1:
            self._restore_seeds(keep)
            return
        tensors, backups = self._guarded()
        torch._foreach_mul_(tensors, keep)
        torch._foreach_add_(tensors, torch._foreach_mul(backups, 1.0 - keep))

    def _seed_layout(self) -> _SeedLayout:
        layout = self._layout
        current = [t for t in (*selected_parameters(self.optimizer),
                               *(v for _, _, v in state_tensors(self.optimizer)))
                   if t.is_floating_point() and t.device == self.device]
        # As _guarded: rebuilt once the optimizer state appears, never inside a graph.
        if layout is None or len(current) != len(layout.tensors) or {id(t) for t in current} != {
                id(t) for t in layout.tensors}:
            layout = self._layout = _SeedLayout(self.optimizer, self.device, self.seeds)
        return layout

    def _before_seed_step(self, loss: Tensor, parameters: list[Tensor],
                          grad_norm: Tensor | None, masked_step: bool) -> Tensor:
        """:meth:`before_step` seed by seed: ``loss`` and ``grad_norm`` are (K,)."""
        shape = (self.seeds,)
        if loss.shape != shape:
            raise ValueError(f"with {self.seeds} seeds the guard takes the per-seed losses, "
                             f"shape {shape}, got {tuple(loss.shape)}")
        grads = [p.grad for p in parameters if p.grad is not None]
        finite = torch.isfinite(loss.detach())
        if grads:
            if grad_norm is None:
                grad_norm = seed_grad_norms(grads, self.seeds)
            elif grad_norm.shape != shape:
                raise ValueError(f"with {self.seeds} seeds the guard takes the per-seed "
                                 f"gradient norms, shape {shape}, got {tuple(grad_norm.shape)}")
            finite = finite & torch.isfinite(grad_norm)
            if not masked_step:
                for grad in grads:
                    grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
                keep = finite.to(grads[0].dtype)
                torch._foreach_mul_(grads, [seed_view(keep, g) for g in grads])
        self.skipped.add_(~finite)
        self.consecutive.mul_(~finite).add_(~finite)
        keep = finite.float()
        if not masked_step and not _nothing_to_undo(keep):
            self._back_up_seeds()
        return keep

    # The seed layout's backup and restore run outside the compiler. Compiled (Inductor, on a
    # GPU, inside a CUDA graph) they corrupted what they touch: the shared step counts read
    # values of other tensors, and one seed's data changed the others' parameters. Eagerly
    # they are a few multi-tensor kernels, captured with the rest of the step.
    @outside_compiler
    def _back_up_seeds(self) -> None:
        self._seed_layout().back_up()

    @outside_compiler
    def _restore_seeds(self, keep: Tensor) -> None:
        self._seed_layout().restore(keep)

    def reset(self) -> None:
        """Zero both counts (a capture's warm-up skips are not the run's)."""
        self.skipped.zero_()
        self.consecutive.zero_()
