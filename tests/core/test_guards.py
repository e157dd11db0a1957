"""CPU tests of the gradient guards: gradient-norm clipping and the non-finite guard, for one
seed and per seed for K seeds stacked on a leading dimension."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import rl_graphstep.core.guards as guards
import rl_graphstep.core.update_body as update_body
from rl_graphstep.core.guards import (
    JointGradNormClip,
    NonFiniteGuard,
    _row_norms,
    _slice_norms,
    clip_grad_norm,
    seed_grad_norms,
)
from rl_graphstep.core.maskedadam import masked_adam_step
from rl_graphstep.core.update_body import UpdateBody
from rl_graphstep.graphstep import EagerAdaptationStep


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))


def mse(prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((prediction - targets) ** 2).mean()


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)


def test_clip_bounds_the_update_and_records_the_norm() -> None:
    module = mlp()
    start = [p.detach().clone() for p in module.parameters()]
    clip = clip_grad_norm(module.parameters(), max_norm=0.1)
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    inputs, targets = batch()
    reference = mlp()
    mse(reference(inputs), 100 * targets).backward()
    expected_norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in reference.parameters()])
    )
    step = EagerAdaptationStep.capture(module, optimizer, inputs, 100 * targets, mse,
                                       gradient_transform=clip)
    step(inputs, 100 * targets)
    assert expected_norm > 1.0  # clipping is active
    torch.testing.assert_close(clip.norm, expected_norm)
    moved = torch.linalg.vector_norm(
        torch.cat([(p - s).flatten() for p, s in zip(module.parameters(), start, strict=True)])
    )
    torch.testing.assert_close(moved, torch.tensor(0.1), rtol=1e-4, atol=0)


def test_clip_with_infinite_max_norm_only_records() -> None:
    module = mlp()
    clip = clip_grad_norm(module.parameters(), float("inf"))
    mse(module(torch.ones(3, 4)), torch.zeros(3, 2)).backward()
    grads = [p.grad.clone() for p in module.parameters()]
    clip()
    assert clip.norm > 0
    for p, g in zip(module.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)


@pytest.mark.parametrize(("parameters", "max_norm", "message"), [
    ([], 1.0, "needs at least one parameter that requires grad"),
    (None, 0.0, "max_norm must be > 0, got 0.0"),
])
def test_clip_refuses_bad_arguments(parameters: list | None, max_norm: float,
                                    message: str) -> None:
    with pytest.raises(ValueError, match=message):
        clip_grad_norm(mlp().parameters() if parameters is None else parameters, max_norm)


def guarded_update(guard: NonFiniteGuard, module: nn.Module, optimizer: torch.optim.Optimizer,
                   targets: torch.Tensor) -> None:
    """One update as the steps run it: backward, guard, step, undo when bad."""
    optimizer.zero_grad(set_to_none=True)
    loss = mse(module(torch.ones(8, 4)), targets)
    loss.backward()
    keep = guard.before_step(loss, list(module.parameters()))
    optimizer.step()
    guard.after_step(keep)


def test_a_non_finite_update_leaves_parameters_and_state_as_they_were() -> None:
    module = mlp()
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    guard = NonFiniteGuard(optimizer, torch.device("cpu"))
    good = torch.zeros(8, 2)
    guarded_update(guard, module, optimizer, good)  # creates the optimizer state
    params = [p.detach().clone() for p in module.parameters()]
    state = {k: v.clone() for k, v in optimizer.state[module[0].weight].items()}
    bad = good.clone()
    bad[2, 1] = float("nan")
    for _ in range(2):
        guarded_update(guard, module, optimizer, bad)
    assert (guard.skipped.item(), guard.consecutive.item()) == (2, 2)
    for p, b in zip(module.parameters(), params, strict=True):
        assert torch.equal(p, b)
    for key, value in state.items():
        assert torch.equal(optimizer.state[module[0].weight][key], value), key
    guarded_update(guard, module, optimizer, good)
    assert (guard.skipped.item(), guard.consecutive.item()) == (2, 0)
    assert not torch.equal(module[0].weight, params[0])
    guard.reset()
    assert (guard.skipped.item(), guard.consecutive.item()) == (0, 0)


@pytest.mark.parametrize("adam", [
    lambda parameters: torch.optim.Adam(parameters, lr=0.1),
    lambda parameters: torch.optim.AdamW(parameters, lr=0.1, weight_decay=0.1),
], ids=["adam", "adamw"])
def test_traced_one_run_skips_a_bad_update_in_the_masked_adam_step(
        adam, monkeypatch: pytest.MonkeyPatch) -> None:
    """Traced as a GPU run compiles it: the masked step skips the NaN update itself (no
    backup, no restore), and the run learns on afterwards (AdamW's weight decay, of
    --weight-decay, skipped with the rest)."""
    real, calls = torch.compile, []
    monkeypatch.setattr(torch, "compile",
                        lambda function, **kwargs: real(function, **{**kwargs, "backend": "eager"}))
    monkeypatch.setattr(update_body, "masked_adam_step", lambda *args: calls.append(
        torch.compiler.is_compiling()) or masked_adam_step(*args))
    monkeypatch.setattr(guards.NonFiniteGuard, "after_step", lambda *args: calls.append("undo"))
    torch._dynamo.reset()
    module = mlp()
    optimizer = adam(module.parameters())
    body = UpdateBody(module, optimizer, mse, clip_grad_norm(module.parameters(), 1.0),
                      NonFiniteGuard(optimizer, torch.device("cpu")), compile=True)
    inputs, targets = batch()
    body(inputs, targets)  # uncompiled: creates the state
    body(inputs, targets)
    before = [t.clone() for p in module.parameters()
              for t in (p, *optimizer.state[p].values())]
    bad = targets.clone()
    bad[2, 1] = float("nan")
    body(inputs, bad)
    after = [t for p in module.parameters() for t in (p, *optimizer.state[p].values())]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert body.guard is not None and body.guard.skipped.item() == 1
    body(inputs, targets)
    assert not torch.equal(module[0].weight, before[0]) and not body.uncompiled_parts
    assert calls == ["undo", True, True, True]  # the first, uncompiled call: torch's step


# --------------------------------------------------------------------------------------------
# K seeds stacked on a leading dimension
# --------------------------------------------------------------------------------------------

SEEDS = 3


class StackedMLP(nn.Module):
    """K two-layer MLPs, one per seed, stacked by hand as (K, ...) parameters; bmm forward."""

    def __init__(self, seeds: int = SEEDS, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        nets = [mlp(seed + k) for k in range(seeds)]
        self.w1 = nn.Parameter(torch.stack([n[0].weight.detach().T for n in nets]).contiguous())
        self.b1 = nn.Parameter(torch.stack([n[0].bias.detach()[None] for n in nets]))
        self.w2 = nn.Parameter(torch.stack([n[2].weight.detach().T for n in nets]).contiguous())
        self.b2 = nn.Parameter(torch.stack([n[2].bias.detach()[None] for n in nets]))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:  # (K, B, 4) -> (K, B, 2)
        hidden = torch.baddbmm(self.b1, inputs, self.w1).relu()
        return torch.baddbmm(self.b2, hidden, self.w2)


def seed_mse(prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The (K,) per-seed mean squared errors."""
    return ((prediction - targets) ** 2).mean(dim=(1, 2))


def seed_batch(seed: int = 1, seeds: int = SEEDS) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # Seed k's targets scaled by 10**k: gradient norms of about 1, 10 and 160.
    scale = torch.tensor([10.0**k for k in range(seeds)]).view(-1, 1, 1)
    return torch.randn(seeds, 8, 4, generator=g), scale * torch.randn(seeds, 8, 2, generator=g)


def stacked_grads(module: nn.Module, inputs: torch.Tensor,
                  targets: torch.Tensor) -> list[torch.Tensor]:
    module.zero_grad(set_to_none=True)
    seed_mse(module(inputs), targets).sum().backward()
    return [p.grad for p in module.parameters()]


def test_a_seed_clip_is_torch_clip_grad_norm_on_each_seed_alone() -> None:
    module = StackedMLP()
    grads = [g.clone() for g in stacked_grads(module, *seed_batch())]
    clip = clip_grad_norm(module.parameters(), max_norm=5.0, seeds=SEEDS)
    clip()
    expected_norms = []
    for k in range(SEEDS):
        alone = [torch.zeros_like(g[k], requires_grad=True) for g in grads]
        for tensor, g in zip(alone, grads, strict=True):
            tensor.grad = g[k].clone()
        expected_norms.append(nn.utils.clip_grad_norm_(alone, max_norm=5.0))
        for tensor, p in zip(alone, module.parameters(), strict=True):
            torch.testing.assert_close(p.grad[k], tensor.grad)
    expected = torch.stack(expected_norms)
    assert clip.norm.shape == (SEEDS,) and clip.norm.dtype == torch.float32
    torch.testing.assert_close(clip.norm, expected)
    assert expected.min() < 5.0 < expected.max()  # the clip is active on some seeds only


@pytest.mark.parametrize("bad", [1e30, float("nan"), float("inf")])
def test_one_seeds_gradients_never_reach_another_seeds_clip(bad: float) -> None:
    def clipped(poison: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
        module = StackedMLP()
        grads = stacked_grads(module, *seed_batch())
        if poison:
            grads[1][0].mul_(bad)
            grads[3][0, 0, 1] = bad
        clip = clip_grad_norm(module.parameters(), max_norm=1.0, seeds=SEEDS)
        clip()
        return [g.clone() for g in grads], clip.norm.clone()

    (clean, clean_norm), (poisoned, poisoned_norm) = clipped(False), clipped(True)
    assert not torch.equal(clean_norm[0], poisoned_norm[0])
    assert torch.equal(clean_norm[1:], poisoned_norm[1:])
    for a, b in zip(clean, poisoned, strict=True):
        assert torch.equal(a[1:], b[1:])


def test_one_seed_clip_is_todays_clip() -> None:
    clip = clip_grad_norm(mlp().parameters(), 1.0, seeds=1)
    assert type(clip).__name__ == "GradNormClip" and clip.norm.shape == ()


@pytest.mark.parametrize(("seeds", "message"), [
    (0, "seeds must be an int >= 1, got 0"),
    (2, r"parameter 0 has shape \(3, 4, 16\); with 2 seeds every parameter is stacked"),
])
def test_a_seed_clip_refuses_bad_seeds(seeds: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        clip_grad_norm(StackedMLP().parameters(), 1.0, seeds=seeds)


def with_grads(*grads: list[float]) -> list[torch.Tensor]:
    """Leaf tensors whose gradients are ``grads``."""
    tensors = [torch.zeros(len(g), requires_grad=True) for g in grads]
    for tensor, g in zip(tensors, grads, strict=True):
        tensor.grad = torch.tensor(g)
    return tensors


def test_a_joint_clip_scales_by_the_norm_over_both_networks() -> None:
    """Own gradients of norm 5, the other clip's norm 12: joint norm 13; max 6.5 halves them."""
    own = with_grads([3.0, 0.0], [4.0])
    other = clip_grad_norm(with_grads([12.0]), 6.5)
    other()
    clip = JointGradNormClip(own, 6.5, other)
    clip()
    torch.testing.assert_close(clip.norm, torch.tensor(13.0))
    torch.testing.assert_close(clip.own_norm, torch.tensor(5.0))
    scale = 6.5 / (13.0 + 1e-6)
    torch.testing.assert_close(own[0].grad, torch.tensor([3.0 * scale, 0.0]))
    torch.testing.assert_close(own[1].grad, torch.tensor([4.0 * scale]))
    other.norm.fill_(0.0)  # joint norm 5 < 6.5: left as they are
    calm = with_grads([3.0], [4.0])
    JointGradNormClip(calm, 6.5, other)()
    assert calm[0].grad.item() == 3.0 and calm[1].grad.item() == 4.0


def test_a_joint_clip_is_torch_clip_grad_norm_over_both_sets() -> None:
    """What the second set's clip leaves equals one clip_grad_norm_ over both sets."""
    g = torch.Generator().manual_seed(3)
    first = [torch.randn(5, generator=g) for _ in range(2)]
    second = [torch.randn(7, generator=g) * 0.1 for _ in range(3)]
    together = with_grads(*[x.tolist() for x in first + second])
    expected = nn.utils.clip_grad_norm_(together, max_norm=0.5)
    actor = with_grads(*[x.tolist() for x in first])
    critic = with_grads(*[x.tolist() for x in second])
    actor_clip = clip_grad_norm(actor, 0.5)
    actor_clip()
    critic_clip = JointGradNormClip(critic, 0.5, actor_clip)
    critic_clip()
    assert expected > 0.5  # the clip acts
    torch.testing.assert_close(critic_clip.norm, expected)
    for mine, theirs in zip(critic, together[2:], strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad)
    alone = with_grads(*[x.tolist() for x in second])  # clipped by its own norm: untouched
    nn.utils.clip_grad_norm_(alone, 0.5)
    assert not torch.allclose(alone[0].grad, critic[0].grad)


def test_a_joint_clip_per_seed_keeps_the_seeds_apart() -> None:
    """Seed 0: own 5, other 12, halved; seed 1: own 1, other nan: its joint norm is nan (the
    guard skips that seed's update), and seed 0 is as if seed 1 were finite."""
    own = torch.zeros(2, 2, requires_grad=True)
    own.grad = torch.tensor([[3.0, 4.0], [0.6, 0.8]])
    other = clip_grad_norm([torch.zeros(2, 1, requires_grad=True)], 6.5, seeds=2)
    other.norm.copy_(torch.tensor([12.0, float("nan")]))
    clip = JointGradNormClip([own], 6.5, other, seeds=2)
    clip()
    assert clip.norm[0].item() == pytest.approx(13.0) and clip.norm[1].isnan()
    torch.testing.assert_close(clip.own_norm, torch.tensor([5.0, 1.0]))
    torch.testing.assert_close(own.grad[0], torch.tensor([1.5, 2.0]))
    assert own.grad[1].isnan().all()


def test_a_joint_clip_needs_another_clip_of_its_seeds() -> None:
    other = clip_grad_norm(mlp().parameters(), 1.0)
    with pytest.raises(ValueError, match=r"a joint clip of 3 seeds needs another clip of as "
                                         r"many, got one whose norm has shape \(\)"):
        JointGradNormClip(StackedMLP().parameters(), 1.0, other, seeds=3)


def seed_update_body(module: nn.Module, max_norm: float = 1.0, *, compile: bool = False
                     ) -> UpdateBody:
    """A per-seed clipped and guarded Adam update over the stacked seeds."""
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    return UpdateBody(module, optimizer, seed_mse,
                      clip_grad_norm(module.parameters(), max_norm, seeds=SEEDS),
                      NonFiniteGuard(optimizer, torch.device("cpu"), seeds=SEEDS), seeds=SEEDS,
                      compile=compile)


def seed_slices(body: UpdateBody, k: int) -> list[torch.Tensor]:
    """Seed k's parameters and Adam moments, copied."""
    state = body.optimizer.state
    return [t[k].clone() for p in body.parameters
            for t in (p, state[p]["exp_avg"], state[p]["exp_avg_sq"])]


def run_seed_updates(poison: dict[int, float], *, compile: bool = False
                     ) -> tuple[UpdateBody, list[list[torch.Tensor]]]:
    """Four updates; on the third, each seed in ``poison`` gets that value in one target.
    Returns the body and every seed's slices after each update."""
    body = seed_update_body(StackedMLP(), compile=compile)
    history = []
    for update in range(4):
        inputs, targets = seed_batch(seed=10 + update)
        if update == 2:
            for k, value in poison.items():
                targets[k, 3, 1] = value
        body(inputs, targets)
        history.append([seed_slices(body, k) for k in range(SEEDS)])
    return body, history


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "traced"])
def test_the_guard_skips_exactly_the_bad_seeds_update(compiled: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Eagerly, and traced by the compiler as a GPU run compiles it (its eager backend makes
    no code, fast on a CPU). Eagerly, torch's Adam steps between the guard's backup and
    restore; traced, the per-seed norms take their row form and the masked Adam step skips
    the bad seed itself, with no backup or restore (compiled on a GPU, those corrupted what
    they restore)."""
    real, rows, calls = torch.compile, [], []
    monkeypatch.setattr(torch, "compile",
                        lambda function, **kwargs: real(function, **{**kwargs, "backend": "eager"}))
    monkeypatch.setattr(guards, "_row_norms",
                        lambda grads, seeds: rows.append(seeds) or _row_norms(grads, seeds))
    for owner, name in ((guards._SeedLayout, "back_up"), (guards._SeedLayout, "restore"),
                        (update_body, "masked_adam_step")):
        function = getattr(owner, name)

        def recorded(*args, _function=function, _name=name):
            calls.append((_name, torch.compiler.is_compiling()))
            return _function(*args)
        monkeypatch.setattr(owner, name, recorded)
    torch._dynamo.reset()
    clean_body, clean = run_seed_updates({}, compile=compiled)
    body, guarded = run_seed_updates({1: float("nan")}, compile=compiled)
    assert bool(rows) == compiled and not body.uncompiled_parts
    # Eagerly on the CPU only the bad update backs up and restores (see _nothing_to_undo);
    # traced, every update after the first (uncompiled) one of each body steps masked.
    expected = ({("masked_adam_step", True)} if compiled
                else {("back_up", False), ("restore", False)})
    assert set(calls) == expected
    assert body.guard is not None
    assert body.guard.skipped.tolist() == [0, 1, 0]
    for update in range(4):
        for k in (0, 2):  # the other seeds update exactly as without the bad one
            for a, b in zip(clean[update][k], guarded[update][k], strict=True):
                assert torch.equal(a, b), (update, k)
    # The bad seed's parameters and moments are back to the bit where the update found them.
    for a, b in zip(guarded[1][1], guarded[2][1], strict=True):
        assert torch.equal(a, b)
    assert all(torch.isfinite(t).all() for t in guarded[3][1])
    assert not torch.equal(guarded[3][1][0], guarded[2][1][0])  # it learns again afterwards
    # Adam's step is one count for the stacked seeds: it advances when any seed steps.
    for p in body.parameters:
        assert body.optimizer.state[p]["step"].item() == 4
    assert body.guard.consecutive.tolist() == [0, 0, 0]
    assert clean_body.guard is not None and clean_body.guard.skipped.tolist() == [0, 0, 0]


def test_the_per_seed_counters_count_each_seed_alone() -> None:
    body = seed_update_body(StackedMLP())
    inputs, targets = seed_batch()
    bad = targets.clone()
    bad[0, 0, 0] = float("inf")
    bad[2, 1, 1] = float("nan")
    body(inputs, targets)
    body(inputs, bad)
    body(inputs, bad)
    assert body.guard is not None
    assert (body.guard.skipped.tolist(), body.guard.consecutive.tolist()) == ([2, 0, 2],
                                                                              [2, 0, 2])
    everyone = targets.clone()
    everyone[:, 0, 0] = float("nan")
    before = [p.detach().clone() for p in body.parameters]
    steps = [body.optimizer.state[p]["step"].clone() for p in body.parameters]
    body(inputs, everyone)
    assert (body.guard.skipped.tolist(), body.guard.consecutive.tolist()) == ([3, 1, 3],
                                                                              [3, 1, 3])
    # Every seed skipped: the shared step count is restored too, as with one seed.
    for p, b, s in zip(body.parameters, before, steps, strict=True):
        assert torch.equal(p, b) and torch.equal(body.optimizer.state[p]["step"], s)
    body(inputs, targets)
    assert body.guard.consecutive.tolist() == [0, 0, 0]
    body.guard.reset()
    assert body.guard.skipped.tolist() == [0, 0, 0]


def test_a_nan_loss_shows_in_its_seeds_gradient_norm_when_it_depends_on_the_parameters() -> None:
    module = StackedMLP()
    inputs, targets = seed_batch()
    targets[1, 2, 0] = float("nan")
    losses = seed_mse(module(inputs), targets)
    losses.sum().backward()
    norms = seed_grad_norms([p.grad for p in module.parameters()], SEEDS)
    assert torch.isnan(losses[1]) and torch.isnan(norms[1])
    assert torch.isfinite(losses[[0, 2]]).all() and torch.isfinite(norms[[0, 2]]).all()


@pytest.mark.parametrize("norms", [_row_norms, _slice_norms])
def test_both_forms_of_the_per_seed_norms_keep_the_seeds_apart(norms: Callable) -> None:
    """The compiled form (row reductions) and the eager one (a foreach norm over slices):
    each the seeds' own norms, and a seed's NaN or huge gradients change no other seed's
    norm by a bit."""
    torch.manual_seed(0)
    grads = [torch.randn(SEEDS, 4, 5), torch.randn(SEEDS, 1, 5), torch.randn(SEEDS, 7)]
    expected = torch.stack([torch.cat([g[k].reshape(-1) for g in grads]).norm()
                            for k in range(SEEDS)])
    clean = norms(grads, SEEDS)
    torch.testing.assert_close(clean, expected, rtol=1e-6, atol=0)
    for bad in (float("nan"), 1e30):
        changed = [g.clone() for g in grads]
        changed[0][1, 2, 3] = bad
        changed[2][1] *= 1e3
        result = norms(changed, SEEDS)
        assert torch.equal(result[[0, 2]], clean[[0, 2]])
        assert not torch.equal(result[1], clean[1])


def nan_seed_1_loss(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Per-seed losses where seed 1's is NaN through a path that does (``scaled``) or does not
    (``added``, ``masked``) carry the NaN into its gradients."""
    nan = torch.tensor([0.0, float("nan"), 0.0]).view(-1, 1, 1)

    def loss(prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        error = (prediction - targets) ** 2
        if kind == "scaled":  # a NaN constant times the parameters' error
            error = error * (1.0 + nan)
        elif kind == "added":  # a NaN constant beside it: its gradient is the error's
            error = error + nan
        else:  # a NaN in the branch where() does not take the gradient of
            error = torch.where(nan.isnan(), nan, error)
        return error.mean(dim=(1, 2))

    return loss


@pytest.mark.parametrize(("kind", "norm_is_nan"), [
    ("scaled", True), ("added", False), ("masked", False),
])
def test_the_per_seed_losses_catch_a_nan_the_gradients_miss(kind: str,
                                                             norm_is_nan: bool) -> None:
    module = StackedMLP()
    start = [p.detach().clone() for p in module.parameters()]
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    guard = NonFiniteGuard(optimizer, torch.device("cpu"), seeds=SEEDS)
    record = clip_grad_norm(module.parameters(), float("inf"), seeds=SEEDS)
    body = UpdateBody(module, optimizer, nan_seed_1_loss(kind), record, guard, seeds=SEEDS)
    losses = body(*seed_batch())
    assert torch.isnan(losses[1]) and bool(torch.isnan(record.norm[1])) == norm_is_nan
    assert guard.skipped.tolist() == [0, 1, 0]
    for p, s in zip(module.parameters(), start, strict=True):
        assert torch.equal(p[1], s[1]) and not torch.equal(p[0], s[0])


def test_a_seed_update_checks_its_pieces() -> None:
    module = StackedMLP()
    optimizer = torch.optim.Adam(module.parameters())
    with pytest.raises(ValueError, match=r"expected one loss per seed \(shape \(3,\)\)"):
        UpdateBody(module, optimizer, mse, None, seeds=SEEDS)(*seed_batch())
    with pytest.raises(ValueError, match=r"clip_grad_norm\(parameters, max_norm, seeds=3\)"):
        UpdateBody(module, optimizer, seed_mse, clip_grad_norm(module.parameters(), 1.0),
                   seeds=SEEDS)
    with pytest.raises(ValueError, match="the update has 3 seeds, its guard 1"):
        UpdateBody(module, optimizer, seed_mse, None,
                   NonFiniteGuard(optimizer, torch.device("cpu")), seeds=SEEDS)
    guard = NonFiniteGuard(optimizer, torch.device("cpu"), seeds=SEEDS)
    with pytest.raises(ValueError, match=r"takes the per-seed losses, shape \(3,\), got \(\)"):
        guard.before_step(torch.zeros(()), list(module.parameters()))
    with pytest.raises(ValueError, match=r"with 2 seeds every parameter is stacked"):
        NonFiniteGuard(optimizer, torch.device("cpu"), seeds=2)
