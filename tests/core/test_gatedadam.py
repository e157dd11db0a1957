"""GatedAdam: open, it steps as torch's Adam; closed, a run or a seed keeps its parameters and
moments to the bit; its state dict is Adam's."""

from __future__ import annotations

import pytest
import torch

from rl_graphstep.core.gatedadam import GatedAdam


def steps(optimizer: torch.optim.Optimizer, parameter: torch.Tensor, count: int) -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(count):
        parameter.grad = torch.randn(parameter.shape, generator=generator)
        optimizer.step()


def test_an_open_gate_steps_as_torchs_adam() -> None:
    gated, plain = torch.ones(3, 4, requires_grad=True), torch.ones(3, 4, requires_grad=True)
    rate = torch.tensor(0.01)
    steps(GatedAdam([gated], torch.ones(()), lr=rate, eps=1e-5), gated, 5)
    steps(torch.optim.Adam([plain], lr=0.01, eps=1e-5), plain, 5)
    torch.testing.assert_close(gated, plain)


def test_a_closed_gate_holds_parameters_and_moments() -> None:
    parameter = torch.ones(3, 4, requires_grad=True)
    gate = torch.ones(())
    optimizer = GatedAdam([parameter], gate, lr=0.01)
    steps(optimizer, parameter, 2)
    before = parameter.detach().clone()
    moments = {k: v.clone() for k, v in optimizer.state[parameter].items()}
    gate.fill_(0.0)
    steps(optimizer, parameter, 3)
    assert torch.equal(parameter, before)
    for key, value in optimizer.state[parameter].items():
        assert torch.equal(value, moments[key]), key
    gate.fill_(1.0)
    steps(optimizer, parameter, 1)
    assert not torch.equal(parameter, before)


def test_each_seed_follows_its_own_gate() -> None:
    parameter = torch.ones(2, 5, requires_grad=True)  # seeds stacked on dimension 0
    gate = torch.tensor([1.0, 0.0])
    optimizer = GatedAdam([parameter], gate, lr=0.01)
    steps(optimizer, parameter, 3)
    assert torch.equal(parameter[1], torch.ones(5))
    assert torch.equal(optimizer.state[parameter]["exp_avg"][1], torch.zeros(5))
    assert not torch.equal(parameter[0], torch.ones(5))


def test_its_state_loads_into_a_plain_adam() -> None:
    parameter = torch.ones(4, requires_grad=True)
    optimizer = GatedAdam([parameter], torch.ones(()), lr=0.01)
    steps(optimizer, parameter, 2)
    plain = torch.optim.Adam([torch.ones(4, requires_grad=True)], lr=0.01)
    plain.load_state_dict(optimizer.state_dict())
    assert plain.state_dict()["state"][0]["step"].item() == 2.0


@pytest.mark.parametrize("option", ["amsgrad", "maximize", "weight_decay"])
def test_what_the_masked_step_leaves_out_is_refused(option: str) -> None:
    with pytest.raises(ValueError, match=f"GatedAdam does not support {option}"):
        GatedAdam([torch.ones(2, requires_grad=True)], torch.ones(()), **{option: 0.1
                  if option == "weight_decay" else True})
