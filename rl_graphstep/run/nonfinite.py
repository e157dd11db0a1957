"""Non-finite values from the environment: transitions checked on the host before they are
stored, observations made safe for the policy, and the run's tally of what was skipped.

A NaN or inf that reached the replay buffer would poison every batch that samples its row (the
update is then skipped on the device, see ``NonFiniteGuard``), so such a row never gets in: a
few ``np.isfinite`` calls per step on the host, the whole check when all is well.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.envs.vector import scale_action
from rl_graphstep.run.cli import suggested_command

__all__ = [
    "NonFiniteTally",
    "describe_updates",
    "finite_mask",
    "finite_transitions",
    "mostly_skipped",
    "mostly_skipped_message",
    "nonfinite_stop_message",
    "not_learned",
    "policy_inputs",
    "random_actions_for",
    "store_seeds",
]

# The parts of a transition, in the order the buffer takes them; terminations are booleans.
_PARTS = ("observation", "action", "reward", "next observation")
# What a user can do about updates that keep coming out non-finite.
_ADVICE = ("check the rewards and observations the environment returns, or lower the learning "
           "rates")
# What a user can do about transitions that keep coming out non-finite.
_ENV_ADVICE = "check the rewards and observations the environment returns"
# What the warning about a run's first non-finite transition says becomes of them: the
# off-policy collector's (an on-policy one says its own).
_STORED = ("transitions with NaN or inf are not stored but counted in "
          "charts/nonfinite_transitions")


class NonFiniteTally:
    """Stores transitions that are finite and counts the others; counts skipped updates.

    A step's non-finite rows are dropped (and counted in :attr:`transitions`); the first one
    of a run is warned about, naming the env and what was not finite. With several envs, the
    finite rows of such a step are held back until they make a full batch of ``num_envs``
    rows: the buffer then always receives batches of one size (on CUDA each size has its own
    pinned staging and captured write, which must not be rebuilt mid-run).

    It also keeps the skipped-update counts of earlier runs of the same training (before a
    resume), since the device-side counters start from zero in each process.

    With K seeds in one run each seed has a tally of its own (``seed``: its seed, named in
    the warning), and :func:`store_seeds` stores their transitions.
    """

    def __init__(self, env_id: str, first_update: int = 0, *, seed: int | None = None) -> None:
        self.env_id = env_id
        self.seed = seed
        self.transitions = 0  # transitions dropped for a non-finite value
        self.episodes = 0  # ended episodes with a non-finite return (left out of the means)
        self.warned = False
        self._held: list[tuple[np.ndarray, ...]] = []
        # Updates made before this process's steps were built, and the counts of the runs
        # before a resume: the guards' counters cover only this process.
        self.first_update = first_update
        self.before: dict[str, tuple[int, int]] = {}  # kind: (skipped, made)

    def store(self, buffer: ReplayBuffer, step: int, observations: np.ndarray,
              actions: np.ndarray, rewards: np.ndarray, next_observations: np.ndarray,
              terminations: np.ndarray) -> None:
        """``buffer.add`` the transitions whose observation, action, reward and next
        observation are all finite; count and drop the others. ``step``: the global step,
        for the warning."""
        if not self._held and all_finite(observations, actions, rewards, next_observations):
            buffer.add(observations, actions, rewards, next_observations, terminations)
            return
        n = len(rewards)
        finite = self._drop(step, _finite_rows(observations, actions, rewards,
                                               next_observations), stacklevel=4)
        columns = (observations, actions, rewards, next_observations, terminations)
        self._held.append(tuple(np.asarray(c)[finite] for c in columns))
        held = sum(len(rows[2]) for rows in self._held)
        if held >= n:
            joined = [np.concatenate(c) for c in zip(*self._held, strict=True)]
            buffer.add(*(c[:n] for c in joined))
            self._held = [tuple(c[n:] for c in joined)] if held > n else []

    def _drop(self, step: int, finite_parts: list[np.ndarray], stacklevel: int,
              consequence: str = _STORED) -> np.ndarray:
        """Which rows to store, given per part which rows are finite; counts the others and
        warns at the run's first (``stacklevel`` as `warnings.warn` counts it from here),
        saying what becomes of them (``consequence``)."""
        finite = np.ones(len(finite_parts[0]), dtype=bool)
        for name, ok in zip(_PARTS, finite_parts, strict=True):
            if not ok.all() and not self.warned:
                self.warned = True
                env = int(np.flatnonzero(~ok)[0])
                where = f"env {env}" if self.seed is None else f"seed {self.seed}, env {env}"
                warnings.warn(
                    f"{self.env_id} returned a non-finite {name} ({where}, step {step}); "
                    f"{consequence} (warned once per run)",
                    stacklevel=stacklevel)
            finite &= ok
        self.transitions += int(finite.size - finite.sum())
        return finite

    def count(self, transitions: tuple[np.ndarray, ...] | None) -> int:
        """How many of ``transitions`` (as :meth:`store` takes them) :meth:`store` would drop."""
        if transitions is None:
            return 0
        finite = np.logical_and.reduce(_finite_rows(*transitions[:4]))
        return int(finite.size - finite.sum())

    def count_episode(self, episodic_return: float) -> bool:
        """Whether an ended episode's return is finite; counts it when it is not."""
        if np.isfinite(episodic_return):
            return True
        self.episodes += 1
        return False

    def updates(self, learner: Any) -> dict[str, tuple[int, int]]:
        """(skipped, made) critic and actor steps over the whole run, by kind; reads the
        device (a sync: call at log intervals, not per step)."""
        made_now = learner.steps_made(learner.updates)
        made_then = learner.steps_made(self.first_update)
        skipped = learner.skipped_steps()
        counts = {}
        for kind in ("critic", "actor"):
            before = self.before.get(kind, (0, 0))
            counts[kind] = (before[0] + skipped[kind],
                            before[1] + made_now[kind] - made_then[kind])
        return counts

    def skipped_before(self) -> int:
        """Update steps skipped before this process (a resumed run), critic and actor."""
        return sum(skipped for skipped, _ in self.before.values())

    def state_dict(self, learner: Any) -> dict[str, Any]:
        return {"transitions": self.transitions, "episodes": self.episodes,
                "warned": self.warned, "held": self._held, "updates": self.updates(learner)}

    def load_state_dict(self, state: dict[str, Any] | None, first_update: int) -> None:
        """Restore :meth:`state_dict`; ``first_update``: the resumed learner's update count.
        ``None`` (a checkpoint from before this tally) keeps the zeros."""
        self.first_update = first_update
        if state is None:
            return
        self.transitions, self.episodes = int(state["transitions"]), int(state["episodes"])
        self.warned, self._held = bool(state["warned"]), list(state["held"])
        self.before = {kind: (int(s), int(m)) for kind, (s, m) in state["updates"].items()}


def store_seeds(tallies: Sequence[NonFiniteTally], buffer: ReplayBuffer, step: int,
                observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                next_observations: np.ndarray, terminations: np.ndarray) -> None:
    """:meth:`NonFiniteTally.store` for a buffer of K seeds (one tally each): the arrays hold
    K x n rows, seed k's envs being rows k*n .. k*n+n-1. Each seed's tally counts and warns
    about its own rows only, and each seed stores its finite rows at once: the buffer of K
    seeds takes any count per seed in one write, so nothing is held back."""
    finite = finite_transitions(tallies, step, observations, actions, rewards,
                                next_observations)
    buffer.add(observations, actions, rewards, next_observations, terminations,
               keep=None if finite.all() else finite)


def finite_transitions(tallies: Sequence[NonFiniteTally], step: int, observations: np.ndarray,
                       actions: np.ndarray, rewards: np.ndarray,
                       next_observations: np.ndarray, *, consequence: str = _STORED
                       ) -> np.ndarray:
    """Which of K x n transitions (seed k's envs being rows k*n .. k*n+n-1) are finite; each
    seed's tally counts and warns about its others, which the caller leaves out (the warning
    says what becomes of them: ``consequence``). The warning names the line two calls up
    (the collector's flush, which calls the caller)."""
    if all_finite(observations, actions, rewards, next_observations):
        return np.ones(len(rewards), dtype=bool)
    n = len(rewards) // len(tallies)
    parts = _finite_rows(observations, actions, rewards, next_observations)
    finite = np.empty(len(rewards), dtype=bool)
    for seed, tally in enumerate(tallies):  # a loop, not a comprehension: no frame of its own
        rows = slice(seed * n, seed * n + n)
        finite[rows] = tally._drop(step, [ok[rows] for ok in parts], stacklevel=4,
                                   consequence=consequence)
    return finite


def finite_mask(observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                next_observations: np.ndarray) -> np.ndarray | None:
    """Which rows of a step's transitions are finite in every part, the rows the tally
    stores; None when all are (the fast path)."""
    if all_finite(observations, actions, rewards, next_observations):
        return None
    return np.logical_and.reduce(_finite_rows(observations, actions, rewards, next_observations))


def all_finite(*parts: np.ndarray) -> bool:
    """Whether every value of every part is finite: the common case, checked first (one
    pass over each part, where the rows' masks would take several)."""
    return all(np.isfinite(part).all() for part in parts)


def _finite_rows(*parts: np.ndarray) -> list[np.ndarray]:
    """Per part (n rows, or n values), which of its n rows are all finite."""
    n = len(parts[0])
    return [np.isfinite(np.asarray(part).reshape(n, -1)).all(axis=1) for part in parts]


def mostly_skipped(counts: dict[str, tuple[int, int]]) -> bool:
    """More than half the critic's or the actor's steps were skipped: it did not learn."""
    return any(made > 0 and 2 * skipped > made for skipped, made in counts.values())


def describe_updates(counts: dict[str, tuple[int, int]]) -> str:
    """``100 of 200 critic updates and 0 of 200 actor updates``."""
    return " and ".join(f"{skipped:,} of {made:,} {kind} updates"
                        for kind, (skipped, made) in counts.items())


def nonfinite_stop_message(limit: int, consecutive: int, step: int, saved: Path) -> str:
    """Why a run stopped after ``--nonfinite-limit`` consecutive non-finite updates. The count
    is read at log intervals only (reading it is a device sync), so it may have run past the
    limit by up to an interval's updates: say both."""
    run_dir = saved.parent.parent
    return (f"at least --nonfinite-limit {limit} consecutive updates had non-finite losses or "
            f"gradients ({consecutive} by step {step}, when it was checked); checkpoint "
            f"{saved} holds the parameters of the last finite update; {_ADVICE}; then continue "
            f"with: {suggested_command('train', '--resume', str(run_dir))}")


def mostly_skipped_message(counts: dict[str, tuple[int, int]], run_dir: str) -> str:
    """Why a finished run whose updates were :func:`mostly_skipped` is an error."""
    return (f"most updates were skipped for non-finite losses or gradients "
            f"({describe_updates(counts)}), so the agent did not learn; {_ADVICE}; logs and "
            f"checkpoint kept in {run_dir}")


def not_learned(counts: dict[str, tuple[int, int]], tallies: Sequence[NonFiniteTally], *,
                steps: int, learning: bool, stored: int, batch_size: int, run_dir: str
                ) -> str | None:
    """Why a finished run did not learn (its exit-3 line), or None when it did: it made no
    update at all where ``learning`` (it took steps past ``--learning-starts``, so updates were
    due), skipped most of its updates, or dropped most of a seed's transitions.

    ``counts``: :meth:`NonFiniteTally.updates`; ``tallies``: each seed's; ``steps``: each
    seed's environment steps over the whole run; ``stored``: the rows of its replay buffer
    (a group's least filled seed's, which decides whether the group can update)."""
    kept = f"logs and checkpoint kept in {run_dir}"
    dropped = _dropped(tallies, steps)
    if learning and counts["critic"][1] == 0:
        why = (f"the replay buffer never held a batch of --batch-size {batch_size} transitions "
               f"(it holds {stored:,}")
        if dropped:
            return (f"no update was made: {why}; {dropped} had non-finite values and were not "
                    f"stored), so the agent did not learn; {_ENV_ADVICE}; {kept}")
        return (f"no update was made: {why}), so the agent did not learn; raise "
                f"--total-timesteps; {kept}")
    if mostly_skipped(counts):
        return mostly_skipped_message(counts, run_dir)
    if any(2 * tally.transitions > steps for tally in tallies):
        return (f"most transitions had non-finite values and were not stored ({dropped}), so "
                f"the agent learned from few of its steps; {_ENV_ADVICE}; {kept}")
    return None


def _dropped(tallies: Sequence[NonFiniteTally], steps: int) -> str:
    """``300 of 1,000 transitions``; a group's seeds that dropped any, ``seed 2: 300 of 1,000
    transitions``; "" when none dropped any."""
    if len(tallies) == 1:
        return f"{tallies[0].transitions:,} of {steps:,} transitions" if tallies[0].transitions \
            else ""
    parts = [f"seed {t.seed}: {t.transitions:,} of {steps:,}" for t in tallies if t.transitions]
    return f"{', '.join(parts)} transitions" if parts else ""


def policy_inputs(observations: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Observations the policy may see, and the mask of envs whose own were not finite (None
    when all were: the fast path, one check). Those rows are zeros here; their actions must
    be replaced (:func:`random_actions_for`), as a NaN or inf input makes a NaN action."""
    if np.isfinite(observations).all():
        return observations, None
    unsafe = ~np.isfinite(observations).all(axis=1)
    safe = np.array(observations, copy=True)
    safe[unsafe] = 0.0
    return safe, unsafe


def random_actions_for(unsafe: np.ndarray, actions: np.ndarray, env_actions: np.ndarray,
                       low: np.ndarray, high: np.ndarray) -> None:
    """Overwrite, in place, the actions of the ``unsafe`` envs with uniform random ones (as
    in the warm-up), in [-1, 1] and scaled onto the bounds."""
    random = np.random.uniform(-1.0, 1.0, (int(unsafe.sum()), actions.shape[1]))
    actions[unsafe] = random
    env_actions[unsafe] = scale_action(random, low, high)

