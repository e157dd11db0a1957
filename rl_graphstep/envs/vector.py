"""Gymnasium environments: building the vector env, checking its spaces, reading its step infos.

The vector env autoresets in SAME_STEP mode: when an episode ends, `step` already returns the
first observation of the next one, and the true final observation is in `infos["final_obs"]`
(mask `infos["_final_obs"]`). `true_next_observations` puts it back for the replay buffer.
"""

from __future__ import annotations

import contextlib
import functools
import random
import signal
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from rl_graphstep.core.errors import STOP_SIGNALS, ConfigError, EnvError
from rl_graphstep.envs.check import raised_line
from rl_graphstep.envs.make import env_errors, import_env_module, make_env
from rl_graphstep.envs.shared import SharedMemoryVectorEnv

__all__ = [
    "EnvStepper",
    "EpisodeStatistics",
    "OneEnvVector",
    "check_continuous_spaces",
    "check_trained_observations",
    "first_reset",
    "import_env_module",
    "make_env",
    "make_vec_env",
    "scale_action",
    "seed_everything",
    "true_next_observations",
]


def make_vec_env(
    env_id: str, *, num_envs: int = 1, seed: int, kind: str = "sync", workers: int | None = None,
    algo: str | None = None,
) -> VectorEnv:
    """Build `num_envs` copies of `env_id` as one vector env: `kind` "sync" in this process,
    "async" in gymnasium's subprocesses (one per env, through pipes), "shared" in worker
    processes that poll shared memory (`rl_graphstep.envs.shared`; `workers` of them, by
    default one per CPU but one). Every copy is made by `make_env`, which checks what it
    returns against its spaces.

    Autoreset is SAME_STEP (see the module docstring); `EpisodeStatistics` keeps the returns.
    The action space is seeded with `seed`; the env itself is not reset: the caller seeds it
    with its first `envs.reset(seed=seed)` (gymnasium gives copy i the seed `seed + i`).

    With `algo`, the spaces are checked to suit it (`check_continuous_spaces`) before the
    shared env lays out its memory, and the envs closed when they do not.

    Raises `EnvError` for an unknown id (with close matches), a missing MuJoCo install, a
    module or constructor that fails (see `make_env`), spaces `algo` cannot act in.
    """
    if num_envs < 1:
        raise ConfigError(f"num_envs must be at least 1, got {num_envs}")
    if kind not in ("sync", "async", "shared"):
        raise ConfigError(f"vector env kind must be sync, async or shared, got {kind!r}")
    make_one = functools.partial(make_env, env_id)
    check = None if algo is None else functools.partial(check_continuous_spaces, env_id,
                                                        algo=algo)
    with env_errors(env_id):
        if num_envs == 1 and kind == "sync":
            envs = OneEnvVector([make_one], autoreset_mode=AutoresetMode.SAME_STEP)
        elif kind == "shared":
            envs = SharedMemoryVectorEnv(env_id, num_envs, workers=workers, check=check)
        elif kind == "sync":
            envs = SyncVectorEnv([make_one] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        else:
            _quiet_worker_errors()
            with _children_ignore_stops():
                envs = AsyncVectorEnv([make_one] * num_envs,
                                      autoreset_mode=AutoresetMode.SAME_STEP)
    if check is not None:
        try:
            check(envs.single_observation_space, envs.single_action_space)
        except EnvError:
            envs.close()  # an async env's workers would otherwise outlive the error
            raise
    envs.action_space.seed(seed)
    envs.single_action_space.seed(seed)
    return envs


def _quiet_worker_errors() -> None:
    """Hide the lines gymnasium's AsyncVectorEnv logs (as warnings) when a worker's env
    raised, its traceback among them: the error it raises next is the one line the run
    shows, with the user's line (``rl_graphstep.envs.check``)."""
    warnings.filterwarnings(
        "ignore", category=UserWarning, module=r"gymnasium\.vector\.async_vector_env",
        message=r".*ERROR: (Received the following error|Traceback|Raising the last exception)")


def first_reset(envs: VectorEnv, seed: int | list[int]) -> np.ndarray:
    """The first observations, from ``envs.reset(seed=seed)`` (a list: one seed per env); a
    custom env whose reset fails, or returns what its spaces cannot hold, is one line
    naming the error and the user's line."""
    try:
        observations, _ = envs.reset(seed=seed)
    except EnvError:
        raise
    except Exception as exc:
        raise EnvError(raised_line("reset", exc)) from exc
    return observations


class OneEnvVector(SyncVectorEnv):
    """A SAME_STEP ``SyncVectorEnv`` of one env whose ``step`` skips the batching made for
    many (iterating the batched actions, concatenating into a buffer, deep-copying it, and
    batching the env's own info keys): the same observations, rewards and flags in less time
    (benchmarks/LOG.md has the figures). Its infos hold what the loop reads, as the shared
    env's do: ``final_obs`` with its mask ``_final_obs`` where the episode ended, else none.
    Everything else (reset, spaces, close, pickling) is ``SyncVectorEnv``'s."""

    def step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        if (self.autoreset_mode != AutoresetMode.SAME_STEP or self.num_envs != 1
                or not isinstance(self.single_observation_space, gym.spaces.Box)):
            return super().step(actions)
        env = self.envs[0]
        observation, reward, terminated, truncated, _ = env.step(actions[0])
        infos: dict[str, Any] = {}
        if terminated or truncated:
            final = np.empty(1, dtype=object)
            final[0] = observation
            infos = {"final_obs": final, "_final_obs": np.ones(1, dtype=np.bool_)}
            observation, _ = env.reset()
        self._terminations[0], self._truncations[0] = terminated, truncated
        self._autoreset_envs[0] = terminated or truncated
        return (np.array([observation], dtype=self.single_observation_space.dtype),
                np.array([reward], dtype=np.float64), np.array([terminated], dtype=np.bool_),
                np.array([truncated], dtype=np.bool_), infos)


@contextlib.contextmanager
def _children_ignore_stops() -> Iterator[None]:
    """Ignore the stop signals while the AsyncVectorEnv starts its workers, which inherit
    that (a Python started with them ignored keeps them so): a Ctrl-C, a closing terminal's
    SIGHUP or a batch system's SIGTERM reaches the whole process group, and a worker would
    die of it (printing its traceback) while the training loop finishes its step and saves.
    A worker still ends with the loop: its pipe closes. The loop's own handlers are back
    afterwards."""
    try:
        previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOP_SIGNALS}
    except ValueError:  # not the main thread: signals are not ours to set
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def check_continuous_spaces(
    env_id: str,
    observation_space: gym.Space,
    action_space: gym.Space,
    algo: str = "sac",
) -> None:
    """Raise `EnvError` unless the spaces suit a continuous-action agent.

    Pass the single-env spaces (`envs.single_observation_space`, `envs.single_action_space`).
    The action space must be a 1-D float `Box` of at least one entry with finite bounds a
    finite width apart (the policy's [-1, 1] output is scaled onto them); the observation
    space must be a 1-D `Box` of at least one entry (the networks are MLPs). PPO (``algo``
    "ppo") also acts in a `Discrete` action space (its categorical actor).
    """
    name = algo.upper()
    if algo == "ppo" and isinstance(action_space, gym.spaces.Discrete):
        _check_observations(env_id, observation_space, name)
        return
    if not isinstance(action_space, gym.spaces.Box):
        raise EnvError(f"{name} needs a continuous action space; {env_id} has {action_space}"
                       + (" (--algo ppo takes discrete actions)"
                          if isinstance(action_space, gym.spaces.Discrete) else ""))
    if len(action_space.shape) != 1:
        raise EnvError(f"{name} needs a flat (1-D) Box action space; {env_id} has {action_space}")
    if action_space.shape[0] == 0:
        raise EnvError(f"{name} needs an action space of at least one entry; {env_id} has "
                       f"{action_space}")
    if not np.issubdtype(action_space.dtype, np.floating):
        # The policy's actions are real numbers: an int env would get floats outside its space.
        raise EnvError(f"{name} needs a float Box action space (SAC, TD3 and DDPG choose "
                       f"real-valued actions); {env_id} has {action_space}: declare a float32 "
                       "Box and round the actions in the environment")
    low, high = action_space.low, action_space.high
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise EnvError(
            f"{name} needs an action space with finite bounds; {env_id} has {action_space}"
        )
    # The width as scale_action computes it, in the space's dtype, and as the policy's action
    # pipe does, in float32: a float64 space's bounds past float32's range would give the
    # env inf or nan actions from the first policy step on.
    for dtype in (np.dtype(np.float32), action_space.dtype):
        with np.errstate(over="ignore"):
            width = high.astype(dtype) - low.astype(dtype)
        if not np.all(np.isfinite(width)):
            raise EnvError(f"{name} needs action bounds whose width (high - low) is a finite "
                           f"{dtype}; {env_id} has {action_space}")
    _check_observations(env_id, observation_space, name)


def _check_observations(env_id: str, observation_space: gym.Space, name: str) -> None:
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise EnvError(
            f"{name} needs a flat Box observation space; {env_id} has {observation_space} "
            "(wrap it in gymnasium.wrappers.FlattenObservation)"
        )
    if observation_space.shape[0] == 0:
        raise EnvError(f"{name} needs an observation space of at least one entry; {env_id} "
                       f"has {observation_space}")


def check_trained_observations(env_id: str, observation_space: gym.Space, state: dict,
                               run: str, use: str) -> None:
    """Raise `EnvError` when a checkpoint's observations (``state["observations"]``, one row
    per env) are not of ``observation_space``'s size: the env changed since the run was
    trained (a user's own env, edited), and its networks would not fit it. ``run`` names the
    run, ``use`` what the user was doing ("resume", "evaluate")."""
    saved = state.get("observations")
    if not isinstance(saved, np.ndarray) or saved.ndim != 2:
        return
    if saved.shape[1] != observation_space.shape[0]:
        raise EnvError(f"{run} was trained on observations of {saved.shape[1]} entries, but "
                       f"{env_id}'s observation space is now {observation_space}; {use} with "
                       "the environment it was trained on")


def true_next_observations(next_obs: np.ndarray, infos: dict) -> np.ndarray:
    """The observations that really followed this step's actions, for the replay buffer.

    Where an episode ended this step, SAME_STEP autoreset has already put the next episode's
    first observation in `next_obs`; the real last one is in `infos["final_obs"]`. Store
    `terminations` (not `terminations | truncations`) as done, so a time-limit truncation still
    bootstraps from this final observation.
    """
    mask = infos.get("_final_obs")
    if mask is None or not np.any(mask):
        return next_obs
    real = np.array(next_obs, copy=True)
    # final_obs is an object array (None where no episode ended), so stack the present ones.
    real[mask] = np.stack(infos["final_obs"][mask]).astype(real.dtype, copy=False)
    return real


class EpisodeStatistics:
    """The return and length of each env's episode under way; `update` gives those that ended.

    With SAME_STEP autoreset every step belongs to an episode, the one it ends included.
    Kept by the loop rather than a wrapper around the env, so the env can be stepped in two
    halves (`EnvStepper`) and the counts go into checkpoints as plain arrays.
    """

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def update(self, rewards: np.ndarray, terminations: np.ndarray, truncations: np.ndarray
               ) -> list[tuple[int, float, int]]:
        """Count one step of every env; return (env, return, length) of each episode it
        ended."""
        self.returns += rewards
        self.lengths += 1
        done = np.logical_or(terminations, truncations)
        if not done.any():
            return []
        ended = [(int(i), float(self.returns[i]), int(self.lengths[i]))
                 for i in np.flatnonzero(done)]
        self.returns[done] = 0.0
        self.lengths[done] = 0
        return ended

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"returns": self.returns.copy(), "lengths": self.lengths.copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.returns[:] = state["returns"]
        self.lengths[:] = state["lengths"]


class EnvStepper:
    """Steps a vector env in two halves. `start(actions)` hands the actions over: envs in
    subprocesses (an `AsyncVectorEnv`) start stepping at once, so the caller can do other
    work (launch the updates) meanwhile; `finish()` returns the step's results. An
    in-process env steps in `finish`."""

    def __init__(self, envs: VectorEnv) -> None:
        self.envs = envs
        self._async = (envs.unwrapped if isinstance(envs.unwrapped,
                                                    (AsyncVectorEnv, SharedMemoryVectorEnv))
                       else None)
        self.asynchronous = self._async is not None
        self._actions: np.ndarray | None = None
        # True while an in-process env steps: code of the env's own, which a second stop
        # signal may interrupt (see train.stop_requests).
        self.in_env_step = False

    def start(self, actions: np.ndarray) -> None:
        if self._async is not None:
            self._async.step_async(actions)
        else:
            self._actions = actions

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._async is None and self._actions is None:
            raise RuntimeError("finish() without start(): hand the actions over first")
        try:
            if self._async is not None:
                return self._async.step_wait()
            actions, self._actions = self._actions, None
            self.in_env_step = True
            try:
                return self.envs.step(actions)
            finally:
                self.in_env_step = False
        except EnvError:  # from SpaceCheck, in this process or a worker: already one line
            raise
        except Exception as exc:  # the env's own code (a custom env's step) failed
            raise EnvError(raised_line("step", exc)) from exc


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, NumPy's global generator and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    # manual_seed already seeds CUDA lazily; being explicit keeps the intent visible.
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def rng_state() -> dict[str, Any]:
    """Every global random state a run draws from (for checkpoints)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved (CUDA states only where CUDA is present)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def scale_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Map a policy action in [-1, 1] onto the env's bounds [low, high]."""
    scaled = low + (np.asarray(action) + 1.0) * 0.5 * (high - low)
    # Rounding at ±1 may land a hair outside the bounds, which some envs reject.
    return np.clip(scaled, low, high)
