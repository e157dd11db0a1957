"""Custom networks by name and by file: loading a class and building it, each mistake one
line."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from netfixtures import (
    ACT_SPACE,
    LAYERNORM_CRITIC_FILE,
    OBS_SPACE,
    RESIDUAL_ACTOR,
    ROOT,
    build,
    write_bad_networks,
)
from torch import nn

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.networks.builtin import DeterministicActor, EnsembleCritic
from rl_graphstep.networks.custom import build_network, load_class


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    return write_bad_networks(tmp_path)


# --------------------------------------------------------------------------------------------
# load_class
# --------------------------------------------------------------------------------------------


def test_load_by_module_path() -> None:
    cls = load_class(RESIDUAL_ACTOR)
    assert cls.__name__ == "ResidualActor"
    assert cls.__module__ == "examples.residual_actor"


def test_load_by_absolute_and_relative_file_path(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = load_class(f"{LAYERNORM_CRITIC_FILE}:LayerNormCritic")
    assert cls.__name__ == "LayerNormCritic" and issubclass(cls, nn.Module)
    monkeypatch.chdir(ROOT)
    again = load_class("examples/layernorm_critic.py:LayerNormCritic")
    assert again.__name__ == "LayerNormCritic"
    # Each load of a file gets its own module name, so the two never share a sys.modules entry.
    assert again.__module__ != cls.__module__
    # Loaded from its absolute path, so a later chdir cannot break tracebacks into it.
    assert sys.modules[again.__module__].__file__ == str(LAYERNORM_CRITIC_FILE)


def test_spec_without_colon_names_both_forms() -> None:
    with pytest.raises(ConfigError) as info:
        load_class("examples.residual_actor.ResidualActor")
    message = str(info.value)
    assert "'package.module:ClassName' or 'path/to/file.py:ClassName'" in message
    assert "\n" not in message


def test_module_not_importable_names_it_and_the_import_error() -> None:
    with pytest.raises(ConfigError, match=r"cannot import module 'examples\.no_such_thing' for "
                                          r"'examples\.no_such_thing:X': No module named "
                                          r"'examples\.no_such_thing'$"):
        load_class("examples.no_such_thing:X")
    with pytest.raises(ConfigError, match=r"No module named 'nowhere_pkg'; run from the folder"):
        load_class("nowhere_pkg.actor:X")


def test_file_that_fails_to_import_names_the_import_error(tmp_path: Path) -> None:
    path = tmp_path / "needs_missing.py"
    path.write_text("import not_installed_anywhere_xyz\n")
    with pytest.raises(ConfigError, match=r"cannot import .*needs_missing\.py.*No module named "
                                          r"'not_installed_anywhere_xyz'"):
        load_class(f"{path}:X")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"file '.*nope\.py' for '.*nope\.py:X' does not exist"):
        load_class(f"{tmp_path / 'nope.py'}:X")


def test_a_folder_is_not_taken_for_a_missing_file(tmp_path: Path) -> None:
    """It said the folder 'does not exist'."""
    (tmp_path / "nets").mkdir()
    with pytest.raises(ConfigError) as info:
        load_class(f"{tmp_path}/nets:Actor")
    assert str(info.value) == (f"'{tmp_path}/nets' for '{tmp_path}/nets:Actor' is a folder, not "
                               "a Python file; give the file that defines the class: "
                               "path/to/file.py:ClassName")


def test_missing_class_lists_up_to_five_defined(bad_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_class(f"{bad_file}:Missing")
    message = str(info.value)
    assert re.search(r"bad_networks\.py has no class 'Missing'; it defines the classes "
                     r"Base, WrongShape, NoTuple, TupleOfThree, OutOfRange, \.\.\.$", message)
    # Imported names (nn, torch) are not classes the module defines.
    assert "Module" not in message


def test_missing_class_in_a_module_without_classes(tmp_path: Path) -> None:
    path = tmp_path / "empty.py"
    path.write_text("from torch import nn\n")
    with pytest.raises(ConfigError, match=r"has no class 'Actor'; it defines no classes$"):
        load_class(f"{path}:Actor")


def test_not_a_class_and_not_a_module(bad_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"bad_networks\.py:not_a_class is a function, "
                                          r"not a class$"):
        load_class(f"{bad_file}:not_a_class")
    with pytest.raises(ConfigError, match=r"bad_networks\.py:NotAModule is not a "
                                          r"torch\.nn\.Module subclass$"):
        load_class(f"{bad_file}:NotAModule")


# --------------------------------------------------------------------------------------------
# build_network
# --------------------------------------------------------------------------------------------


def test_build_from_spec_class_and_module_with_kwargs() -> None:
    actor = build(RESIDUAL_ACTOR, width=32, blocks=3)
    assert type(actor).__name__ == "ResidualActor"
    assert actor.stem.out_features == 32 and len(actor.blocks) == 3

    critic_cls = load_class(f"{LAYERNORM_CRITIC_FILE}:LayerNormCritic")
    critic = build_network(critic_cls, OBS_SPACE, ACT_SPACE, {"num_critics": 3},
                           role="critic")
    assert critic.num_critics == 3

    built = EnsembleCritic(OBS_SPACE, ACT_SPACE, (16,))
    assert build_network(built, OBS_SPACE, ACT_SPACE, None, role="critic") is built
    assert build_network(built, OBS_SPACE, ACT_SPACE, {}, role="critic") is built


def test_built_module_with_kwargs_is_refused() -> None:
    built = DeterministicActor(OBS_SPACE, ACT_SPACE, (16,))
    with pytest.raises(ConfigError, match=r"^actor: actor_kwargs \['width'\] were given, but "
                                          r"the actor is an already built DeterministicActor"):
        build_network(built, OBS_SPACE, ACT_SPACE, {"width": 3}, role="actor")


def test_constructor_type_error_names_class_and_signature(bad_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        build(RESIDUAL_ACTOR, depth=3)
    message = str(info.value)
    assert message.startswith("actor: cannot build ResidualActor: its constructor must take "
                              "(observation_space, action_space, **kwargs)")
    assert "(given actor_kwargs ['depth']); TypeError: " in message
    assert "unexpected keyword argument 'depth'" in message
    with pytest.raises(ConfigError, match=r"cannot build NoSpaces: .*TypeError: .*argument"):
        build(f"{bad_file}:NoSpaces")


def test_load_errors_carry_the_role() -> None:
    with pytest.raises(ConfigError, match=r"^critic: network spec 'nocolon' must be"):
        build_network("nocolon", OBS_SPACE, ACT_SPACE, None, role="critic")


def test_wrong_kinds_of_objects_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^actor: int is not a torch\.nn\.Module subclass"):
        build_network(int, OBS_SPACE, ACT_SPACE, None, role="actor")
    with pytest.raises(ConfigError, match=r"^critic must be a .* got float$"):
        build_network(1.5, OBS_SPACE, ACT_SPACE, None, role="critic")  # type: ignore[arg-type]


def test_a_module_spec_is_found_from_the_current_folder_without_it_on_the_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As under the rl-graphstep-train console script, which does not put the current
    folder on sys.path the way python -m does."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(ROOT))])
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)
    cls = load_class("examples.residual_actor:ResidualActor")
    assert cls.__name__ == "ResidualActor"
    assert sys.path[-1] == str(ROOT)
