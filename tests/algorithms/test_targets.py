"""Target networks' Polyak averaging: compiled, it averages as the lerp does; where the
compiler fails it runs uncompiled, with a warning."""

from __future__ import annotations

import copy

import pytest
import torch

from rl_graphstep.algorithms.targets import PolyakAverage


def failing_compile(function: object, **_: object) -> object:
    def compiled(*args: object) -> None:
        raise RuntimeError("the compiler gave up")
    return compiled


def test_a_target_update_is_the_lerp_by_tau_in_place() -> None:
    target, source = polyak_pair(2)
    tensors = list(target.parameters())
    expected = [t + 0.05 * (s - t) for t, s in zip(target.parameters(), source.parameters(),
                                                    strict=True)]
    PolyakAverage([(target, source)], tau=0.05)()
    # The same tensors, in place.
    assert all(t is u for t, u in zip(target.parameters(), tensors, strict=True))
    for t, e in zip(target.parameters(), expected, strict=True):
        torch.testing.assert_close(t, e)


def test_pairs_of_other_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="each target network must have its source's "
                                         "parameters"):
        PolyakAverage([(torch.nn.Linear(2, 2), torch.nn.Sequential())], tau=0.1)


def polyak_pair(seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A source network and its target, which differ (as after some training)."""
    torch.manual_seed(seed)
    source = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    target = copy.deepcopy(source).requires_grad_(False)
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(torch.randn_like(parameter))
    return target, source


def test_a_compiled_target_update_averages_as_the_lerp_does() -> None:
    target, source = polyak_pair(0)
    reference = copy.deepcopy(target)
    compiled = PolyakAverage([(target, source)], tau=0.05)
    eager = PolyakAverage([(reference, source)], tau=0.05)
    compiled.compile()
    assert compiled._compiled is not None
    for t, r in zip(target.parameters(), reference.parameters(), strict=True):
        assert torch.equal(t, r)  # compiling it moved no target
    for _ in range(3):
        compiled()
        eager()
    start = polyak_pair(0)[0].parameters()
    for t, r, s in zip(target.parameters(), reference.parameters(), start, strict=True):
        torch.testing.assert_close(t, r, rtol=1e-6, atol=1e-7)
        assert not torch.equal(t, s)  # the three averages moved every tensor


def test_a_target_update_the_compiler_fails_on_runs_uncompiled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", failing_compile)
    target, source = polyak_pair(1)
    reference = copy.deepcopy(target)
    average = PolyakAverage([(target, source)], tau=0.05)
    with pytest.warns(UserWarning) as warned:
        average.compile()
    assert [str(w.message) for w in warned] == [
        "torch.compile failed on the target update (RuntimeError: the compiler gave up); "
        "it runs uncompiled"]
    average()
    torch._foreach_lerp_(list(reference.parameters()), list(source.parameters()), 0.05)
    for t, r in zip(target.parameters(), reference.parameters(), strict=True):
        assert torch.equal(t, r)
