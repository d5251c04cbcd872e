"""Helpers for the policy tests: write a folder of policy files in a few lines."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.errors import PolicyError
from proxy.policy.compile import load_policy_dir
from proxy.policy.compiled import PolicySet

Write = Callable[..., Path]


def write_files(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip("\n"))
    return folder


@pytest.fixture
def policies(tmp_path: Path) -> Callable[..., PolicySet]:
    """`policies({"a.yaml": "..."})` -> the loaded PolicySet of a fresh folder."""

    def load(files: dict[str, str]) -> PolicySet:
        return load_policy_dir(write_files(tmp_path / "policies", files))

    return load


@pytest.fixture
def problems(tmp_path: Path) -> Callable[..., list[str]]:
    """`problems({"a.yaml": "..."})` -> the problems a person sees (the load must fail)."""

    def load(files: dict[str, str]) -> list[str]:
        folder = write_files(tmp_path / "policies", files)
        with pytest.raises(PolicyError) as info:
            load_policy_dir(folder)
        return [p.replace(str(folder), "policies") for p in info.value.problems]

    return load
