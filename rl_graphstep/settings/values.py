"""One setting's value checked alone: its choices, its range, the limits numpy, torch and the
file system set (what a Config's fields, a YAML file's keys and a sweep's values share)."""

from __future__ import annotations

import math
from typing import Any

from rl_graphstep.settings.seedgroup import SEED_MAX, num_seeds_problem, seed_list_problem

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
# The values of every on/off setting that can also be left to the machine.
SWITCH_MODES: tuple[str, ...] = ("auto", "on", "off")
VEC_ENVS: tuple[str, ...] = ("auto", "sync", "async", "shared")

_POSITIVE_INTS = (
    "total_timesteps",
    "num_envs",
    "updates_per_step",
    "buffer_size",
    "batch_size",
    "policy_frequency",
    "target_network_frequency",
    "log_interval",
    "checkpoint_every",
    "keep_checkpoints",
    "nonfinite_limit",
    "num_seeds",
    "n_step",
    "num_steps",
    "num_minibatches",
    "update_epochs",
)
CHOICES: dict[str, tuple[str, ...]] = {
    "device": DEVICES, "vec_env": VEC_ENVS, "graph": SWITCH_MODES,
    "compile": SWITCH_MODES, "action_stream": SWITCH_MODES,
}
# The auto/on/off settings: YAML 1.1 reads a bare on/off as true/false, and configs saved
# before --action-stream had an auto value hold a bool there; both mean on/off.
SWITCH_FIELDS = tuple(name for name, choices in CHOICES.items() if choices is SWITCH_MODES)


# PPO's settings that must be finite and above 0.
_POSITIVE_RATES = ("learning_rate", "clip_coef", "vf_coef", "max_grad_norm")
_NOISES = ("policy_noise", "noise_clip", "exploration_noise")
_SPEC_FORMS = "package.module:ClassName or path/to/file.py:ClassName"


def flag_of(name: str) -> str:
    """The command-line flag of a field: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def _spec_problem(value: str) -> str | None:
    """Only the `something:ClassName` shape is checked here; importing happens at build time."""
    where, colon, name = value.rpartition(":")
    if not colon:
        return f"must be {_SPEC_FORMS}, got {value!r} (no ':')"
    # A dotted name is a class's __qualname__ (Outer.Inner), as runs record classes passed
    # from Python; "<locals>" ones are refused with their reason when loaded.
    parts = name.split(".")
    if not where.strip() or not all(p.isidentifier() or p == "<locals>" for p in parts):
        return f"must be {_SPEC_FORMS}, got {value!r}"
    return None


# Torch sizes and counts are int64.
INT_MAX = 2**63 - 1
# More environments than this is a typo: each is an object (or a process) of its own.
MAX_NUM_ENVS = 4096
# More updates per env iteration than this is a typo (high update-to-data methods such as
# REDQ use 20): an iteration is where a stop signal is heard, and 10**9 updates never end one.
MAX_UPDATES_PER_STEP = 1000
# Longer returns than this is a typo (FastTD3 uses 3 to 8); each env keeps its last N steps.
MAX_N_STEP = 64
# More atoms than this is a typo (C51 uses 51, FastTD3 101 to 251, FastSAC up to 501); the
# projection holds batch x atoms x atoms floats for a moment.
MAX_CRITIC_ATOMS = 1024
_STRINGS = ("env_id", "log_dir", "run_name", "resume", "actor", "critic")


def _limit_problem(name: str, value: Any) -> str | None:
    """Values that pass the field's own check but that numpy, torch or the file system
    cannot take: seeds and counts out of range, unusable names."""
    if name == "seed" and value > SEED_MAX:
        return f"must be at most {SEED_MAX} (2**32 - 1, numpy's seed range), got {value}"
    if name in (*_POSITIVE_INTS, "learning_starts") and value > INT_MAX:
        return f"must be at most {INT_MAX} (2**63 - 1), got {value}"
    if name == "num_envs" and value > MAX_NUM_ENVS:
        return f"must be at most {MAX_NUM_ENVS}, got {value}"
    if name == "updates_per_step" and value > MAX_UPDATES_PER_STEP:
        return f"must be at most {MAX_UPDATES_PER_STEP}, got {value}"
    if name == "n_step" and value > MAX_N_STEP:
        return f"must be at most {MAX_N_STEP}, got {value}"
    if name == "critic_atoms" and value > MAX_CRITIC_ATOMS:
        return f"must be at most {MAX_CRITIC_ATOMS}, got {value}"
    if name == "num_seeds":
        return num_seeds_problem(value)
    if name in _STRINGS and isinstance(value, str):
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            return f"must not contain control characters such as NUL or a newline, got {value!r}"
        if name == "resume" and not value.strip():
            return "must not be empty: give a run folder or a checkpoint file"
        if name == "run_name" and ("/" in value or "\\" in value or value in (".", "..")):
            return f"must be one folder name (no / or \\, not . or ..), got {value!r}"
    return None


def value_problem(name: str, value: Any) -> str | None:
    """What is wrong with one (already well-typed) value, or None when it is fine."""
    if name in CHOICES and value not in CHOICES[name]:
        return f"must be one of {', '.join(CHOICES[name])}, got {value!r}"
    if name in _POSITIVE_INTS and value <= 0:
        return f"must be a positive int, got {value!r}"
    if name in ("seed", "learning_starts") and value < 0:
        return f"must be >= 0, got {value!r}"
    if name == "tau" and not 0 < value <= 1:
        return f"must be in (0, 1], got {value!r}"
    if name in ("gamma", "gae_lambda") and not 0 <= value <= 1:
        return f"must be in [0, 1], got {value!r}"
    if name in _POSITIVE_RATES and not (value > 0 and math.isfinite(value)):
        return f"must be a finite number > 0, got {value!r}"
    if name == "target_kl" and value is not None and not (value > 0 and math.isfinite(value)):
        return f"must be a finite number > 0 (or None: no early stop), got {value!r}"
    if name in ("policy_lr", "q_lr") and not (value > 0 and math.isfinite(value)):
        return f"must be a finite number > 0, got {value!r}"
    if name in ("critic_max_grad_norm", "actor_max_grad_norm") and not value > 0:
        return f"must be > 0, got {value!r}"  # inf: no clipping
    if name in ("alpha", "weight_decay", "ent_coef") and not (value >= 0 and math.isfinite(value)):
        return f"must be a finite number >= 0, got {value!r}"
    if name == "seeds" and value is not None:
        return seed_list_problem(value)
    if name == "critic_hidden_sizes" and value is not None and (
            not value or any(w <= 0 for w in value)):
        return f"must be one or more positive ints (or None: --hidden-sizes), got {list(value)!r}"
    if name == "batch_renorm_momentum" and not 0 < value <= 1:
        return f"must be in (0, 1], got {value!r}"
    if name == "batch_renorm_warmup" and value < 0:
        return f"must be >= 0, got {value!r}"
    if name == "hidden_sizes" and (not value or any(w <= 0 for w in value)):
        return f"must be one or more positive ints, got {list(value)!r}"
    if name in _NOISES and not (value >= 0 and math.isfinite(value)):
        return f"must be a finite number >= 0, got {value!r}"
    if name == "critic_atoms" and (value < 0 or value == 1):
        return (f"must be 0 (the scalar critic) or at least 2 atoms (51 and 101 are typical), "
                f"got {value!r}")
    if name in ("v_min", "v_max") and value is not None and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if name in ("actor", "critic") and value is not None:
        return _spec_problem(value)
    if name in ("env_id", "log_dir", "run_name") and value == "":
        return "must not be empty"
    return _limit_problem(name, value)
