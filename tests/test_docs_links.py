"""The repository's docs stand alone: every relative link and every repository file named in
README.md and docs/*.md exists, and none points outside the repository (a sibling folder, a
contract file or an issue number a reader of the repository does not have). Fast: files only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures.helpers import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# [text](target) links; the target up to a space, `)` or `#`
LINK = re.compile(r"\[[^\]]*\]\(([^)\s#]*)(?:#[^)\s]*)?\)")
# `path` spans naming a file or folder of the repository by its top-level folder, or a root file
TOP = ("docs", "proxy", "tests", "scripts", "policies", "bench", "deploy", ".ci")
ROOT_FILES = ("README.md", "Dockerfile", "docker-compose.yml", "pyproject.toml")
NAMED = re.compile(
    r"`((?:"
    + "|".join(re.escape(t) for t in TOP)
    + r")/[A-Za-z0-9_./*-]*|"
    + "|".join(re.escape(f) for f in ROOT_FILES)
    + r")`"
)
OUTSIDE = re.compile(r"\.\./shared|RECOVERY\.md|\b[Ii]ssues? #?\d+\b")


def _existing(path: Path) -> bool:
    text = str(path)
    if any(c in text for c in "*?["):
        return any(path.parent.glob(path.name)) if path.parent.exists() else False
    return path.exists()


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO_ROOT)) for d in DOCS])
def test_every_relative_link_and_named_repository_file_exists(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    missing = []
    for target in LINK.findall(text):
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):  # an anchor, or a URL
            continue
        if not _existing((doc.parent / target).resolve()):
            missing.append(f"link {target}")
    for name in NAMED.findall(text):
        name = name.split("::", 1)[0].rstrip(".")
        if not _existing(REPO_ROOT / name):
            missing.append(f"file `{name}`")
    assert not missing, f"{doc.relative_to(REPO_ROOT)} names what the repository does not have: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO_ROOT)) for d in DOCS])
def test_no_reference_outside_the_repository(doc: Path) -> None:
    found = [
        f"line {n}: {m.group(0)}"
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        for m in OUTSIDE.finditer(line)
    ]
    assert not found, f"{doc.relative_to(REPO_ROOT)} cites what a reader of the repository cannot open: {found}"


def _code_files() -> list[Path]:
    """The repository's code, tests and scripts, this file excepted (it holds the pattern)."""
    here = Path(__file__).resolve()
    files: list[Path] = []
    for folder in ("proxy", "tests", "bench", "scripts"):
        for path in sorted((REPO_ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".mjs", ".json", ".sh") and path.resolve() != here and ".cache" not in path.parts:
                files.append(path)
    return files


def test_no_code_cites_what_a_reader_of_the_repository_cannot_open() -> None:
    """Docstrings, comments and printed texts say the target or the reason themselves instead of
    pointing at a tracker's issue numbers or a contract file outside the repository."""
    found = [
        f"{path.relative_to(REPO_ROOT)}:{n}: {m.group(0)}"
        for path in _code_files()
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        for m in OUTSIDE.finditer(line)
    ]
    assert len(_code_files()) > 100  # the walk sees the tree
    assert not found, f"references outside the repository: {found}"
