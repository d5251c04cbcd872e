"""Fixtures and reporting for the MCP conformance tests (see conformance_harness.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conformance_harness import (
    ConformanceTools,
    everything_server_http,
    everything_stdio_argv,
    find_tools,
    proxy_server,
    skip_or_fail,
)

TARGETS = (
    "direct",
    "proxy-stdio-upstream",
    "proxy-http-upstream",
    "proxy-bridge-2025-only-upstream",
    "proxy-bridge-2026-only-upstream",
)


@pytest.fixture(scope="session")
def conformance_tools() -> ConformanceTools:
    found = find_tools()
    if isinstance(found, str):
        skip_or_fail(found)
    assert isinstance(found, ConformanceTools)
    return found


@pytest.fixture(scope="module", params=TARGETS)
def conformance_target(
    request: pytest.FixtureRequest,
    conformance_tools: ConformanceTools,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str]]:
    """(target name, MCP URL the suite tests). Module scope: one server/proxy per target."""
    target: str = request.param
    log_dir = tmp_path_factory.mktemp(f"conformance-{target}-processes")
    with contextlib.ExitStack() as stack:
        if target == "direct":
            url = stack.enter_context(everything_server_http(conformance_tools, log_dir))
        elif target == "proxy-http-upstream":
            upstream = stack.enter_context(everything_server_http(conformance_tools, log_dir))
            url = stack.enter_context(proxy_server(["--upstream", upstream], log_dir, target))
        elif target == "proxy-stdio-upstream":
            upstream_cmd = everything_stdio_argv(conformance_tools)
            url = stack.enter_context(proxy_server(["--", *upstream_cmd], log_dir, target))
        elif target == "proxy-bridge-2025-only-upstream":
            # the same server restricted to the 2025 revisions: 2026 goes through the era bridge
            upstream_cmd = everything_stdio_argv(conformance_tools, only_2025=True)
            url = stack.enter_context(proxy_server(["--", *upstream_cmd], log_dir, target))
        elif target == "proxy-bridge-2026-only-upstream":
            # the same server restricted to 2026-07-28: 2025 sessions go through the era bridge
            upstream_cmd = everything_stdio_argv(conformance_tools, only_2026=True)
            url = stack.enter_context(proxy_server(["--", *upstream_cmd], log_dir, target))
        else:  # pragma: no cover
            raise AssertionError(target)
        yield target, url


# One line per (target, leg) in the terminal summary, shown whatever -s/-q say.
_SCORES_KEY = pytest.StashKey[list[str]]()


@pytest.fixture
def record_score(request: pytest.FixtureRequest):
    """Call with a one-line score; it is printed in the terminal summary."""
    scores = request.config.stash.setdefault(_SCORES_KEY, [])
    return scores.append


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    scores = config.stash.get(_SCORES_KEY, [])
    if not scores:
        return
    terminalreporter.section("MCP conformance scores")
    for line in scores:
        terminalreporter.write_line(line)
    results_dir = os.environ.get("MCP_CONFORMANCE_RESULTS_DIR")
    if results_dir:
        Path(results_dir).mkdir(parents=True, exist_ok=True)
        (Path(results_dir) / "scores.txt").write_text("\n".join(scores) + "\n")
