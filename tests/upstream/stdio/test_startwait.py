"""How long the proxy waits for a stdio child's first answer (proxy/upstream/stdio/startwait.py), and the
start-up probe's bound made of those waits.

Real children under the proxy's guard, over real pipes:
- a child that spends its start busy on a CPU (standing for a server starting on a busy host: a
  Node SDK server took 8-17 s at a load of ~10 here) is waited for past the start timeout and
  served; one busy for ever is stopped at the stretch, and says so;
- a child that sits idle past the timeout (asleep: a server that will not answer) is reported at
  the timeout, as idle, naming the setting;
- a server silent to `server/discover` whose fresh child answers `initialize` within its own start
  timeout is served legacy-only: the probe's bound is the sum of its steps (it was the default 15 s,
  or the start timeout + 5 s, shorter than the two starts inside it);
- a probe that fails says what each step met (and one cut by the service's bound names its step:
  tests/upstream/stdio/test_health.py).
Outcomes only: no duration is asserted (a busy start is busy for as long as the machine makes it).
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from pathlib import Path

import pytest

from proxy.core.service import Service
from proxy.errors import UpstreamFailure
from proxy.settings import Settings
from proxy.upstream.stdio import STRETCH, StdioUpstream
from tests.proxy_process import pid_alive

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(120)]

# Writes its pid to argv[2], then spends argv[1] seconds busy on a CPU, then answers every request.
BUSY_THEN_SERVE = textwrap.dedent(
    """
    import json, os, sys, time
    with open(sys.argv[2], "w") as f:
        f.write(str(os.getpid()))
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        pass
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" in msg and "method" in msg:
            print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}}), flush=True)
    """
)

# Sleeps argv[1] seconds (idle), then answers `initialize` only: silent to anything else.
SLEEP_THEN_INITIALIZE = textwrap.dedent(
    """
    import json, sys, time
    time.sleep(float(sys.argv[1]))
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("method") == "initialize":
            print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}}), flush=True)
    """
)

SETTINGS = Settings(listen="http://127.0.0.1:1/mcp", upstream_command="x")


async def test_a_child_busy_starting_past_the_start_timeout_is_waited_for_and_served(tmp_path: Path) -> None:
    # Busy 2.5 s, past the timeout of 1.5 s (before, the probe gave up then, twice, and failed),
    # well within its stretch (9 s) for the interpreter's own start on a busy machine.
    command = [sys.executable, "-c", BUSY_THEN_SERVE, "2.5", str(tmp_path / "pid")]
    upstream = StdioUpstream(command, spares=0, handshake_timeout_s=1.5)
    try:
        caps = await upstream.probe()
        assert caps.legacy
        assert upstream.health.up is True
    finally:
        await upstream.aclose()


async def test_a_child_idle_past_the_start_timeout_is_reported_as_idle_naming_the_setting() -> None:
    upstream = StdioUpstream([sys.executable, "-c", SLEEP_THEN_INITIALIZE, "60"], spares=0, handshake_timeout_s=1)
    try:
        with pytest.raises(UpstreamFailure) as failed:
            await upstream.check()
        detail = failed.value.detail
        assert "did not answer initialize" in detail, detail
        assert "no answer within 1 s of its start (--stdio-start-timeout-s)" in detail, detail
        assert "idle, not starting" in detail, detail
    finally:
        await upstream.aclose()


async def test_a_child_busy_for_ever_is_stopped_at_the_stretch_and_says_so(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = [sys.executable, "-c", BUSY_THEN_SERVE, "600", str(pid_file)]
    upstream = StdioUpstream(command, spares=0, handshake_timeout_s=0.5)
    try:
        with pytest.raises(UpstreamFailure) as failed:
            await upstream.check()
        detail = failed.value.detail
        assert f"no answer within {STRETCH * 0.5:g} s of its start though busy starting all along" in detail, detail
        assert "--stdio-start-timeout-s 0.5" in detail, detail
        pid = int(pid_file.read_text())
        bound_at = time.monotonic() + 30
        while pid_alive(pid):  # (a zombie whose guard was killed first is re-parented to init)
            assert time.monotonic() < bound_at, f"the busy child {pid} still runs"
            await asyncio.sleep(0.05)
    finally:
        await upstream.aclose()


async def test_a_server_silent_to_discover_is_served_legacy_only_within_the_probes_bound() -> None:
    # Each child sleeps 6 s before it reads. The first is silent to `discover` (idle: reported at
    # 10 s), a fresh one answers `initialize` 6 s after its start: at least 16 s in all, past the old
    # bound of 15 s, within each step's own.
    command = [sys.executable, "-c", SLEEP_THEN_INITIALIZE, "6"]
    upstream = StdioUpstream(command, spares=0, handshake_timeout_s=10)
    service = Service(SETTINGS, upstream)
    try:
        caps = await service.ensure_probed(raise_on_failure=False)
        assert service.probe_error is None, service.probe_error
        assert caps is not None and caps.legacy and not caps.modern
    finally:
        await service.aclose()


def test_the_probes_bound_covers_its_steps() -> None:
    for timeout_s in (1.0, 10.0, 60.0):
        for shared in (False, True):
            upstream = StdioUpstream(["x"], handshake_timeout_s=timeout_s, shared_sessions=shared)
            starts = 3 if shared else 2  # discover, initialize on a fresh child, the shared children
            service = Service(SETTINGS, upstream)
            assert service._probe_timeout_s >= (starts + 1) * STRETCH * timeout_s  # and the second discover


async def test_a_probe_that_fails_says_what_each_step_met() -> None:
    silent = [sys.executable, "-c", "import sys\nfor _ in sys.stdin: pass"]
    upstream = StdioUpstream(silent, spares=0, handshake_timeout_s=1)
    try:
        with pytest.raises(UpstreamFailure) as failed:
            await upstream.probe()
        detail = failed.value.detail
        discover, _, initialize = detail.partition("; then ")
        assert discover.startswith("server/discover: ") and "idle" in discover, detail
        assert "did not answer initialize" in initialize and "idle" in initialize, detail
        assert upstream.probe_step is None
    finally:
        await upstream.aclose()


# Answers its first request at once; busy on a CPU for argv[1] seconds before each later one;
# `server/discover` lists the 2026 revision.
SERVE_THEN_BUSY = textwrap.dedent(
    """
    import json, sys, time
    first = True
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:
            continue
        if not first:
            end = time.monotonic() + float(sys.argv[1])
            while time.monotonic() < end:
                pass
        first = False
        result = {"supportedVersions": ["2026-07-28"]} if msg["method"] == "server/discover" else {}
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
    """
)


async def test_the_probes_second_discover_gets_a_starts_allowance_on_a_busy_host() -> None:
    # The child answers its readiness `discover`, then is busy 2.5 s before the probe's own one:
    # past the start timeout of 1.5 s, within its stretch. It was waited for the bare timeout and
    # served legacy-only, as if it did not speak 2026.
    command = [sys.executable, "-c", SERVE_THEN_BUSY, "2.5"]
    upstream = StdioUpstream(command, spares=0, handshake_timeout_s=1.5)
    try:
        caps = await upstream.probe()
        assert caps.modern, caps
    finally:
        await upstream.aclose()
