"""`python -m rl_graphstep.train --env ENV`: the off-policy training loop and its command line.

The loop reads like the algorithm: act (randomly before ``learning_starts``), step the
environments, store the transitions, update critic and actor from a replay sample, log.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from rl_graphstep.algorithms import ALGORITHMS, ActorCritic
from rl_graphstep.buffer import ReplayBuffer
from rl_graphstep.config import Config, load_config, to_markdown_table
from rl_graphstep.envs import (
    check_continuous_spaces,
    finished_episodes,
    make_vec_env,
    scale_action,
    seed_everything,
    true_next_observations,
)
from rl_graphstep.errors import ConfigError, RLGraphstepError
from rl_graphstep.logger import Logger, run_name
from rl_graphstep.plugins import build_network, check_actor, check_critic


def resolve_device(cfg: Config) -> torch.device:
    """``auto`` takes CUDA when present; ``cuda`` without a GPU is an error."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but no CUDA GPU is available; "
                          "use --device auto or --device cpu")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def resolve_graph(cfg: Config, device: torch.device) -> bool | None:
    """``on``: graphs, or an error off CUDA; ``off``: eager; ``auto``: graphs on CUDA with an
    eager fallback when a step cannot be captured (``None`` tells the agent so)."""
    if cfg.graph == "on" and device.type != "cuda":
        raise ConfigError(f"--graph on needs a CUDA device, but training runs on {device}; "
                          "use --graph auto or --graph off")
    if cfg.graph == "off":
        return False
    if cfg.graph == "on":
        return True
    return None if device.type == "cuda" else False


NetworkSpec = str | type | nn.Module | None


def make_networks(algorithm: type[ActorCritic], cfg: Config, observation_space: gym.Space,
                  action_space: gym.Space, device: torch.device, actor: NetworkSpec = None,
                  critic: NetworkSpec = None) -> tuple[nn.Module, nn.Module]:
    """The actor and critic: given ones (class, module or ``module:Class``), else those of
    ``cfg.actor``/``cfg.critic``, else the algorithm's defaults; each checked once on an
    example batch before any capture."""
    actor, critic = actor or cfg.actor, critic or cfg.critic
    actor_net = (build_network(actor, observation_space, action_space, cfg.actor_kwargs,
                               role="actor") if actor is not None
                 else algorithm.default_actor(observation_space, action_space, cfg))
    critic_net = (build_network(critic, observation_space, action_space, cfg.critic_kwargs,
                                role="critic") if critic is not None
                  else algorithm.default_critic(observation_space, action_space, cfg))
    actor_net, critic_net = actor_net.to(device), critic_net.to(device)
    sizes = {"observation_size": observation_space.shape[0],
             "action_size": action_space.shape[0], "device": device}
    check_actor(actor_net, kind=algorithm.actor_kind, **sizes)
    check_critic(critic_net, min_members=algorithm.num_critics, **sizes)
    return actor_net, critic_net


def train(cfg: Config, *, actor: NetworkSpec = None, critic: NetworkSpec = None
          ) -> dict[str, Any]:
    """Train an agent as ``cfg`` says; return a summary of the run.

    ``actor`` and ``critic`` replace the default networks: a class (built as
    ``cls(observation_space, action_space, **cfg.actor_kwargs)``), a built module, or a
    ``package.module:Class`` / ``path/file.py:Class`` string. ``rl_graphstep.networks``
    documents the protocol they meet.
    """
    device = resolve_device(cfg)
    use_graph = resolve_graph(cfg, device)
    seed_everything(cfg.seed)
    envs = make_vec_env(cfg.env_id, num_envs=cfg.num_envs, seed=cfg.seed)
    observation_space, action_space = envs.single_observation_space, envs.single_action_space
    check_continuous_spaces(cfg.env_id, observation_space, action_space, cfg.algo)
    observation_size, action_size = observation_space.shape[0], action_space.shape[0]
    low, high = action_space.low, action_space.high

    algorithm = ALGORITHMS[cfg.algo]
    actor_net, critic_net = make_networks(algorithm, cfg, observation_space, action_space,
                                          device, actor, critic)
    buffer = ReplayBuffer(min(cfg.buffer_size, cfg.total_timesteps), observation_size,
                          action_size, device)
    agent = algorithm(actor_net, critic_net, cfg, observation_size=observation_size,
                      action_size=action_size, device=device, use_graph=use_graph)
    run_dir = Path(cfg.log_dir) / run_name(cfg)
    recent_returns: deque[float] = deque(maxlen=10)
    episodes = 0
    start = time.perf_counter()
    global_step = 0
    learning_start = (start, 0)

    with Logger(run_dir, to_markdown_table(cfg)) as logger, tqdm(
        total=cfg.total_timesteps, disable=not cfg.progress, unit="step", dynamic_ncols=True
    ) as bar:
        bar.write(f"{run_dir}: {cfg.algo.upper()} on {cfg.env_id}, {device}, "
                  f"{'CUDA graphs' if use_graph is not False else 'eager'}; {buffer.describe()}")
        observations, _ = envs.reset(seed=cfg.seed)
        while global_step < cfg.total_timesteps:
            if global_step < cfg.learning_starts:
                actions = np.random.uniform(-1.0, 1.0, (cfg.num_envs, action_size))
            else:
                obs = torch.as_tensor(observations, dtype=torch.float32, device=device)
                actions = agent.explore(obs).cpu().numpy()
            next_observations, rewards, terminations, _, infos = envs.step(
                scale_action(actions, low, high))
            global_step += cfg.num_envs

            for episodic_return, length in finished_episodes(infos):
                logger.episode(global_step, episodic_return, length)
                recent_returns.append(episodic_return)
                episodes += 1
            buffer.add(observations, actions, rewards,
                       true_next_observations(next_observations, infos), terminations)
            observations = next_observations

            if global_step > cfg.learning_starts:
                logger.accumulate(agent.update(buffer.sample(cfg.batch_size)))
            else:
                learning_start = (time.perf_counter(), global_step)

            bar.update(cfg.num_envs)
            if global_step % cfg.log_interval < cfg.num_envs:
                sps = global_step / (time.perf_counter() - start)
                logger.write(global_step)
                logger.scalar("charts/SPS", sps, global_step)
                if recent_returns:
                    bar.set_postfix(ret=f"{np.mean(recent_returns):.1f}", sps=f"{sps:.0f}")
        logger.write(global_step)

    envs.close()
    end = time.perf_counter()
    learning_steps = global_step - learning_start[1]
    return {
        "run_dir": str(run_dir),
        "global_step": global_step,
        "episodes": episodes,
        "mean_return_last_10": float(np.mean(recent_returns)) if recent_returns else None,
        "sps": global_step / (end - start),
        "learning_sps": learning_steps / (end - learning_start[0]) if learning_steps else None,
        "graph": agent.use_graph,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: one clear line and exit 2 on bad input, 130 on Ctrl-C."""
    try:
        summary = train(load_config(argv))
    except RLGraphstepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; logs are flushed", file=sys.stderr)
        return 130
    ret = summary["mean_return_last_10"]
    print(f"done: {summary['global_step']} steps, {summary['episodes']} episodes, "
          f"mean return of the last 10: {'n/a' if ret is None else f'{ret:.1f}'}, "
          f"{summary['sps']:.0f} steps/s; logs in {summary['run_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
