"""Making one copy of an environment, the one way every run, resume, env worker and evaluation
makes it: the module of a ``module:EnvId`` id imported, each failure one line, and what the env
returns checked against its spaces (``rl_graphstep.envs.check``)."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
from gymnasium import error as gym_error
from gymnasium.envs.registration import EnvSpec, load_env_creator

from rl_graphstep.core.errors import EnvError, RLGraphstepError, first_line, user_location
from rl_graphstep.core.usercode import import_from_here
from rl_graphstep.envs.check import SpaceCheck

__all__ = ["declared_render_modes", "env_errors", "import_env_module", "make_env",
           "quiet_mujoco_model_warning"]

# MuJoCo's compiler warns that gymnasium's own half_cheetah.xml uses the deprecated
# ``settotalmass`` attribute. Its C warning handler prints that to stderr (and appends it to
# MUJOCO_LOG.TXT in the current folder) in every process that loads the model, env workers
# too: lines about a file the user cannot change, at every run's start.
_GYMNASIUM_MUJOCO = "gymnasium.envs.mujoco"
_SETTOTALMASS = "settotalmass"
_mujoco_warnings_set = False  # in this process (a spawned env worker sets its own)


def quiet_mujoco_model_warning(entry_point: object) -> None:
    """Before one of gymnasium's MuJoCo envs is made in this process: MuJoCo's warnings go
    through :func:`_mujoco_warning`, which drops only the one about ``settotalmass``. A
    handler the user set is left alone."""
    global _mujoco_warnings_set
    if _mujoco_warnings_set or not (isinstance(entry_point, str)
                                    and entry_point.startswith(_GYMNASIUM_MUJOCO)):
        return
    _mujoco_warnings_set = True
    try:
        import mujoco
    except ImportError:  # gym.make says that MuJoCo is missing, in one line (env_errors)
        return
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


def _mujoco_warning(message: str) -> None:
    """A MuJoCo warning shown as its own handler shows it, but the one about gymnasium's
    model files."""
    if _SETTOTALMASS not in message:
        print(f"WARNING: {message}", file=sys.stderr, flush=True)


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """One copy of ``env_id``, as ``gym.make(env_id, **kwargs)`` makes it, with ``SpaceCheck``
    directly on what its entry point returns (below gymnasium's wrappers, which would otherwise
    meet a malformed result first).

    Pass ``render_mode`` only to render: an env whose constructor takes none is made without.

    Raises:
        EnvError: one line for a module that does not import, an unknown id (with the closest
            registered one), a missing MuJoCo or other package, or a constructor that fails.
    """
    spec = env_spec(env_id)
    quiet_mujoco_model_warning(spec.entry_point)
    checked = dataclasses.replace(spec, entry_point=_CheckedCreator(spec.entry_point, env_id))
    with env_errors(env_id):
        return gym.make(checked, **kwargs)


def env_spec(env_id: str) -> EnvSpec:
    """The registered spec of ``env_id`` (``module:EnvId``: after importing ``module``)."""
    import_env_module(env_id)
    with env_errors(env_id):
        return gym.spec(_registered_name(env_id))


def declared_render_modes(env_id: str) -> list[str] | None:
    """The render modes ``env_id``'s class declares in its metadata; None where its entry point
    (a function, say) declares none."""
    creator = _CheckedCreator(env_spec(env_id).entry_point, env_id)
    with env_errors(env_id):
        metadata = getattr(creator, "metadata", None)
    if not isinstance(metadata, dict):
        return None
    return list(metadata.get("render_modes") or [])


@contextlib.contextmanager
def env_errors(env_id: str) -> Iterator[None]:
    """Turn what making ``env_id`` raises into one ``EnvError`` line."""
    try:
        yield
    except RLGraphstepError:  # one line already (a module that does not import, say)
        raise
    except gym_error.DependencyNotInstalled as exc:
        raise EnvError(_missing_dependency_message(env_id, exc)) from exc
    except gym_error.Error as exc:
        # NameNotFound, VersionNotFound and NamespaceNotFound subclass UnregisteredEnv; a
        # malformed id is a bare gym Error. Any of them on an unregistered id means the id is
        # the problem; other gym errors on a registered id are not ours to reword.
        if (isinstance(exc, gym_error.UnregisteredEnv)
                or _registered_name(env_id) not in gym.envs.registry):
            raise EnvError(_unknown_env_message(env_id)) from exc
        raise
    except Exception as exc:
        # A registered env whose own code fails (a custom env's constructor): name it and
        # the user's line rather than show gymnasium's frames.
        raise EnvError(_failed_env_message(env_id, exc)) from exc


def import_env_module(env_id: str) -> None:
    """Import the module of a ``module:EnvId`` id (gymnasium would, unchecked), so that one
    that is missing or fails to import is one line naming it and the import's error. As for
    networks, the current folder is searched too: ``python -m`` puts it on ``sys.path``, the
    ``rl-graphstep-train`` command does not."""
    if ":" not in env_id:
        return
    module, _, name = env_id.partition(":")
    if not module or not name or ":" in name:
        raise EnvError(f"environment id {env_id!r} must be EnvId or module:EnvId "
                       "(one ':' between a module and a registered id)")
    try:
        import_from_here(module)
    except Exception as exc:  # any error of the user's module, SyntaxError included
        hint = ""
        if isinstance(exc, ImportError) and exc.name == module.split(".")[0]:
            hint = "; run from the folder that holds it, or add that folder to PYTHONPATH"
        raise EnvError(f"cannot import module {module!r} of environment {env_id!r}: "
                       f"{type(exc).__name__}: {first_line(exc)}" + _at_user_line(exc) + hint
                       ) from exc


class _CheckedCreator:
    """A spec's entry point whose envs come wrapped in ``SpaceCheck``. It pickles (to the
    async env's workers, into a sync env's checkpoint) and shows gymnasium's ``make`` the
    metadata of the entry point it stands for, which ``make`` reads for the render modes."""

    def __init__(self, entry_point: str | Callable[..., gym.Env], env_id: str) -> None:
        self.entry_point, self.env_id = entry_point, env_id

    def _creator(self) -> Callable[..., Any]:
        if callable(self.entry_point):
            return self.entry_point
        return load_env_creator(self.entry_point)

    def __call__(self, **kwargs: Any) -> Any:
        env = self._creator()(**kwargs)
        # Other spaces are refused by the run's checks (check_continuous_spaces).
        if isinstance(env, gym.Env) and isinstance(env.observation_space, gym.spaces.Box):
            return _Checked(env, self.env_id)
        return env

    def __getattr__(self, name: str) -> Any:
        if name != "metadata":
            raise AttributeError(name)
        return self._creator().metadata


class _Checked(SpaceCheck):
    """``SpaceCheck`` as the entry point's own: its spec is the env's, with no wrapper added,
    so that ``make`` still applies every wrapper the registration names."""

    @property
    def spec(self) -> EnvSpec | None:
        return self.env.spec


def _registered_name(env_id: str) -> str:
    """The registry's name of ``env_id``: without the ``module:`` of ``module:EnvId``."""
    return env_id.rpartition(":")[2]


def _at_user_line(exc: BaseException) -> str:
    where = user_location(exc)
    return f" (at {where})" if where else ""


def _failed_env_message(env_id: str, exc: Exception) -> str:
    return (f"environment {env_id!r} could not be made: {type(exc).__name__}: "
            f"{first_line(exc)}" + _at_user_line(exc))


def _unknown_env_message(env_id: str) -> str:
    """The one-line error for an id gymnasium does not know, with the closest registered id
    (in the ``module:EnvId`` form where the id came with its module)."""
    module, _, name = env_id.rpartition(":")
    known = list(gym.envs.registry.keys())
    # Compare case-insensitively so 'pendulum-v1' still finds 'Pendulum-v1'.
    by_lower = {known_name.lower(): known_name for known_name in known}
    # Only the best match: one name is a clear suggestion, a list reads as a puzzle.
    matches = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    if matches:
        hint = f"did you mean {module + ':' if module else ''}{by_lower[matches[0]]}?"
    elif module:
        hint = f"no environment of a similar name is registered, with {module!r} imported"
    else:
        hint = ("no registered environment has a similar name; an environment your own "
                "module registers is given as module:EnvId")
    return f"unknown environment {env_id!r}; {hint} (see gymnasium.envs.registry for the list)"


def _missing_dependency_message(env_id: str, exc: Exception) -> str:
    entry_point = str(getattr(gym.envs.registry.get(_registered_name(env_id)), "entry_point",
                              ""))
    if "mujoco" in entry_point.lower() or "mujoco" in str(exc).lower():
        return (
            f"environment {env_id!r} needs MuJoCo, which is not installed; "
            'run pip install "rl_graphstep[mujoco]"'
        )
    reason = " ".join(str(exc).split())
    return f"environment {env_id!r} needs a package that is not installed: {reason}"
