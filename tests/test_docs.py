"""The README and the pages under docs/ and benchmarks/ hold: docs/flags.md is what
docs/make_flags.py writes from today's parser, every relative link and anchor leads somewhere,
and every command they give names a script or module that exists and flags it knows."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "gpu.md",
         ROOT / "examples" / "README.md"]
COMMANDS = ("train", "evaluate", "sweep")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _load_make_flags():
    spec = importlib.util.spec_from_file_location("make_flags", ROOT / "docs" / "make_flags.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flag_reference_is_current() -> None:
    page = (ROOT / "docs" / "flags.md").read_text()
    assert page == _load_make_flags().page(), "run python docs/make_flags.py"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_somewhere(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        missing_anchor = bool(anchor) and file.suffix == ".md" and file.exists() \
            and anchor not in _anchors(file)
        if not file.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


@cache
def _options(command: str) -> frozenset[str]:
    """Every --flag that `python -m rl_graphstep.<command> --help` shows."""
    out = subprocess.run([sys.executable, "-m", f"rl_graphstep.{command}", "--help"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    return frozenset(re.findall(r"--[a-z0-9][a-z0-9-]*", out.stdout))


def _shell_commands(page: Path) -> list[list[str]]:
    """The commands of the page's bash blocks, continuation lines joined, split at && and
    ;, comments dropped, each as its words."""
    commands, block, in_bash = [], [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            if in_bash:
                commands += _split(" ".join(block))
            in_bash, block = line.strip() == "```bash", []
        elif in_bash:
            block.append(line.rstrip("\\") if line.endswith("\\") else line + "\n")
    return commands


def _split(text: str) -> list[list[str]]:
    words = []
    for line in text.split("\n"):
        lexer = shlex.shlex(line, posix=True, punctuation_chars="&;|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words.append(list(lexer))
    commands: list[list[str]] = []
    for line_words in words:
        current: list[str] = []
        for word in line_words:
            if set(word) <= set("&;|"):
                commands.append(current)
                current = []
            else:
                current.append(word)
        commands.append(current)
    return [c for c in commands if c]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_name_what_exists(page: Path) -> None:
    problems = []
    for words in _shell_commands(page):
        if words[:2] == ["python", "-m"] and words[2].startswith("rl_graphstep."):
            command = words[2].split(".", 1)[1]
            assert command in COMMANDS, words
            problems += [f"{command} has no {w}" for w in words[3:]
                         if w.startswith("--") and w.split("=")[0] not in _options(command)]
        elif (words[:1] == ["python"] and words[1].endswith(".py")
              and not (ROOT / words[1]).exists()):
            problems.append(f"no script {words[1]}")
        # Repository files a command names (a network's file:Class included); made-up names
        # of the user's own files are left alone.
        paths = [word.split(":")[0] for word in words]
        problems += [f"no file {path}" for path in paths
                     if re.fullmatch(r"[\w./-]+\.(py|yaml)", path) and "/" in path
                     and not path.startswith(("my_", "nets/", "path/"))
                     and not (ROOT / path).exists()]
    assert not problems, f"{page.name}: {problems}"
