"""The seeds a run trains: the group its settings name, the seed range and the largest group,
and the checks of the seed settings (in a Config, on the command line and on resume)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl_graphstep.core.errors import ConfigError

__all__ = ["MAX_SEEDS", "SEED_MAX", "check_resumed_seeds", "check_seed_flags", "group_problem",
           "group_seeds", "num_seeds_problem", "seed_list_problem"]

# numpy's legacy global seeding (np.random.seed) takes [0, 2**32 - 1].
SEED_MAX = 2**32 - 1
# The largest seed group: each seed is one more copy of the networks, optimizer state and
# replay buffer on the device and one more set of environments stepped by the host, and past
# about 64 seeds one batched update costs as much as several processes would (an H200 probe
# of a SAC-shaped update: 1.6x the time of one seed at 8 seeds, 6x at 64).
MAX_SEEDS = 64
_SPLIT = "past that one batched update costs as much as several processes; split the seeds " \
         "into groups"


def group_seeds(seed: int, num_seeds: int, seeds: tuple[int, ...] | None) -> tuple[int, ...]:
    """The seeds that ``seed``, ``num_seeds`` and ``seeds`` name (see Config.seed_list):
    ``seeds`` as given, else ``seed`` to ``seed + num_seeds - 1``."""
    return tuple(seeds) if seeds is not None else tuple(range(seed, seed + num_seeds))


def num_seeds_problem(num_seeds: int) -> str | None:
    """What is wrong with a (positive) group size, or None."""
    if num_seeds > MAX_SEEDS:
        return f"must be at most {MAX_SEEDS}, got {num_seeds}: {_SPLIT}"
    return None


def seed_list_problem(seeds: tuple[int, ...]) -> str | None:
    """What is wrong with a list of the group's seeds, or None."""
    shown = " ".join(map(str, seeds))
    if not seeds:
        return "must be one or more seeds, got none"
    if len(seeds) > MAX_SEEDS:
        return f"must be at most {MAX_SEEDS} seeds, got {len(seeds)}: {_SPLIT}"
    if any(s < 0 or s > SEED_MAX for s in seeds):
        bad = next(s for s in seeds if s < 0 or s > SEED_MAX)
        return f"must each be in [0, {SEED_MAX}] (numpy's seed range), got {bad} in {shown}"
    if len(set(seeds)) != len(seeds):
        twice = next(s for s in seeds if seeds.count(s) > 1)
        return f"must differ from each other, got {twice} twice in {shown}"
    return None


def group_problem(seed: int, num_seeds: int, seeds: tuple[int, ...] | None) -> str | None:
    """What the seed settings together get wrong: a count and a list that disagree, or a
    count that runs past the largest seed."""
    if seeds is not None and num_seeds != len(seeds):
        return (f"--seeds {' '.join(map(str, seeds))} and --num-seeds {num_seeds} "
                "cannot both be given: --seeds lists the group's seeds, --num-seeds N runs "
                "--seed to --seed + N - 1")
    last = seed + num_seeds - 1
    if seeds is None and last > SEED_MAX:
        return (f"--num-seeds {num_seeds} from --seed {seed} runs seeds up to {last}, "
                f"above {SEED_MAX} (2**32 - 1, numpy's seed range); lower --seed")
    return None


def check_seed_flags(given: Mapping[str, Any]) -> None:
    """The seed flags that name the group twice over (as given, even where they agree)."""
    if "seeds" in given and "num_seeds" in given:
        raise ConfigError("--seeds and --num-seeds cannot both be given: --seeds lists the "
                          "group's seeds, --num-seeds N runs --seed to --seed + N - 1")
    if "seeds" in given and "seed" in given:
        raise ConfigError("--seed and --seeds cannot both be given: --seeds lists every seed "
                          "of the group (--seed N --num-seeds K runs N to N + K - 1)")


def check_resumed_seeds(seeds: tuple[int, ...], given: Mapping[str, Any]) -> None:
    """A run resumes with the seeds it started with, ``seeds``: its checkpoint holds one state
    per seed and every random generator's state. Another --seed would change nothing but the
    config its checkpoints record, a single run's included."""
    count = "1 seed" if len(seeds) == 1 else f"{len(seeds)} seeds"
    which = f"the resumed run has {count} ({' '.join(map(str, seeds))})"
    if "num_seeds" in given and given["num_seeds"] != len(seeds):
        raise ConfigError(f"--num-seeds {given['num_seeds']} does not match: {which}, and a "
                          "run resumes with its own seeds; drop --num-seeds")
    if "seeds" in given and tuple(given["seeds"]) != seeds:
        raise ConfigError(f"--seeds {' '.join(map(str, given['seeds']))} does not match: "
                          f"{which}, and a run resumes with its own seeds; drop --seeds")
    if "seed" in given and given["seed"] != seeds[0]:
        raise ConfigError(f"--seed {given['seed']} does not match: {which}, and a run "
                          "resumes with its own seeds; drop --seed")
