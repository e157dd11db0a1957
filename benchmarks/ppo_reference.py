"""CleanRL's ``ppo_continuous_action.py`` (one env) as a reference run on today's gymnasium and
MuJoCo, to tell our PPO's differences from the environment's and the seeds'.

    python benchmarks/ppo_reference.py --env Humanoid-v4 --seed 1 --out episodes.csv
    python benchmarks/ppo_reference.py --env Humanoid-v4 --seed 1 --clip separate

The algorithm is CleanRL's, line for line in what it computes: one agent (tanh 64-64 actor
and critic, orthogonal init, a state-independent log-std), 2,048 steps a rollout, GAE(0.99,
0.95) with no bootstrap at truncation, 10 epochs of 32 minibatches, the clipped surrogate and
value loss, one Adam (eps 1e-5, rate annealed), one ``clip_grad_norm_`` of 0.5 over the
whole agent. CleanRL wraps its env in gymnasium 0.29's wrappers, whose 1.x versions differ;
their 0.29 arithmetic is written out here: ClipAction, NormalizeObservation (statistics from
count 1e-4, counted at every step and reset, the final observation too), observations clipped
to +-10, NormalizeReward (its discounted return reset by termination only) and rewards clipped
to +-10. ``--clip separate`` clips the actor's and the critic's gradients each by its own
norm (rl_graphstep's PPO before it took CleanRL's joint clip).

Writes each episode's return and whether it terminated to ``--out`` (CSV) and prints the
means of the last 10 and last 100 (openrlbenchmark's window for CleanRL's figures). One
thread; about 20 minutes a seed for Humanoid's 488 rollouts on one x86-64 core.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from cli import cli_main
from torch import nn
from torch.distributions.normal import Normal

from rl_graphstep.core.errors import EnvError
from rl_graphstep.envs.make import env_errors


class RunningMeanStd:
    """gymnasium 0.29's running statistics (Chan's parallel rule, count starting at 1e-4)."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, batch: np.ndarray) -> None:
        mean, var, count = batch.mean(0), batch.var(0), batch.shape[0]
        delta, total = mean - self.mean, self.count + count
        m2 = self.var * self.count + var * count + delta**2 * self.count * count / total
        self.mean, self.var, self.count = self.mean + delta * count / total, m2 / total, total


class WrappedEnv:
    """One env as CleanRL's ``make_env`` wraps it, with gymnasium 0.29's arithmetic, and the
    vector env's autoreset: an episode's end returns the next episode's first observation."""

    def __init__(self, env_id: str, seed: int, gamma: float) -> None:
        with env_errors(env_id):  # an unknown id or a missing dependency: one line
            self.env = gym.make(env_id)
        self.gamma, space = gamma, self.env.action_space
        observations = self.env.observation_space
        if not isinstance(space, gym.spaces.Box) or not isinstance(observations, gym.spaces.Box) \
                or len(observations.shape) != 1:
            raise EnvError(f"{env_id} has {type(space).__name__} actions and "
                           f"{type(observations).__name__} observations of shape "
                           f"{observations.shape}; "
                           "CleanRL's ppo_continuous_action.py takes a Box of actions and a "
                           "flat Box of observations (a MuJoCo task, Pendulum-v1)")
        self.low, self.high = space.low, space.high
        self.obs_rms = RunningMeanStd(self.env.observation_space.shape)
        self.ret_rms, self.ret, self.episode_return = RunningMeanStd(), 0.0, 0.0
        self.episodes: list[tuple[float, bool]] = []
        self.first = self._observe(self.env.reset(seed=seed)[0])

    def _observe(self, obs: np.ndarray) -> np.ndarray:
        self.obs_rms.update(obs[None])
        return np.clip((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8), -10, 10)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        obs, reward, terminated, truncated, _ = self.env.step(np.clip(action, self.low,
                                                                      self.high))
        self.episode_return += float(reward)
        obs = self._observe(obs)  # the final observation is counted, as 0.29's wrapper does
        self.ret = self.ret * self.gamma * (1 - terminated) + reward
        self.ret_rms.update(np.array([self.ret]))
        scaled = float(np.clip(reward / np.sqrt(self.ret_rms.var + 1e-8), -10, 10))
        if terminated or truncated:
            self.episodes.append((self.episode_return, bool(terminated)))
            self.episode_return = 0.0
            obs = self._observe(self.env.reset()[0])
        return obs, scaled, terminated or truncated


def layer(inputs: int, outputs: int, std: float = np.sqrt(2)) -> nn.Linear:
    linear = nn.Linear(inputs, outputs)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.constant_(linear.bias, 0.0)
    return linear


def train(env_id: str, seed: int, clip: str, iterations: int, num_steps: int
          ) -> list[tuple[float, bool]]:
    """CleanRL's PPO for ``iterations`` rollouts; returns the episodes (return, terminated)."""
    np.random.seed(seed)
    torch.manual_seed(seed)
    gamma, lam, minibatches, epochs, max_norm = 0.99, 0.95, 32, 10, 0.5
    env = WrappedEnv(env_id, seed, gamma)
    obs_size = env.env.observation_space.shape[0]
    act_size = env.env.action_space.shape[0]
    critic = nn.Sequential(layer(obs_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                           layer(64, 1, 1.0))
    actor = nn.Sequential(layer(obs_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                          layer(64, act_size, 0.01))
    log_std = nn.Parameter(torch.zeros(1, act_size))
    actor_params, critic_params = [*actor.parameters(), log_std], list(critic.parameters())
    optimizer = torch.optim.Adam(critic_params + actor_params, lr=3e-4, eps=1e-5)
    annealing = 1_000_000 // num_steps  # CleanRL's num_iterations for 1M steps
    next_obs, next_done = torch.tensor(env.first, dtype=torch.float32), 0.0
    for iteration in range(1, iterations + 1):
        optimizer.param_groups[0]["lr"] = (1 - (iteration - 1) / annealing) * 3e-4
        obs = torch.zeros(num_steps, obs_size)
        actions = torch.zeros(num_steps, act_size)
        log_probs, rewards, dones, values = (torch.zeros(num_steps) for _ in range(4))
        for t in range(num_steps):
            obs[t], dones[t] = next_obs, next_done
            with torch.no_grad():
                policy = Normal(actor(next_obs[None]), log_std.exp())
                action = policy.sample()
                log_probs[t] = policy.log_prob(action).sum(1)
                values[t] = critic(next_obs[None]).flatten()
            actions[t] = action[0]
            step_obs, rewards[t], done = env.step(action[0].numpy())
            next_obs, next_done = torch.tensor(step_obs, dtype=torch.float32), float(done)
        with torch.no_grad():
            next_value = critic(next_obs[None]).flatten()
            advantages, last = torch.zeros(num_steps), 0.0
            for t in reversed(range(num_steps)):
                alive = 1.0 - (next_done if t == num_steps - 1 else dones[t + 1])
                later = next_value if t == num_steps - 1 else values[t + 1]
                delta = rewards[t] + gamma * later * alive - values[t]
                advantages[t] = last = delta + gamma * lam * alive * last
            returns = advantages + values
        size, order = num_steps // minibatches, np.arange(num_steps)
        for _ in range(epochs):
            np.random.shuffle(order)  # CleanRL's: the same indices, shuffled again each epoch
            for start in range(0, num_steps, size):
                mb = order[start:start + size]
                mean = actor(obs[mb])
                policy = Normal(mean, log_std.expand_as(mean).exp())
                ratio = (policy.log_prob(actions[mb]).sum(1) - log_probs[mb]).exp()
                adv = advantages[mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
                value = critic(obs[mb]).view(-1)
                clipped = values[mb] + (value - values[mb]).clamp(-0.2, 0.2)
                v_loss = 0.5 * torch.max((value - returns[mb]) ** 2,
                                         (clipped - returns[mb]) ** 2).mean()
                optimizer.zero_grad()
                (pg_loss + 0.5 * v_loss).backward()  # ent_coef 0
                if clip == "joint":
                    nn.utils.clip_grad_norm_(critic_params + actor_params, max_norm)
                else:
                    nn.utils.clip_grad_norm_(critic_params, max_norm)
                    nn.utils.clip_grad_norm_(actor_params, max_norm)
                optimizer.step()
    return env.episodes


@cli_main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="Humanoid-v4")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--clip", choices=["joint", "separate"], default="joint")
    parser.add_argument("--iterations", type=int, default=488,
                        help="rollouts (488 x 2,048 = CleanRL's 999,424 steps)")
    parser.add_argument("--num-steps", type=int, default=2048)
    parser.add_argument("--out", type=Path, help="CSV of the episodes: return, terminated")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.num_steps < 32 or args.num_steps % 32:
        parser.error(f"--iterations takes 1 or more and --num-steps a multiple of 32 (its 32 "
                     f"minibatches); got {args.iterations} and {args.num_steps}")
    if args.num_steps < 64:
        parser.error(f"--num-steps takes 64 or more: each of its 32 minibatches needs two rows "
                     f"for the advantages' standard deviation; got {args.num_steps}")
    if args.out is not None and (args.out.is_dir() or not args.out.parent.is_dir()):
        parser.error(f"--out takes a file in a folder that exists (the CSV is written after "
                     f"the whole run); got {args.out}")
    torch.set_num_threads(1)
    episodes = train(args.env, args.seed, args.clip, args.iterations, args.num_steps)
    if args.out is not None:
        with args.out.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["return", "terminated"])
            writer.writerows((f"{r:.3f}", int(t)) for r, t in episodes)
    returns = np.array([r for r, _ in episodes])
    if len(returns) == 0:
        print(f"{args.env} seed {args.seed}, clip {args.clip}: no episode ended")
        return 0
    print(f"{args.env} seed {args.seed}, clip {args.clip}: {len(returns)} episodes, mean of "
          f"the last 10 {returns[-10:].mean():.1f}, of the last 100 {returns[-100:].mean():.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
