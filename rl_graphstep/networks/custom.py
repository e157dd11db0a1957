"""Custom networks that plug in: load a class by ``module:Class`` or ``file.py:Class`` and build
it (the built network is checked on an example batch by core.netcheck)."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import re
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
from torch import nn

from rl_graphstep.core.errors import ConfigError, user_location
from rl_graphstep.core.usercode import import_from_here, is_file_path

__all__ = [
    "NetworkSpec",
    "build_network",
    "load_class",
    "load_network_classes",
]

NetworkSpec = str | type | nn.Module
"""A `package.module:Class` / `path/file.py:Class` string, an `nn.Module` class, or a module."""

_SPEC_FORMS = "'package.module:ClassName' or 'path/to/file.py:ClassName'"
# Module names for files loaded by path: a fresh one per load, so two files with one stem
# (or one file loaded twice) never share a sys.modules entry.
_file_module_ids = itertools.count()


def load_class(spec: str) -> type:
    """The `nn.Module` subclass named by `spec`: `package.module:ClassName` (imported) or
    `path/to/file.py:ClassName` (executed from the file; a relative path is taken from the
    current directory).

    Raises:
        ConfigError: one line saying what is wrong with the spec, the module or the class.
    """
    location, sep, class_name = spec.rpartition(":")
    if not sep or not location or not class_name:
        raise ConfigError(f"network spec {spec!r} must be {_SPEC_FORMS}")
    _refuse_unfindable(spec, location, class_name)
    if is_file_path(location):
        module = _module_from_file(spec, location)
    else:
        module = _import_module(spec, location)

    # A dotted name is a nested class (Outer.Inner), as a class's __qualname__ spells it.
    cls = module
    for part in class_name.split("."):
        cls = getattr(cls, part, None)
    if cls is None:
        raise ConfigError(
            f"{location} has no class {class_name!r}; it defines {_classes_defined(module)}"
        )
    if not isinstance(cls, type):
        raise ConfigError(f"{spec} is a {type(cls).__name__}, not a class")
    if not issubclass(cls, nn.Module):
        raise ConfigError(f"{spec} is not a torch.nn.Module subclass")
    return cls


def _refuse_unfindable(spec: str, location: str, class_name: str) -> None:
    """The specs a run records for a class passed from Python that nothing can import again
    (see ``rl_graphstep.run.netspec``): one line saying why, instead of a failed lookup."""
    again = ("pass the class itself again (to train with cfg.resume, or to evaluate), or "
             "move it into a module or file and give that spec")
    if "<locals>" in class_name:
        raise ConfigError(f"{spec!r} is a class defined inside a function, which cannot be "
                          f"imported again; {again}")
    if location == "__main__":
        raise ConfigError(f"{spec!r} is a class of an interactive session or `python -c` (a "
                          f"__main__ without a file), which cannot be imported again; {again}")


def _import_module(spec: str, module_name: str) -> Any:
    try:
        return import_from_here(module_name)
    except ImportError as error:
        hint = ""
        if error.name == module_name.split(".")[0]:
            hint = (
                "; run from the folder that holds it or give the file form "
                "path/to/file.py:ClassName"
            )
        raise ConfigError(
            f"cannot import module {module_name!r} for {spec!r}: {error}{hint}"
        ) from error
    except Exception as error:  # the module's own code failed (a SyntaxError, say)
        raise ConfigError(
            f"cannot import module {module_name!r} for {spec!r}: {_raised(error)}"
        ) from error


def _raised(error: BaseException) -> str:
    """``RuntimeError: boom (at nets.py:3)``: the error's first line and the user's line."""
    where = user_location(error)
    return f"{type(error).__name__}: {_first_line(error)}" + (f" (at {where})" if where else "")


def _module_from_file(spec: str, location: str) -> Any:
    path = Path(location).expanduser()
    if path.is_dir():
        raise ConfigError(f"{location!r} for {spec!r} is a folder, not a Python file; give "
                          "the file that defines the class: path/to/file.py:ClassName")
    if not path.is_file():
        relative = "" if path.is_absolute() else f" (relative paths are taken from {os.getcwd()})"
        raise ConfigError(f"file {location!r} for {spec!r} does not exist{relative}")
    # Absolute, so tracebacks and inspect still find the source after a chdir.
    path = path.resolve()
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_rl_graphstep_plugin_{next(_file_module_ids)}_{stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"cannot load {location!r} for {spec!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    # Registered before running it, as `import` does: dataclasses and pickling look it up there.
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except ImportError as error:
        del sys.modules[name]
        raise ConfigError(f"cannot import {location!r} for {spec!r}: {error}") from error
    except Exception as error:  # the file's own code failed (a SyntaxError, say)
        del sys.modules[name]
        raise ConfigError(f"cannot import {location!r} for {spec!r}: "
                          f"{_raised(error)}") from error
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _classes_defined(module: Any, limit: int = 5) -> str:
    names = [
        name
        for name, value in vars(module).items()
        if isinstance(value, type) and value.__module__ == module.__name__
    ]
    if not names:
        return "no classes"
    more = ", ..." if len(names) > limit else ""
    return "the classes " + ", ".join(names[:limit]) + more


def build_network(
    spec_or_obj: NetworkSpec,
    observation_space: gym.Space,
    action_space: gym.Space,
    kwargs: dict[str, Any] | None,
    *,
    role: str,
) -> nn.Module:
    """The network `spec_or_obj` names: a spec string or class is built as
    `cls(observation_space, action_space, **kwargs)`; a built `nn.Module` is returned as is.

    Args:
        spec_or_obj: a spec for :func:`load_class`, an `nn.Module` subclass, or a module.
        observation_space / action_space: the environment's single (not vectorised) spaces.
        kwargs: extra constructor arguments (`actor_kwargs` / `critic_kwargs`); must be empty
            for a built module, which has no constructor left to take them.
        role: "actor" or "critic"; it starts every message.

    Raises:
        ConfigError: the spec cannot be loaded, the class is not an `nn.Module`, the
            constructor does not take `(observation_space, action_space, **kwargs)`, or kwargs
            were given with a built module.
    """
    kwargs = dict(kwargs or {})
    if isinstance(spec_or_obj, nn.Module):
        if kwargs:
            raise ConfigError(
                f"{role}: {role}_kwargs {sorted(kwargs)} were given, but the {role} is an "
                f"already built {type(spec_or_obj).__name__}; pass kwargs with a class or spec"
            )
        return spec_or_obj

    if isinstance(spec_or_obj, str):
        cls = _load_for(spec_or_obj, role)
    elif isinstance(spec_or_obj, type):
        cls = spec_or_obj
        if not issubclass(cls, nn.Module):
            raise ConfigError(f"{role}: {cls.__qualname__} is not a torch.nn.Module subclass")
    else:
        raise ConfigError(
            f"{role} must be a {_SPEC_FORMS} string, an nn.Module class or an nn.Module, "
            f"got {type(spec_or_obj).__name__}"
        )

    try:
        network = cls(observation_space, action_space, **kwargs)
    except TypeError as error:
        given = f" (given {role}_kwargs {sorted(kwargs)})" if kwargs else ""
        raise ConfigError(
            f"{role}: cannot build {cls.__qualname__}: its constructor must take "
            f"(observation_space, action_space, **kwargs){given}; "
            f"TypeError: {_first_line(error)}"
        ) from error
    except Exception as error:  # the constructor's own code failed
        raise ConfigError(f"{role}: cannot build {cls.__qualname__}: {_raised(error)}"
                          ) from error
    return network


def load_network_classes(*specs: tuple[NetworkSpec | None, str]) -> list[NetworkSpec | None]:
    """Each ``(spec, role)``'s spec with a string loaded to its class; classes, built modules
    and None as they are.

    Called once per run, before the networks of its seeds are built: a file spec loaded again
    is a new module with a new class object, and the seeds of a group must share one class
    (``SeedStack``). Loading once also runs the user's file once.
    """
    return [_load_for(spec, role) if isinstance(spec, str) else spec for spec, role in specs]


def _load_for(spec: str, role: str) -> type:
    """:func:`load_class`, its one line starting with ``role``."""
    try:
        return load_class(spec)
    except ConfigError as error:
        raise ConfigError(f"{role}: {error}") from error


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
