"""Where the test run's CPU goes: per test, the CPU of the process running it and of what it reaped.

Turned on by ``--cpu-report`` or ``MCP_TEST_CPU_REPORT=1`` (tests/conftest.py registers it). For each
test it takes ``getrusage(RUSAGE_SELF)`` and ``getrusage(RUSAGE_CHILDREN)`` (user + system seconds)
when its setup starts and again when its teardown ends, and records the difference on the test's
teardown report (``user_properties``, key ``cpu_s``). A child's CPU counts once the worker has
waited for it, and a process counts its own reaped children in turn: a proxy that reaps its stdio
servers brings theirs along; the fixture servers forked by this process's fork server
(tests/fixtures/forkserver.py) count through it, once it has reaped them. A module- or
session-scoped fixture is charged to the test whose setup starts it and to the one whose teardown
stops it.

Under pytest-xdist each worker measures its own tests and the reports carry the figure to the
controller, which adds them up; without xdist the same hook runs in the one process. At the end the
terminal summary lists the 25 tests and the 15 modules that spent the most CPU, and the total. It
asserts nothing: it reports.
"""

from __future__ import annotations

import os
import resource
import time
from collections import defaultdict

import pytest

from tests.fixtures import forkserver

PROPERTY = "cpu_s"
ENV = "MCP_TEST_CPU_REPORT"
TOP_TESTS = 25
TOP_MODULES = 15


def wanted(config: pytest.Config) -> bool:
    """True where the option or the environment variable asks for the report."""
    if config.getoption("cpu_report", default=False):
        return True
    return os.environ.get(ENV, "") not in ("", "0", "false", "no")


def cpu_seconds() -> float:
    """User + system CPU of this process and of every child it has waited for, so far, and of its
    fork server (tests/fixtures/forkserver.py), whose forks are the fixture servers it started."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + forkserver.cpu_seconds()


class CpuReport:
    """The plugin: measures where tests run, adds up where reports arrive (both, without xdist)."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}
        self.per_test: dict[str, float] = {}
        self._wall_start = time.monotonic()

    # --- measuring (the process that runs the test) ----------------------------------------------
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> object:
        self._started[item.nodeid] = cpu_seconds()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> object:
        # The report copies the item's user_properties when it is made: add the figure before.
        if call.when == "teardown":
            started = self._started.pop(item.nodeid, None)
            if started is not None:
                item.user_properties.append((PROPERTY, round(cpu_seconds() - started, 4)))
        yield

    # --- adding up (the controller under xdist; the one process without) --------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for key, value in report.user_properties:
            if key == PROPERTY:
                self.per_test[report.nodeid] = self.per_test.get(report.nodeid, 0.0) + float(value)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.per_test:  # nothing ran (collection only, or every test deselected)
            return
        for line in self.summary_lines():
            terminalreporter.write_line(line)

    def summary_lines(self) -> list[str]:
        wall = time.monotonic() - self._wall_start
        total = sum(self.per_test.values())
        lines = [
            "",
            f"==== CPU by test (process + reaped children, setup to teardown): {len(self.per_test)} tests, "
            f"{total:.1f} s CPU in {wall:.0f} s wall ====",
        ]
        if not self.per_test:
            return lines
        by_module: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for nodeid, seconds in self.per_test.items():
            module = nodeid.split("::", 1)[0]
            by_module[module] += seconds
            count[module] += 1
        lines.append(f"top {TOP_TESTS} tests:")
        for nodeid, seconds in sorted(self.per_test.items(), key=lambda kv: -kv[1])[:TOP_TESTS]:
            lines.append(f"  {seconds:8.2f} s  {nodeid[:160]}")
        lines.append(f"top {TOP_MODULES} modules:")
        for module, seconds in sorted(by_module.items(), key=lambda kv: -kv[1])[:TOP_MODULES]:
            share = 100.0 * seconds / total if total > 0 else 0.0
            lines.append(f"  {seconds:8.1f} s  {share:5.1f}%  {count[module]:4d} tests  {module}")
        lines.append(f"total: {total:.1f} s CPU over {len(self.per_test)} tests")
        return lines


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        action="store_true",
        default=False,
        help=f"print the CPU each test spent (process + reaped children), top tests and modules ({ENV}=1 too)",
    )


def register(config: pytest.Config) -> None:
    """Registers the plugin where it is wanted (every xdist worker reads the same option/environment)."""
    if wanted(config) and not config.pluginmanager.has_plugin("cpu_report"):
        config.pluginmanager.register(CpuReport(), "cpu_report")
