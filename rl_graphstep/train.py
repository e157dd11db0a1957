"""`python -m rl_graphstep.train --env ENV`: the off-policy training loop and its command line.

The loop reads like the algorithm: act (randomly before ``learning_starts``), step the
environments, store the transitions, update critic and actor from a replay sample, log,
checkpoint. Ctrl-C and SIGTERM finish the current step, save a checkpoint and flush the logs.
"""

from __future__ import annotations

if __name__ == "__main__":
    # Before every import below (torch takes seconds): a Ctrl-C during them is one line, exit 130.
    from rl_graphstep.cli import startup_guard

    startup_guard()

import contextlib
import gc
import pickle
import signal
import sys
import time
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from rl_graphstep.acting import ActionPipe
from rl_graphstep.algorithms import ALGORITHMS, ActorCritic
from rl_graphstep.buffer import ReplayBuffer
from rl_graphstep.checkpoint import (
    FORMAT,
    list_checkpoints,
    load_checkpoint,
    networks_mismatch,
    save_checkpoint,
    set_aside_later,
)
from rl_graphstep.cli import end_startup_guard, exit_quietly
from rl_graphstep.config import (
    Config,
    command_line_values,
    config_to_dict,
    load_config,
    to_markdown_table,
)
from rl_graphstep.envs import (
    EnvStepper,
    EpisodeStatistics,
    check_continuous_spaces,
    first_reset,
    make_vec_env,
    rng_state,
    scale_action,
    seed_everything,
    set_rng_state,
    true_next_observations,
)
from rl_graphstep.envworker import EnvWorker
from rl_graphstep.errors import CheckpointError, ConfigError, RLGraphstepError
from rl_graphstep.logger import Logger, check_run_dir, claim_run_dir, run_name
from rl_graphstep.memory import allocation_errors, check_networks_fit
from rl_graphstep.metrics import MetricSums
from rl_graphstep.plugins import build_network, check_actor, check_critic

NetworkSpec = str | type | nn.Module | None


class TrainingInterrupted(RLGraphstepError):
    """Ctrl-C or SIGTERM stopped the run after a checkpoint was saved."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class NonFiniteUpdates(RLGraphstepError):
    """Too many consecutive updates had non-finite losses or gradients."""


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


def resolve_compile(cfg: Config, use_graph: bool | None) -> bool | None:
    """``on``/``off`` as given; ``auto``: compiled when the steps may be captured, uncompiled
    (with a warning) when compiling fails (``None`` tells the agent so); eager steps stay
    uncompiled (their compile would fail mid-run rather than at capture)."""
    if cfg.compile == "auto":
        return None if use_graph is not False else False
    return cfg.compile == "on"


def make_networks(algorithm: type[ActorCritic], cfg: Config, observation_space: gym.Space,
                  action_space: gym.Space, device: torch.device, actor: NetworkSpec = None,
                  critic: NetworkSpec = None) -> tuple[nn.Module, nn.Module]:
    """The actor and critic: given ones (class, module or ``module:Class``), else those of
    ``cfg.actor``/``cfg.critic``, else the algorithm's defaults; each checked once on an
    example batch before any capture."""
    actor, critic = actor or cfg.actor, critic or cfg.critic
    check_networks_fit(cfg, observation_space, action_space, device,
                       default_actor=actor is None, default_critic=critic is None,
                       num_critics=algorithm.num_critics)
    with allocation_errors(device):
        actor_net, critic_net = _build_networks(algorithm, cfg, observation_space,
                                                action_space, device, actor, critic)
    sizes = {"observation_size": observation_space.shape[0],
             "action_size": action_space.shape[0], "device": device}
    check_actor(actor_net, kind=algorithm.actor_kind, **sizes)
    check_critic(critic_net, min_members=algorithm.num_critics, **sizes)
    return actor_net, critic_net


def _build_networks(algorithm: type[ActorCritic], cfg: Config, observation_space: gym.Space,
                    action_space: gym.Space, device: torch.device, actor: NetworkSpec,
                    critic: NetworkSpec) -> tuple[nn.Module, nn.Module]:
    actor_net = (build_network(actor, observation_space, action_space, cfg.actor_kwargs,
                               role="actor") if actor is not None
                 else algorithm.default_actor(observation_space, action_space, cfg))
    critic_net = (build_network(critic, observation_space, action_space, cfg.critic_kwargs,
                                role="critic") if critic is not None
                  else algorithm.default_critic(observation_space, action_space, cfg))
    return actor_net.to(device), critic_net.to(device)


@contextlib.contextmanager
def stop_requests() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM append their number to the yielded list instead of raising, so the
    loop can finish its step and save; the previous handlers come back afterwards."""
    requested: list[int] = []
    handled = (signal.SIGINT, signal.SIGTERM)
    try:
        previous = {s: signal.signal(s, lambda signum, _frame: requested.append(signum))
                    for s in handled}
    except ValueError:  # not the main thread: signals cannot be caught here
        yield requested
        return
    try:
        yield requested
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@dataclass
class Progress:
    """The loop's counters, saved in every checkpoint."""

    global_step: int = 0
    episodes: int = 0
    recent_returns: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    episode_stats: EpisodeStatistics = field(default_factory=lambda: EpisodeStatistics(1))


def _pickled_envs(envs: gym.vector.VectorEnv | EnvWorker) -> bytes | None:
    if isinstance(envs, EnvWorker):
        return envs.state()
    # A sync vector env of pure-Python envs pickles with its full state (exact resume);
    # cloudpickle (gymnasium's own dependency) because gymnasium builds them from closures.
    # Others (subprocesses, simulators with native handles) restart their episodes instead.
    try:
        return cloudpickle.dumps(envs)
    except Exception:
        return None


def _checkpoint(cfg: Config, run_dir: Path, progress: Progress, agent: ActorCritic,
                envs: gym.vector.VectorEnv, observations: np.ndarray,
                buffer: ReplayBuffer, actions_pipe: ActionPipe | None) -> Path:
    staged = actions_pipe.staged_actor() if actions_pipe is not None else []
    state = {
        "format": FORMAT,
        "config": config_to_dict(cfg),
        "run_name": run_dir.name,
        "global_step": progress.global_step,
        "episodes": progress.episodes,
        "recent_returns": list(progress.recent_returns),
        "episode_stats": progress.episode_stats.state_dict(),
        "agent": agent.state_dict(),
        "rng": rng_state(),
        "envs": _pickled_envs(envs),
        "observations": observations,
        "buffer": buffer.state_dict() if cfg.save_buffer else None,
        "staged_actor": staged or None,
    }
    return save_checkpoint(run_dir, progress.global_step, state, keep=cfg.keep_checkpoints)


def _run_dir(cfg: Config) -> Path:
    """The resumed run's folder, or a new one under ``cfg.log_dir``."""
    if not cfg.resume:
        return Path(cfg.log_dir) / run_name(cfg)
    path = Path(cfg.resume)
    # A checkpoint file lies in runs/<run>/checkpoints/step_N.pt.
    return path.parent.parent if path.is_file() else path


@contextlib.contextmanager
def matmul_precision(cfg: Config) -> Iterator[None]:
    """float32 matmuls on TF32 tensor cores while inside, when ``cfg.tf32``; the process's
    setting is restored after. Set before the steps are built: a captured graph keeps the
    kernels chosen at capture."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@contextlib.contextmanager
def loop_threads(device: torch.device) -> Iterator[None]:
    """One intra-op CPU thread while inside, when training on CUDA; the process's count is
    restored after. There the host's torch work is a few tiny tensors per step, and the idle
    worker threads made the loop's own Python and the env steps about 40% slower (measured
    on an H200 host: HalfCheetah's step 215 -> 155 µs). On the CPU the updates themselves
    use the threads, so nothing changes."""
    if device.type != "cuda":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def train(cfg: Config, *, actor: NetworkSpec = None, critic: NetworkSpec = None
          ) -> dict[str, Any]:
    """Train an agent as ``cfg`` says; return a summary of the run.

    ``actor`` and ``critic`` replace the default networks: a class (built as
    ``cls(observation_space, action_space, **cfg.actor_kwargs)``), a built module, or a
    ``package.module:Class`` / ``path/file.py:Class`` string. ``rl_graphstep.networks``
    documents the protocol they meet. With ``cfg.resume`` the run continues from the latest
    checkpoint in that folder.
    """
    try:
        device = resolve_device(cfg)
        with matmul_precision(cfg), loop_threads(device):
            return _train(cfg, device, actor, critic)
    finally:
        gc.unfreeze()  # see _build_steps


def _train(cfg: Config, device: torch.device, actor: NetworkSpec, critic: NetworkSpec
           ) -> dict[str, Any]:
    resumed = (load_checkpoint(cfg.resume, env_id=cfg.env_id, algo=cfg.algo)
               if cfg.resume else None)
    run_dir = _run_dir(cfg)
    check_run_dir(run_dir)
    # A folder named by the clock is claimed when the run starts logging (see below).
    by_clock = not cfg.resume and not cfg.run_name
    if resumed is None and not by_clock and list_checkpoints(run_dir):
        raise ConfigError(f"{run_dir} already holds a run with checkpoints; continue it with "
                          "--resume or pick another --run-name")
    # Resumed from an older checkpoint: the later ones belong to the abandoned timeline.
    set_aside = set_aside_later(run_dir, int(resumed["global_step"])) if resumed else None
    use_graph = resolve_graph(cfg, device)
    seed_everything(cfg.seed)
    envs = make_vec_env(cfg.env_id, num_envs=cfg.num_envs, seed=cfg.seed,
                        asynchronous=cfg.async_envs)
    observation_space, action_space = envs.single_observation_space, envs.single_action_space
    check_continuous_spaces(cfg.env_id, observation_space, action_space, cfg.algo)
    observation_size, action_size = observation_space.shape[0], action_space.shape[0]
    low, high = action_space.low, action_space.high

    algorithm = ALGORITHMS[cfg.algo]
    actor_net, critic_net = make_networks(algorithm, cfg, observation_space, action_space,
                                          device, actor, critic)
    buffer = ReplayBuffer(cfg.buffer_size, observation_size, action_size, device)
    agent = algorithm(actor_net, critic_net, cfg, observation_size=observation_size,
                      action_size=action_size, device=device, use_graph=use_graph,
                      compile=resolve_compile(cfg, use_graph))
    progress = Progress(episode_stats=EpisodeStatistics(cfg.num_envs))
    if resumed is not None:
        envs, observations = _restore(resumed, agent, buffer, progress, envs)
    if cfg.env_worker:
        envs = EnvWorker(envs)
    if resumed is None:
        observations = first_reset(envs, cfg.seed)

    actions_pipe: ActionPipe | None = None  # built with the steps, at the first update
    stepper = EnvStepper(envs)
    clock = LoopClock(progress.global_step)
    # A resumed run drops what the stopped one logged after its checkpoint (step + 1 on).
    purge_step = progress.global_step + 1 if resumed else None
    if by_clock:
        # Made here, not earlier, so that bad input leaves no empty folder behind; a run
        # started in the same second (the name's resolution) gets a folder of its own.
        run_dir = claim_run_dir(run_dir)
    bar = tqdm(total=cfg.total_timesteps, initial=progress.global_step,
               disable=not cfg.progress, unit="step", dynamic_ncols=True)
    # stop_requests first, so it is left last: a second Ctrl-C while the first one's
    # checkpoint is saved, the envs closed or the logs flushed is noted, not raised.
    with stop_requests() as stops, \
            Logger(run_dir, to_markdown_table(cfg), purge_step=purge_step) as logger, bar, \
            contextlib.closing(envs):
        bar.write(f"{run_dir}: {cfg.algo.upper()} on {cfg.env_id}, {device}; "
                  f"{buffer.describe()}"
                  + (f"; resumed at step {progress.global_step}" if resumed else "")
                  + (f"; later checkpoints moved to {set_aside}" if set_aside else ""))

        def update() -> None:
            for _ in range(cfg.updates_per_step):
                agent.update_from(buffer)  # adds its metrics into logger.sums
            if not cfg.overlap and device.type == "cuda":
                torch.cuda.synchronize(device)

        # The last step's transition: written into the buffer while the next action is being
        # computed (off the path from one env step to the next), before the next updates, and
        # before any checkpoint.
        pending: tuple[np.ndarray, ...] | None = None

        def add_pending() -> None:
            nonlocal pending
            if pending is not None:
                buffer.add(*pending)
                pending = None

        def request_action() -> bool:
            acting = progress.global_step >= cfg.learning_starts and actions_pipe is not None
            if acting:
                actions_pipe.request(observations)
            return acting

        while progress.global_step < cfg.total_timesteps:
            # The policy's action is queued first and the updates after it, so waiting for
            # the action never waits for the updates. The host then steps the environments
            # while the GPU updates; envs in subprocesses step while the host launches them.
            acting = request_action()
            add_pending()
            # len(buffer): a run resumed without its buffer first refills one batch.
            updating = (progress.global_step + cfg.num_envs > cfg.learning_starts
                        and len(buffer) >= cfg.batch_size)
            if updating and actions_pipe is None:
                began = time.perf_counter()
                actions_pipe = _build_steps(agent, buffer, cfg, action_space, logger.sums,
                                            resumed.get("staged_actor") if resumed else None)
                clock.build_seconds = time.perf_counter() - began
                bar.write(f"updates: {_describe_mode(agent)}; built in "
                          f"{clock.build_seconds:.1f} s")
                clock.start_learning(progress.global_step)
                acting = request_action()
            if updating and not stepper.asynchronous:
                update()
            if acting:
                with clock.waiting():
                    actions, env_actions = actions_pipe.wait()
            else:
                actions = np.random.uniform(-1.0, 1.0, (cfg.num_envs, action_size))
                env_actions = scale_action(actions, low, high)
            stepper.start(env_actions)
            if updating and stepper.asynchronous:
                update()
            next_observations, rewards, terminations, truncations, infos = stepper.finish()
            progress.global_step += cfg.num_envs
            for episodic_return, length in progress.episode_stats.update(
                    rewards, terminations, truncations):
                logger.episode(progress.global_step, episodic_return, length)
                progress.recent_returns.append(episodic_return)
                progress.episodes += 1
            pending = (observations, actions, rewards,
                       true_next_observations(next_observations, infos), terminations)
            observations = next_observations

            bar.update(cfg.num_envs)
            step = progress.global_step
            done = step >= cfg.total_timesteps
            if step % cfg.log_interval < cfg.num_envs or done or stops:
                _log(logger, agent, cfg, progress, bar, clock.sps(step))
            if step % cfg.checkpoint_every < cfg.num_envs or done or stops:
                add_pending()
                saved = _checkpoint(cfg, run_dir, progress, agent, envs, observations, buffer,
                                    actions_pipe)
            if stops:
                name = signal.Signals(stops[0]).name
                raise TrainingInterrupted(
                    stops[0], f"{name} at step {step}: checkpoint {saved} saved and logs "
                    f"flushed; continue with --resume {run_dir}")

    return {
        "run_dir": str(run_dir),
        "global_step": progress.global_step,
        "episodes": progress.episodes,
        "mean_return_last_10": (float(np.mean(progress.recent_returns))
                                if progress.recent_returns else None),
        "graph": agent.use_graph,
        "compile": agent.compile,
        "env_worker": isinstance(envs, EnvWorker),
        "action_stream": actions_pipe is not None and actions_pipe.side_stream is not None,
        **clock.summary(progress.global_step),
    }


def _acts_beside(agent: ActorCritic, cfg: Config) -> bool:
    """Whether the action runs on a stream of its own (``--action-stream``): ``off`` never;
    ``on`` where it can, with a warning that says why not; ``auto`` where it can, silently."""
    if cfg.action_stream == "off":
        return False
    if not agent.use_graph:
        why = "it needs CUDA graphs"
    elif agent.exploration_noise_size() == 0:
        why = (f"{type(agent.actor).__name__} has no sample(observations, noise), so the "
               "action would draw its noise on the device")
    else:
        return True
    if cfg.action_stream == "on":
        warnings.warn(f"--action-stream: acting on the updates' stream instead ({why})",
                      stacklevel=3)
    return False


def _build_steps(agent: ActorCritic, buffer: ReplayBuffer, cfg: Config,
                 action_space: gym.spaces.Box, metrics: MetricSums,
                 staged: list[Tensor] | None = None) -> ActionPipe:
    """Capture (or wrap) the update steps, the replay sampling and the action selection:
    compiling is paid once, here. The updates add their metrics into ``metrics``; ``staged``
    is a resumed run's staged actor (see ``ActionPipe``)."""
    agent.build(buffer, metrics=metrics)
    # --action-stream: the action runs beside the updates, so it must draw nothing on the
    # device (two streams would share the generator's offset): its noise comes from the host,
    # where the policy takes it, and it reads a copy of the actor one round of updates behind
    # (the actor as it was at the previous request), so it waits for no update.
    beside = _acts_beside(agent, cfg)
    pipe = ActionPipe(agent.explore, cfg.num_envs, agent.observation_size, action_space,
                      agent.device,
                      use_graph=agent.use_graph and (None if agent.graph_fallback else True),
                      noise_size=agent.exploration_noise_size() if beside else 0,
                      refresh=agent.separate_behaviour_actor() if beside else None,
                      staged=staged if beside else None)
    if agent.device.type == "cuda":
        torch.cuda.synchronize(agent.device)
    # Compiling leaves hundreds of thousands of long-lived Python objects (600,000 after
    # SAC's steps), and each full garbage collection during the loop would walk them all
    # (0.3 s each, measured on a CPU): keep them out of its sight until the run ends.
    gc.collect()
    gc.freeze()
    return pipe


def _describe_mode(agent: ActorCritic) -> str:
    return ("CUDA graphs" if agent.use_graph else "eager") + (
        " + torch.compile" if agent.compile else "")


class LoopClock:
    """Times the loop: steps/s overall and over the learning phase, and how much of the
    learning phase the host spent waiting for the device (the rest is its own work)."""

    def __init__(self, step: int) -> None:
        self.start = (time.perf_counter(), step)
        self.learning: tuple[float, int] | None = None
        self.waited = 0.0
        self.iterations = 0
        self.build_seconds = 0.0

    def start_learning(self, step: int) -> None:
        self.learning = (time.perf_counter(), step)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        began = time.perf_counter()
        yield
        self.waited += time.perf_counter() - began
        self.iterations += 1

    def sps(self, step: int) -> float:
        return (step - self.start[1]) / (time.perf_counter() - self.start[0])

    def summary(self, step: int) -> dict[str, float | None]:
        now = time.perf_counter()
        result: dict[str, float | None] = {"sps": self.sps(step), "learning_sps": None,
                                           "host_us_per_iteration": None,
                                           "build_seconds": self.build_seconds}
        if self.learning is not None and step > self.learning[1]:
            elapsed = now - self.learning[0]
            result["learning_sps"] = (step - self.learning[1]) / elapsed
            if self.iterations:
                result["host_us_per_iteration"] = (elapsed - self.waited) / self.iterations * 1e6
        return result


def _restore(state: dict[str, Any], agent: ActorCritic, buffer: ReplayBuffer,
             progress: Progress, envs: gym.vector.VectorEnv
             ) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    """Put a checkpoint back: agent (before any capture), buffer, counters, RNG, envs."""
    try:
        agent.load_state_dict(state["agent"])
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(networks_mismatch(state, agent.cfg, error)) from None
    if state.get("buffer") is not None:
        buffer.load_state_dict(state["buffer"])
    progress.global_step = int(state["global_step"])
    progress.episodes = int(state["episodes"])
    progress.recent_returns.extend(state["recent_returns"])
    set_rng_state(state["rng"])
    if state.get("envs") is not None:
        if state.get("episode_stats") is not None:
            progress.episode_stats.load_state_dict(state["episode_stats"])
        envs.close()
        return pickle.loads(state["envs"]), state["observations"]
    warnings.warn("the environments could not be saved with the checkpoint; their episodes "
                  "restart on resume", stacklevel=3)
    observations, _ = envs.reset()
    return envs, observations


def _log(logger: Logger, agent: ActorCritic, cfg: Config, progress: Progress, bar: tqdm,
         sps: float) -> None:
    """Write the interval's means; stop a run that only produces non-finite updates."""
    step = progress.global_step
    logger.write(step)
    logger.scalar("charts/SPS", sps, step)
    total, consecutive = (int(t) for t in torch.stack(agent.skipped_updates()).tolist())
    logger.scalar("charts/skipped_updates", total, step)
    if consecutive >= cfg.nonfinite_limit:
        raise NonFiniteUpdates(
            f"the last {consecutive} updates had non-finite losses or gradients (limit "
            f"--nonfinite-limit {cfg.nonfinite_limit}); stopped at step {step} with the "
            f"parameters of the last finite update and the checkpoints saved so far; check the "
            f"rewards and observations the environment returns, or lower the learning rates")
    if progress.recent_returns:
        bar.set_postfix(ret=f"{np.mean(progress.recent_returns):.1f}", sps=f"{sps:.0f}")


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: one clear line and exit 2 on bad input, 128+signal when stopped."""
    try:
        end_startup_guard()  # from here on a Ctrl-C is the KeyboardInterrupt handled below
        given = command_line_values(argv)
        if given.get("resume"):
            state = load_checkpoint(given["resume"])
            cfg = load_config(argv, base=state["config"])
        else:
            cfg = load_config(argv)
        summary = train(cfg)
    except TrainingInterrupted as stop:
        print(f"stopped: {stop}", file=sys.stderr)
        return stop.exit_code
    except RLGraphstepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the loop took over Ctrl-C: nothing to save yet
        print("stopped: interrupted during start-up", file=sys.stderr)
        return 130
    ret = summary["mean_return_last_10"]
    print(f"done: {summary['global_step']} steps, {summary['episodes']} episodes, "
          f"mean return of the last 10: {'n/a' if ret is None else f'{ret:.1f}'}, "
          f"{summary['sps']:.0f} steps/s; logs in {summary['run_dir']}")
    return 0


if __name__ == "__main__":
    exit_quietly(main())
