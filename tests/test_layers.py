"""The package's folders are layers whose imports point one way, from the commands down to the
core. Every import counts: module-level, type-only (``if TYPE_CHECKING``), inside functions,
and module paths named in strings (a lazy registry's ``"rl_graphstep.x:Name"``)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rl_graphstep"

# Bottom to top; a module may import its own layer and those below it, never one above.
# The commands (train, evaluate, sweep) and the package's lazy front (``__init__``) are the top;
# a sweep's trials (sweeps/) are train() calls.
LAYERS = ["core", "graphstep", "envs", "settings", "data", "networks", "algorithms", "learners",
          "run", "train", "evaluate", "sweeps", "sweep", "__init__"]
# A module path in a string, alone or as "module:Name".
_MODULE_STRING = re.compile(r"rl_graphstep(?:\.\w+)+(?::\w+)?")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The package module that ``name`` (a module, or a module's attribute) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(tree: ast.AST, module: str, *, top_level_only: bool = False
             ) -> Iterator[tuple[str, int]]:
    """(imported package module, line) for every import in ``tree``."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    nodes = _top_level(tree) if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
        elif (not top_level_only and isinstance(node, ast.Constant)
              and isinstance(node.value, str) and _MODULE_STRING.fullmatch(node.value)
              and node.value.partition(":")[0] in MODULES):
            names = [node.value.partition(":")[0]]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.startswith("rl_graphstep") else None
            if target is not None and target != module:
                yield target, node.lineno


def _top_level(tree: ast.AST) -> Iterator[ast.AST]:
    """The module's statements outside functions and classes' methods, ``if`` blocks included."""
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _layer(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


TREES = {module: ast.parse(path.read_text(), str(path)) for module, path in MODULES.items()}


def test_every_module_is_in_a_known_layer() -> None:
    assert {_layer(m) for m in MODULES} <= set(LAYERS), \
        f"add the new folder to LAYERS: {sorted({_layer(m) for m in MODULES} - set(LAYERS))}"


def test_imports_point_down_the_layers() -> None:
    upward = [f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target} "
              f"({_layer(module)} -> {_layer(target)})"
              for module, tree in TREES.items() for target, line in _imports(tree, module)
              if LAYERS.index(_layer(target)) > LAYERS.index(_layer(module))]
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path of nodes, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("layer", [name for name in LAYERS if (PACKAGE / name).is_dir()])
def test_no_import_cycle_inside_a_folder(layer: str) -> None:
    graph = {module: {target for target, _ in _imports(tree, module, top_level_only=True)
                      if _layer(target) == layer}
             for module, tree in TREES.items() if _layer(module) == layer}
    assert _cycle(graph) is None, f"module-level import cycle: {' -> '.join(_cycle(graph))}"


def test_the_checker_sees_every_kind_of_import() -> None:
    source = ("from rl_graphstep.run import setup\n"
              "from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from rl_graphstep.settings.config import Config\n"
              "def f():\n    import rl_graphstep.sweeps.start\n"
              "    from ..data.buffer import ReplayBuffer\n"
              "CLASSES = {'sac': 'rl_graphstep.algorithms.sac:SAC'}\n")
    found = dict(_imports(ast.parse(source), "rl_graphstep.learners.offpolicy"))
    assert set(found) == {"rl_graphstep.run.setup", "rl_graphstep.settings.config",
                          "rl_graphstep.sweeps.start", "rl_graphstep.data.buffer",
                          "rl_graphstep.algorithms.sac"}
    top = dict(_imports(ast.parse(source), "rl_graphstep.learners.offpolicy",
                        top_level_only=True))
    assert set(top) == {"rl_graphstep.run.setup", "rl_graphstep.settings.config"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
