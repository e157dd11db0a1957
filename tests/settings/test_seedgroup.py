"""Tests for the seed group's rules: the seeds the settings name, the limits of a group and of
a seed, and the checks of the seed flags and of a resume's seeds (each one line)."""

from __future__ import annotations

import pytest

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.settings.seedgroup import (
    MAX_SEEDS,
    SEED_MAX,
    check_resumed_seeds,
    check_seed_flags,
    group_problem,
    group_seeds,
    num_seeds_problem,
    seed_list_problem,
)


def test_group_seeds_is_the_list_as_given_else_a_range_from_seed() -> None:
    assert group_seeds(4, 1, None) == (4,)
    assert group_seeds(4, 3, None) == (4, 5, 6)
    assert group_seeds(4, 1, (7, 3)) == (7, 3)  # a list keeps its order; seed is not used
    assert group_seeds(1, 2, [3, 5]) == (3, 5)


def test_the_limits() -> None:
    assert (MAX_SEEDS, SEED_MAX) == (64, 2**32 - 1)
    assert num_seeds_problem(64) is None and seed_list_problem(tuple(range(64))) is None
    assert num_seeds_problem(65) == ("must be at most 64, got 65: past that one batched update "
                                     "costs as much as several processes; split the seeds "
                                     "into groups")
    assert seed_list_problem(tuple(range(65))).startswith("must be at most 64 seeds, got 65: ")
    assert seed_list_problem((0, SEED_MAX)) is None
    assert seed_list_problem(()) == "must be one or more seeds, got none"
    assert seed_list_problem((1, SEED_MAX + 1)) == (
        "must each be in [0, 4294967295] (numpy's seed range), got 4294967296 in 1 4294967296")
    assert seed_list_problem((3, 5, 3)) == "must differ from each other, got 3 twice in 3 5 3"


def test_group_problem() -> None:
    assert group_problem(1, 3, (3, 5, 7)) is None
    assert group_problem(SEED_MAX - 1, 2, None) is None
    assert group_problem(1, 3, (3, 5)).startswith("--seeds 3 5 and --num-seeds 3 cannot both")
    assert group_problem(SEED_MAX - 1, 3, None) == (
        "--num-seeds 3 from --seed 4294967294 runs seeds up to 4294967296, above 4294967295 "
        "(2**32 - 1, numpy's seed range); lower --seed")
    assert group_problem(SEED_MAX, 5, (1, 2, 3, 4, 5)) is None  # a list ignores --seed


@pytest.mark.parametrize(("given", "message"), [
    ({"seeds": (3,), "num_seeds": 1}, "--seeds and --num-seeds cannot both be given"),
    ({"seeds": (3,), "seed": 3}, "--seed and --seeds cannot both be given"),
])
def test_seed_flags_that_name_the_group_twice(given: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_seed_flags(given)
    check_seed_flags({"seed": 3, "num_seeds": 2})
    check_seed_flags({"seeds": (3, 5)})


def test_a_resume_keeps_its_seeds() -> None:
    check_resumed_seeds((3, 5, 7), {"num_seeds": 3, "seeds": (3, 5, 7), "seed": 3})
    check_resumed_seeds((1,), {"seed": 1})
    # A single run's generators are the checkpoint's: another --seed would only be recorded.
    with pytest.raises(ConfigError, match=r"^--seed 9 does not match: the resumed run has 1 "
                                          r"seed \(1\), .*; drop --seed$"):
        check_resumed_seeds((1,), {"seed": 9})
    with pytest.raises(ConfigError) as info:
        check_resumed_seeds((1, 2, 3), {"num_seeds": 4})
    assert str(info.value) == ("--num-seeds 4 does not match: the resumed run has 3 seeds "
                               "(1 2 3), and a run resumes with its own seeds; drop --num-seeds")
    with pytest.raises(ConfigError, match="^--seeds 3 7 5 does not match: the resumed run has "
                                          r"3 seeds \(3 5 7\)"):
        check_resumed_seeds((3, 5, 7), {"seeds": (3, 7, 5)})
    with pytest.raises(ConfigError, match=r"^--seed 2 does not match: .*drop --seed$"):
        check_resumed_seeds((1, 2, 3), {"seed": 2})
