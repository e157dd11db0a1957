"""Logger: device-side interval means, what lands in the event file, and closing on errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.run.logger import EVENT_QUEUE, Logger, to_markdown_table
from rl_graphstep.settings.config import Config


def read_events(run_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def test_write_returns_interval_means_and_resets(tmp_path: Path) -> None:
    intervals = [
        {"losses/qf": [1.0, 2.0, 3.0], "losses/actor": [0.5, 1.5]},
        {"losses/qf": [4.0], "losses/actor": [-2.0, 2.0, 6.0, 10.0]},
        {"losses/qf": [0.25, 0.75]},
    ]
    expected = [
        {"losses/qf": 2.0, "losses/actor": 1.0},
        {"losses/qf": 4.0, "losses/actor": 4.0},
        {"losses/qf": 0.5},
    ]
    with Logger(tmp_path) as logger:
        for step, (values, means) in enumerate(zip(intervals, expected, strict=True)):
            for i in range(max(len(v) for v in values.values())):
                logger.accumulate({k: torch.tensor(v[i]) for k, v in values.items() if i < len(v)})
            assert logger.write(step * 100) == means
            assert logger.write(step * 100 + 1) == {}  # reset: nothing left to write


def test_accumulate_keeps_sums_on_the_values_device(tmp_path: Path) -> None:
    with Logger(tmp_path) as logger:
        logger.accumulate({"a": torch.tensor(1, dtype=torch.int64)})
        logger.accumulate({"a": torch.tensor(2.0, requires_grad=True) * 1})
        assert logger.sums._sums["a"].device == torch.device("cpu")
        assert logger.write(0) == {"a": 1.5}
        with pytest.raises(ValueError, match="must be a 0-dim tensor"):
            logger.accumulate({"b": torch.ones(2)})


def test_metric_sums_added_on_the_device_and_counted_apart_keep_their_tensors() -> None:
    """The split a graph uses: the sums made once, the add recorded (here: run), the count
    made per replay; taking the means zeroes the same tensors, so a graph adds on."""
    sums = MetricSums()
    critic = {"losses/critic": torch.tensor(0.0)}
    both = {"losses/critic": torch.tensor(0.0), "losses/actor": torch.tensor(0.0)}
    keys = sums.prepare(critic), sums.prepare(both)
    tensors = dict(sums._sums)
    for value in (1.0, 2.0, 6.0):  # the graph writes its live outputs, then adds them
        critic["losses/critic"].fill_(value)
        sums.add_on_device(critic)
        sums.count(keys[0])
    both["losses/critic"].fill_(3.0)
    both["losses/actor"].fill_(-4.0)
    sums.add_on_device(both)
    sums.count(keys[1])
    assert sums.take() == {"losses/critic": 3.0, "losses/actor": -4.0}
    assert all(sums._sums[k] is t and t.item() == 0.0 for k, t in tensors.items())
    sums.add_on_device(critic)
    sums.count(keys[0])
    assert sums.take() == {"losses/critic": 6.0}  # a key set not added since is left out
    assert sums.take() == {}


def test_event_file_holds_scalars_episodes_and_config(tmp_path: Path) -> None:
    table = to_markdown_table(Config(batch_size=64))
    with Logger(tmp_path, table) as logger:
        for value in (1.0, 3.0):
            logger.accumulate({"losses/qf": torch.tensor(value)})
        logger.write(1000)
        logger.scalar("charts/sps", 250.0, 1000)
        logger.episode(1200, episodic_return=-150.5, length=200)
    events = read_events(tmp_path)
    scalars = {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }
    assert scalars["losses/qf"] == [(1000, 2.0)]
    assert scalars["charts/sps"] == [(1000, 250.0)]
    assert scalars["charts/episodic_return"] == [(1200, -150.5)]
    assert scalars["charts/episodic_length"] == [(1200, 200.0)]
    text_tag = "hyperparameters/text_summary"
    assert text_tag in events.Tags()["tensors"]
    text = events.Tensors(text_tag)[0].tensor_proto.string_val[0].decode()
    assert "| batch_size | 64 |" in text


def test_a_burst_of_episodes_beyond_the_event_queue_is_on_disk_after_a_flush(
        tmp_path: Path) -> None:
    # Many envs end episodes in bursts: the queue holds them for the writer thread, and a
    # flush (the loop's at every checkpoint and stop) writes every one, in order.
    episodes = EVENT_QUEUE + 300
    with Logger(tmp_path) as logger:
        for i in range(episodes):
            logger.episode(i, episodic_return=float(i), length=i + 1)
        logger.flush()
        returns = read_events(tmp_path).Scalars("charts/episodic_return")
        lengths = read_events(tmp_path).Scalars("charts/episodic_length")
    assert [(e.step, e.value) for e in returns] == [(i, float(i)) for i in range(episodes)]
    assert [e.value for e in lengths] == [float(i + 1) for i in range(episodes)]


def test_exit_closes_on_exception(tmp_path: Path) -> None:
    logger = Logger(tmp_path)
    with pytest.raises(KeyboardInterrupt), logger:
        logger.scalar("charts/x", 1.0, 0)
        raise KeyboardInterrupt
    assert logger.closed
    assert read_events(tmp_path).Scalars("charts/x")[0].value == 1.0
    logger.close()  # a second close is harmless


def test_markdown_table_of_a_config() -> None:
    cfg = Config(batch_size=64, hidden_sizes=(32, 32), run_name="a|b",
                 critic_kwargs={"sizes": (4, 4)})
    table = to_markdown_table(cfg)
    assert table.splitlines()[:2] == ["| key | value |", "|---|---|"]
    for f in dataclasses.fields(Config):
        assert f"| {f.name} |" in table
    assert "| batch_size | 64 |" in table
    assert r"| run_name | a\|b |" in table


def test_markdown_table_has_the_new_keys() -> None:
    cfg = Config(algo="td3", actor="nets.py:Actor", actor_kwargs={"width": 64})
    table = to_markdown_table(cfg)
    for key in ("policy_noise", "noise_clip", "exploration_noise", "critic", "critic_kwargs"):
        assert f"| {key} |" in table
    assert "| actor | nets.py:Actor |" in table
    assert '| actor_kwargs | {"width": 64} |' in table
    assert "| critic_kwargs | {} |" in table
    assert "| exploration_noise | 0.1 |" in table


def test_metric_sums_of_a_seed_group_keep_one_mean_per_seed() -> None:
    sums = MetricSums(shape=(3,))
    sums.add({"losses/critic": torch.tensor([1.0, 10.0, 100.0])})
    sums.add({"losses/critic": torch.tensor([3.0, 30.0, 300.0]),
              "losses/actor": torch.tensor([-1.0, 0.0, 1.0])})
    assert sums.take_rows() == {"losses/critic": [2.0, 20.0, 200.0],
                                "losses/actor": [-1.0, 0.0, 1.0]}
    assert sums.take_rows() == {}
    with pytest.raises(ValueError, match=r"must be of shape \(3,\), got torch.Size\(\[2\]\)"):
        sums.add({"x": torch.ones(2)})
    with pytest.raises(ValueError, match="take_rows needs sums of shape"):
        MetricSums().take_rows()
