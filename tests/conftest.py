"""Shared pytest configuration: async tests run on asyncio (via anyio's pytest plugin)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests import cpu_report


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _no_log_handler_left_on_a_closed_stream() -> Iterator[None]:
    """A test that runs the command in-process (`proxy.cli.main(["serve", ...])`) has the proxy's
    `configure()` put a handler on the root logger writing to that test's stderr, which pytest
    captures and closes after it: every later log line of that worker then failed with "--- Logging
    error --- ValueError: I/O operation on closed file". Such a handler (the proxy's formatter on a
    stream) is taken off the root after each test."""
    yield
    from proxy.telemetry.logsetup import SecretScrubbingFormatter

    root = logging.getLogger()
    for handler in root.handlers[:]:
        if isinstance(handler, logging.StreamHandler) and isinstance(handler.formatter, SecretScrubbingFormatter):
            root.removeHandler(handler)


def _compile_bytecode(config: pytest.Config) -> None:
    """Writes the bytecode (`__pycache__`) of the proxy and of the test fixtures that run as servers,
    where it is missing or stale, before any test starts them. An interpreter whose environment has
    PYTHONDONTWRITEBYTECODE set never writes it and compiles every module it imports from source,
    in every process: the slow tier starts the proxy a few hundred times, and a module the pytest
    process itself never imports (the HTTP frontend, the admin app) had no cached bytecode at all.
    Such an interpreter still reads bytecode that exists, and checks it against the source's mtime
    and size, so this changes nothing but the CPU spent. Once per run (the controller under xdist);
    a few tens of milliseconds when everything is up to date."""
    import compileall
    from pathlib import Path

    if hasattr(config, "workerinput"):
        return
    root = Path(__file__).resolve().parents[1]
    for directory in (root / "proxy", root / "tests" / "fixtures"):
        compileall.compile_dir(directory, quiet=2)


def pytest_sessionstart(session: pytest.Session) -> None:
    """In CI (MCP_PROMETHEUS_REQUIRED=1, MCP_REDIS_REQUIRED=1) a missing promtool/prometheus or
    redis-server is an error, not a skip."""
    import os
    import shutil

    _compile_bytecode(session.config)

    if os.environ.get("MCP_REDIS_REQUIRED", "") not in ("", "0", "false", "no") and not shutil.which("redis-server"):
        raise pytest.UsageError("MCP_REDIS_REQUIRED is set but redis-server is not installed (scripts/setup-redis.sh)")

    if os.environ.get("MCP_PROMETHEUS_REQUIRED", "") in ("", "0", "false", "no"):
        return
    missing = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
    if missing:
        raise pytest.UsageError(f"MCP_PROMETHEUS_REQUIRED is set but {', '.join(missing)} is not installed")


# --- tiers -----------------------------------------------------------------------------------
# `pytest` alone runs the fast tier: tests that start no process (pyproject.toml's addopts
# deselect the `slow` marker). `.ci/run` runs every tier (`-m ""`). A test outside the slow tier
# that starts a process (a subprocess, asyncio's, a fork) fails at once with the reason, so the
# fast tier stays fast: mark its module `pytest.mark.slow`.
_FAST_TIER_TEST: list[str] = []  # the nodeid of the unmarked test running now (empty: none)


class StartedAProcess(RuntimeError):
    """Raised where an unmarked (fast-tier) test starts a process."""


def _guard_process_starts() -> None:
    import os
    import subprocess

    def refuse(what: str) -> None:
        if _FAST_TIER_TEST:
            raise StartedAProcess(
                f"{_FAST_TIER_TEST[0]} started a process ({what}) but is not marked slow: "
                "add pytest.mark.slow to its module's pytestmark"
            )

    original_execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def execute_child(self: subprocess.Popen[bytes], args: object, *rest: object, **kw: object) -> object:
        refuse(f"subprocess {str(args)[:80]}")
        return original_execute_child(self, args, *rest, **kw)

    subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
    for name in ("fork", "posix_spawn", "posix_spawnp"):
        original = getattr(os, name, None)
        if original is None:
            continue

        def guarded(*args: object, _original: object = original, _name: str = name, **kw: object) -> object:
            refuse(f"os.{_name}")
            return _original(*args, **kw)  # type: ignore[operator]

        setattr(os, name, guarded)


def _node_compile_cache() -> None:
    """Node 22 (the conformance suite, the Inspector CLI, mcp-remote) keeps the V8 code it compiled
    for a module in the directory NODE_COMPILE_CACHE names and reuses it when it loads the same
    module again: the slow tier starts those programs a few hundred times, each compiling the same
    bundles (about a quarter of an Inspector run's CPU). It changes no behaviour: Node validates
    every entry against the module's source, writes entries by rename (processes may share the
    directory), runs as before when the cache is missing, and Node 20 ignores the variable. A value
    set by the caller is kept."""
    import os
    from pathlib import Path

    cache = Path(__file__).resolve().parents[1] / ".cache" / "node-compile-cache"
    os.environ.setdefault("NODE_COMPILE_CACHE", str(cache))


def pytest_addoption(parser: pytest.Parser) -> None:
    cpu_report.pytest_addoption(parser)


def pytest_configure(config: pytest.Config) -> None:
    _guard_process_starts()
    _node_compile_cache()
    cpu_report.register(config)  # --cpu-report / MCP_TEST_CPU_REPORT=1: where the CPU goes, per test


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadgroup` (as `.ci/run` runs the slow tier): tests/scheduling.py's scheduler, which
    keeps the tests of a module that shares a module-scoped fixture on one worker."""
    if config.getoption("dist") != "loadgroup":
        return None
    from tests.scheduling import ModuleFixtureScheduling

    return ModuleFixtureScheduling(config, log)  # type: ignore[arg-type]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    fast = item.get_closest_marker("slow") is None
    if fast:
        _FAST_TIER_TEST.append(item.nodeid)
    try:
        yield
    finally:
        if fast:
            _FAST_TIER_TEST.clear()
