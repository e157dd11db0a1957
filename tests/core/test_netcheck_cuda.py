"""On a GPU: the real sync debug mode catches a host sync in a custom actor's forward."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from netfixtures import ACT_SPACE, OBS_SPACE, build, line_of

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.core.netcheck import check_actor
from rl_graphstep.networks.builtin import DeterministicActor

pytestmark = pytest.mark.cuda


def test_item_in_forward_is_caught_on_cuda(tmp_path: Path) -> None:
    device = torch.device("cuda")
    path = tmp_path / "syncing_actor.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn


        class SyncingActor(nn.Module):
            def __init__(self, observation_space, action_space):
                super().__init__()
                self.linear = nn.Linear(observation_space.shape[0], action_space.shape[0])

            def forward(self, obs):
                a = torch.tanh(self.linear(obs))
                if a.max().item() > 2.0:  # HOST-SYNC
                    a = a * 0.5
                return a
    """))
    actor = build(f"{path}:SyncingActor").to(device)
    previous = torch.cuda.get_sync_debug_mode()
    with pytest.raises(ConfigError) as info:
        check_actor(actor, kind="deterministic", observation_size=5, action_size=3,
                    device=device)
    assert torch.cuda.get_sync_debug_mode() == previous
    message = str(info.value)
    assert message.startswith("SyncingActor.forward calls .item() at ")
    assert f"syncing_actor.py:{line_of(path, 'HOST-SYNC')} " in message
    check_actor(DeterministicActor(OBS_SPACE, ACT_SPACE, (8,)).to(device), kind="deterministic",
                observation_size=5, action_size=3, device=device)
