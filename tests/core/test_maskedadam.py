"""The masked Adam step of a compiled seed group: torch's Adam for the kept seeds, nothing at
all for the skipped ones."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from rl_graphstep.core.maskedadam import masked_adam_step, supports_masked_step

SEEDS = 3


def stacked(seed: int = 0) -> list[torch.nn.Parameter]:
    """Three seeds' weights and biases, stacked as (K, ...)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(SEEDS, 5, 4, generator=generator)),
            torch.nn.Parameter(torch.randn(SEEDS, 5, generator=generator))]


def grads(update: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + update)
    return [torch.randn(SEEDS, 5, 4, generator=generator),
            torch.randn(SEEDS, 5, generator=generator)]


def adam(parameters: list[torch.nn.Parameter]) -> torch.optim.Adam:
    optimizer = torch.optim.Adam(parameters, lr=0.01, foreach=False)
    for parameter in parameters:  # the state as a first (eager) step leaves it
        optimizer.state[parameter] = {"step": torch.tensor(0.0),
                                      "exp_avg": torch.zeros_like(parameter),
                                      "exp_avg_sq": torch.zeros_like(parameter)}
    return optimizer


def run(keeps: list[list[float]], *, masked: bool, make: Callable[..., torch.optim.Optimizer]
        | None = None) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """``keeps``' updates of the stacked parameters, by ``make``'s optimizer (Adam when None),
    through the masked step or the optimizer's own."""
    parameters = stacked()
    optimizer = (make or adam)(parameters)
    for update, keep in enumerate(keeps):
        for parameter, grad in zip(parameters, grads(update), strict=True):
            parameter.grad = grad.clone()
        if masked:
            masked_adam_step(optimizer, torch.tensor(keep))
        else:
            optimizer.step()
    return [p.detach().clone() for p in parameters], optimizer


def slices(parameters: list[torch.Tensor], optimizer: torch.optim.Adam, k: int
           ) -> list[torch.Tensor]:
    """Seed k's parameters and moments."""
    return [t[k] for p, live in zip(parameters, optimizer.param_groups[0]["params"], strict=True)
            for t in (p, optimizer.state[live]["exp_avg"], optimizer.state[live]["exp_avg_sq"])]


def test_every_seed_kept_is_torchs_adam() -> None:
    """Up to rounding: the same formula, its operations in another order."""
    ones = [[1.0] * SEEDS] * 5
    masked, masked_optimizer = run(ones, masked=True)
    torchs, torch_optimizer = run(ones, masked=False)
    for a, b in zip(masked, torchs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for p, q in zip(masked_optimizer.param_groups[0]["params"],
                    torch_optimizer.param_groups[0]["params"], strict=True):
        assert masked_optimizer.state[p]["step"].item() == torch_optimizer.state[q]["step"] == 5
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(masked_optimizer.state[p][key],
                                       torch_optimizer.state[q][key], rtol=1e-5, atol=1e-6)


def test_a_skipped_seed_keeps_everything_and_the_others_step_as_without_it() -> None:
    ones = [[1.0] * SEEDS] * 3
    skips = [[1.0] * SEEDS, [1.0, 0.0, 1.0], [1.0, 0.0, 1.0]]
    clean, clean_optimizer = run(ones, masked=True)
    first, first_optimizer = run(skips[:1], masked=True)
    skipped, skipped_optimizer = run(skips, masked=True)
    for k in (0, 2):  # the kept seeds: to the bit as if nobody skipped
        for a, b in zip(slices(clean, clean_optimizer, k), slices(skipped, skipped_optimizer, k),
                        strict=True):
            assert torch.equal(a, b)
    # Seed 1, skipped twice: its parameters and moments are where the first update left them.
    for a, b in zip(slices(first, first_optimizer, 1), slices(skipped, skipped_optimizer, 1),
                    strict=True):
        assert torch.equal(a, b)
    # One step count for the stacked seeds: it advanced with the seeds that stepped.
    assert all(skipped_optimizer.state[p]["step"].item() == 3
               for p in skipped_optimizer.param_groups[0]["params"])


def test_every_seed_skipped_changes_nothing_not_even_the_step() -> None:
    before, before_optimizer = run([[1.0] * SEEDS], masked=True)
    after, after_optimizer = run([[1.0] * SEEDS, [0.0] * SEEDS], masked=True)
    for k in range(SEEDS):
        for a, b in zip(slices(before, before_optimizer, k), slices(after, after_optimizer, k),
                        strict=True):
            assert torch.equal(a, b)
    assert all(after_optimizer.state[p]["step"].item() == 1
               for p in after_optimizer.param_groups[0]["params"])


def test_non_finite_gradients_of_a_skipped_seed_reach_nothing() -> None:
    parameters = stacked()
    optimizer = adam(parameters)
    for parameter, grad in zip(parameters, grads(0), strict=True):
        grad[1] = float("nan")
        parameter.grad = grad
    originals = [p.detach().clone() for p in parameters]
    masked_adam_step(optimizer, torch.tensor([1.0, 0.0, 1.0]))
    for parameter, original in zip(parameters, originals, strict=True):
        assert torch.equal(parameter[1], original[1]) and torch.isfinite(parameter).all()
        assert not torch.equal(parameter[0], original[0])
        assert torch.isfinite(optimizer.state[parameter]["exp_avg"]).all()


def test_one_run_steps_whole_or_not_at_all() -> None:
    """A 0-dim ``keep``: one run's step, a scalar parameter included."""
    scalar = torch.nn.Parameter(torch.tensor(0.5))
    matrix = torch.nn.Parameter(torch.ones(2, 3))
    masked, reference = adam([scalar, matrix]), torch.optim.Adam(
        [torch.nn.Parameter(scalar.detach().clone()),
         torch.nn.Parameter(matrix.detach().clone())], lr=0.01, foreach=False)
    for keep in (1.0, 0.0, 1.0):
        for optimizer in (masked, reference):
            for parameter in optimizer.param_groups[0]["params"]:
                parameter.grad = torch.full_like(parameter, 0.3)
        before = [p.detach().clone() for p in (scalar, matrix)]
        masked_adam_step(masked, torch.tensor(keep))
        if keep:
            reference.step()
            for ours, torchs in zip((scalar, matrix), reference.param_groups[0]["params"],
                                    strict=True):
                torch.testing.assert_close(ours, torchs, rtol=1e-5, atol=1e-6)
        else:
            assert all(torch.equal(p, b) for p, b in zip((scalar, matrix), before, strict=True))
    assert masked.state[scalar]["step"].item() == 2


@pytest.mark.parametrize(("make", "expected"), [
    (lambda ps: torch.optim.Adam(ps), True),
    (lambda ps: torch.optim.Adam(ps, amsgrad=True), False),
    (lambda ps: torch.optim.Adam(ps, weight_decay=0.01), False),
    (lambda ps: torch.optim.Adam(ps, weight_decay=0.01, decoupled_weight_decay=True), True),
    (lambda ps: torch.optim.Adam(ps, maximize=True), False),
    (lambda ps: torch.optim.AdamW(ps), True),
    (lambda ps: torch.optim.AdamW(ps, weight_decay=0.0), True),
    (lambda ps: torch.optim.AdamW(ps, amsgrad=True), False),
    (lambda ps: torch.optim.SGD(ps, lr=0.1), False),
], ids=["adam", "amsgrad", "l2-weight-decay", "decoupled-weight-decay", "maximize", "adamw",
        "adamw-no-decay", "adamw-amsgrad", "sgd"])
def test_only_adam_and_adamw_step_masked(make, expected: bool) -> None:
    """Adam's L2 decay (added to the gradient) is not what the masked step computes; AdamW's
    decoupled one is."""
    assert supports_masked_step(make(stacked())) is expected


@pytest.mark.parametrize(("capturable", "expected"), [(False, False), (True, True)])
def test_a_device_adam_steps_masked_only_with_its_step_counts_on_the_device(
        capturable: bool, expected: bool) -> None:
    """A non-capturable Adam on a GPU counts its steps on the CPU, which the device's keep
    cannot advance without a copy to the host (meta parameters stand in for the GPU's)."""
    parameters = [torch.nn.Parameter(torch.empty(SEEDS, 5, device="meta"))]
    optimizer = torch.optim.Adam(parameters, capturable=capturable, foreach=False)
    assert supports_masked_step(optimizer) is expected


def adamw(parameters: list[torch.nn.Parameter], weight_decay: float = 0.1) -> torch.optim.AdamW:
    """AdamW with two groups, the second undecayed (as SAC's temperature is), and the state
    a first eager step leaves."""
    optimizer = torch.optim.AdamW([{"params": parameters[:1]},
                                   {"params": parameters[1:], "weight_decay": 0.0}],
                                  lr=0.01, weight_decay=weight_decay, foreach=False)
    for parameter in parameters:
        optimizer.state[parameter] = {"step": torch.tensor(0.0),
                                      "exp_avg": torch.zeros_like(parameter),
                                      "exp_avg_sq": torch.zeros_like(parameter)}
    return optimizer


def test_a_first_adamw_step_by_hand_and_as_torchs() -> None:
    """One step from zero moments: m = (1 - b1) g, v = (1 - b2) g^2, so m / (1 - b1) = g and
    sqrt(v / (1 - b2)) = |g|, and p' = p (1 - lr wd) - lr sign(g) (eps aside)."""
    start = torch.tensor([[2.0, -1.0], [0.5, 4.0]]), torch.tensor([3.0, -2.0])
    gradients = torch.tensor([[0.5, -0.25], [1.0, 2.0]]), torch.tensor([-1.0, 0.5])
    ours = [torch.nn.Parameter(t.clone()) for t in start]
    torchs = [torch.nn.Parameter(t.clone()) for t in start]
    masked = adamw(ours, weight_decay=0.1)
    reference = torch.optim.AdamW([{"params": torchs[:1]},
                                   {"params": torchs[1:], "weight_decay": 0.0}],
                                  lr=0.01, weight_decay=0.1, foreach=False)
    for parameters in (ours, torchs):
        for parameter, gradient in zip(parameters, gradients, strict=True):
            parameter.grad = gradient.clone()
    masked_adam_step(masked, torch.tensor(1.0))
    reference.step()
    # 2 * 0.999 - 0.01, -1 * 0.999 + 0.01, 0.5 * 0.999 - 0.01, 4 * 0.999 - 0.01
    torch.testing.assert_close(ours[0].detach(), torch.tensor([[1.988, -0.989], [0.4895, 3.986]]),
                               rtol=0, atol=1e-6)
    # The undecayed group (SAC's temperature's): Adam's step alone.
    torch.testing.assert_close(ours[1].detach(), torch.tensor([3.01, -2.01]), rtol=0, atol=1e-6)
    for a, b in zip(ours, torchs, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-6)


def run_adamw(keeps: list[list[float]], *, masked: bool
              ) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    return run(keeps, masked=masked, make=adamw)


def test_every_seed_kept_is_torchs_adamw() -> None:
    ones = [[1.0] * SEEDS] * 5
    masked, masked_optimizer = run_adamw(ones, masked=True)
    torchs, torch_optimizer = run_adamw(ones, masked=False)
    plain, _ = run(ones, masked=False)
    for a, b in zip(masked, torchs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # The decayed group moved away from Adam's result, the undecayed one did not.
    assert (masked[0] - plain[0]).abs().max() > 1e-4
    torch.testing.assert_close(masked[1], plain[1], rtol=0, atol=1e-6)
    for p, q in zip(masked_optimizer.state, torch_optimizer.state, strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(masked_optimizer.state[p][key],
                                       torch_optimizer.state[q][key], rtol=0, atol=1e-6)


def test_a_skipped_adamw_seed_keeps_its_parameters_and_moments() -> None:
    """The decay is part of the skipped step: a skipped seed does not even shrink."""
    ones = [[1.0] * SEEDS] * 3
    skips = [[1.0] * SEEDS, [1.0, 0.0, 1.0], [1.0, 0.0, 1.0]]
    clean, clean_optimizer = run_adamw(ones, masked=True)
    first, first_optimizer = run_adamw(skips[:1], masked=True)
    skipped, skipped_optimizer = run_adamw(skips, masked=True)
    for k in (0, 2):
        for a, b in zip(adamw_slices(clean, clean_optimizer, k),
                        adamw_slices(skipped, skipped_optimizer, k), strict=True):
            assert torch.equal(a, b)
    for a, b in zip(adamw_slices(first, first_optimizer, 1),
                    adamw_slices(skipped, skipped_optimizer, 1), strict=True):
        assert torch.equal(a, b)


def adamw_slices(parameters: list[torch.Tensor], optimizer: torch.optim.AdamW, k: int
                 ) -> list[torch.Tensor]:
    """Seed k's parameters and moments, over both groups."""
    live = [p for group in optimizer.param_groups for p in group["params"]]
    return [t[k] for p, q in zip(parameters, live, strict=True)
            for t in (p, optimizer.state[q]["exp_avg"], optimizer.state[q]["exp_avg_sq"])]


def test_a_skipped_adamw_step_of_one_run_changes_nothing() -> None:
    weight = torch.nn.Parameter(torch.tensor([[2.0, -1.0], [0.5, 4.0]]))
    bias = torch.nn.Parameter(torch.tensor([3.0, -2.0]))
    optimizer = adamw([weight, bias])
    for parameter in (weight, bias):
        parameter.grad = torch.full_like(parameter, 0.3)
    masked_adam_step(optimizer, torch.tensor(1.0))
    before = [t.clone() for p in (weight, bias)
              for t in (p.detach(), *optimizer.state[p].values())]
    for parameter in (weight, bias):
        parameter.grad = torch.full_like(parameter, float("nan"))
    masked_adam_step(optimizer, torch.tensor(0.0))
    after = [t for p in (weight, bias) for t in (p.detach(), *optimizer.state[p].values())]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
