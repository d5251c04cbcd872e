"""`serve --listen stdio` starts its upstream before the proxy's imports (`proxy.upstream.stdio.early`) and the
single-session `StdioUpstream` adopts that very process: pipes, stderr logging, exit, respawn and
shutdown work as for a child it spawned itself. Real processes over real pipes, on both loops."""

from __future__ import annotations

import logging
import os
import signal
import sys

import pytest

from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream, early
from tests.upstream.stdio.test_link import CHILD, _call

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

COMMAND = [sys.executable, "-c", CHILD]


@pytest.fixture(params=[pytest.param(False, id="asyncio"), pytest.param(True, id="uvloop")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return "asyncio", {"use_uvloop": request.param}


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for name in list(os.environ):
        if name.startswith("MCP_RECOVERY_"):
            monkeypatch.delenv(name)
    yield
    early.discard()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["serve", "--listen", "stdio", "--", "srv", "-x"], {}, ["srv", "-x"]),
        (["serve", "--log-level", "debug", "--listen=stdio", "--", "srv"], {}, ["srv"]),
        (
            ["serve", "--"],
            {"MCP_RECOVERY_LISTEN": "stdio", "MCP_RECOVERY_UPSTREAM_COMMAND": "srv 'a b'"},
            ["srv", "a b"],
        ),
        (["serve", "--listen", "http://127.0.0.1:1/mcp", "--", "srv"], {}, None),
        (["serve", "--listen", "stdio", "--listen", "http://127.0.0.1:1/mcp", "--", "srv"], {}, None),
        (["serve", "--lis", "stdio", "--", "srv"], {}, None),  # an abbreviation: the normal path
        (["serve", "--listen", "stdio", "--help", "--", "srv"], {}, None),
        (["serve", "--listen", "stdio", "--upstream", "http://127.0.0.1:1/mcp", "--", "srv"], {}, None),
        (["serve", "--listen", "stdio"], {"MCP_RECOVERY_UPSTREAM_COMMAND": "srv 'unclosed"}, None),
        (["serve", "--listen", "stdio"], {}, None),
        (["demo", "--listen", "stdio", "--", "srv"], {}, None),
        (["policies", "check", "--listen", "stdio", "--", "srv"], {}, None),
    ],
)
def test_only_a_plain_stdio_serve_starts_early(
    argv: list[str], env: dict[str, str], expected: list[str] | None
) -> None:
    assert early.command_from_argv(argv, env) == expected


async def test_the_upstream_adopts_the_early_child(caplog: pytest.LogCaptureFixture) -> None:
    early.start(["serve", "--listen", "stdio", "--", *COMMAND])
    assert early._early is not None
    first_pid = early._early.popen.pid
    upstream = StdioUpstream(COMMAND, single_session=True)
    upstream.prestart()
    link = await upstream.open(Era.LEGACY)
    try:
        assert (await _call(link, "echo"))["result"] == {"method": "echo"}
        assert link._child is not None and link._child.pid == first_pid  # the early process, not a new one
        assert upstream._spawned == 1 and upstream.health.up
        with caplog.at_level(logging.INFO, logger="proxy.upstream.stderr"):
            assert (await _call(link, "noisy"))["result"] == {"method": "noisy"}
            assert (await _call(link, "spew"))["result"] == {"method": "spew"}
        logged = [r for r in caplog.records if r.name == "proxy.upstream.stderr"]
        assert any("a line on stderr" in r.getMessage() for r in logged)
        assert len(logged) < 200  # the per-child log budget holds for the adopted child too
        os.killpg(first_pid, signal.SIGKILL)  # a crash: noticed through the pidfd and the pipes' end
        await link._child.exited.wait()
        assert upstream.health.restarts == 1
        assert (await _call(link, "again"))["result"] == {"method": "again"}
        assert link._child.pid != first_pid  # the respawn went the normal way
    finally:
        await link.aclose()
        await upstream.aclose()
    assert _gone(first_pid)


async def test_closing_the_upstream_ends_the_adopted_child() -> None:
    early.start(["serve", "--listen", "stdio", "--", *COMMAND])
    assert early._early is not None
    popen = early._early.popen
    upstream = StdioUpstream(COMMAND, single_session=True)
    upstream.prestart()
    link = await upstream.open(Era.MODERN)
    assert (await _call(link, "echo"))["result"] == {"method": "echo"}
    await upstream.aclose()
    assert popen.returncode is not None  # reaped by the adopted transport's exit watch
    assert _gone(popen.pid)


async def test_a_different_command_ends_the_early_child() -> None:
    early.start(["serve", "--listen", "stdio", "--", *COMMAND, "extra"])
    assert early._early is not None
    popen = early._early.popen
    upstream = StdioUpstream(COMMAND, single_session=True)
    upstream.prestart()
    link = await upstream.open(Era.LEGACY)
    try:
        assert (await _call(link, "echo"))["result"] == {"method": "echo"}
        assert link._child is not None and link._child.pid != popen.pid
        assert popen.returncode is not None
    finally:
        await upstream.aclose()


def test_killing_an_early_child_escalates_to_sigkill_when_its_group_ignores_sigterm() -> None:
    """A group whose leader traps SIGTERM (a guard that cannot act, with a command that ignores
    SIGTERM) is killed after the grace period, as a spawned child's group is (`_Child.terminate`);
    before, `kill` sent SIGTERM only, waited 5 s and returned with the group still running."""
    import subprocess

    script = "trap '' TERM; echo ready >&2; while :; do sleep 0.1; done"
    popen = subprocess.Popen(
        ["sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert popen.stderr is not None
    assert popen.stderr.readline() == b"ready\n"  # the trap is set
    child = early.EarlyChild(["sh"], popen, os.pidfd_open(popen.pid))
    try:
        child.kill()
        assert popen.poll() == -signal.SIGKILL
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(5)
