"""The TypeScript SDK v2 client (@modelcontextprotocol/client 2.4.0) in front of the proxy, as a
real user of the current TS SDK runs it (docs/interop.md, "TypeScript SDK v2 client").

tests/interop/ts2_client.mjs is driven over JSON lines, in each negotiation mode v2 offers
(`versionNegotiation`: `auto` probes with server/discover and falls back to initialize, `pin`
is exactly 2026-07-28 with no fallback, `legacy` the plain 2025 handshake), over each path:

- `http>stdio`: Streamable HTTP to the proxy, the scripted server (tests/fixtures) as its stdio
  child (the usual sidecar); `http>stdio pool`: the same with `--stdio-modern-children 2`, where
  2026 requests spread over two children (the cancellation step keeps a call in flight on one
  and calls until a second serves, then aborts: the cancellation reaches the child that runs it);
  `http>http`: the scripted server over Streamable HTTP behind it;
- `stdio>stdio` and `stdio>http`: the client spawns `python -m proxy serve --listen stdio` itself
  with its StdioClientTransport.

The scripted server speaks both eras. What each session checks, as a user would see it:
connect (the era the mode implies), listTools, a success, a transient failure the proxy recovers
within the call (its attempts in `_meta`), one it cannot (an `isError` result with the
unresolved report in `_meta["io.mcp-recovery-proxy/unresolved"]`, never a thrown error),
progress notifications, resources and prompts, logging (2025: `logging/setLevel`; 2026: the
per-request log level in `_meta`), and cancellation by AbortSignal (the scripted server journals
the attempt `cancelled`). v2 validates structuredContent against a tool's outputSchema and throws
on a mismatch: the shape server's failing tools with output schemas must come back as results.
A 2025-only upstream (npm server-everything 2026.8.31): a 2026 client (auto or pinned) is served
through the proxy's era bridge; with `--era-bridge off` a pinned client gets v2's typed
ERA_NEGOTIATION_FAILED at connect (no hang) and `auto` ends up on the 2025 handshake.
2026-only features the proxy relays: subscriptions/listen (opened, acknowledged, closed) and
elicitation (2025: a server request; 2026: an input_required result the v2 client fulfils and
retries).
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.forkserver import python_argv
from tests.fixtures.helpers import REPO_ROOT, ScriptedHTTP
from tests.fixtures.journal import Journal
from tests.interop.harness import (
    CALL_BOUND_S,
    CONNECT_BOUND_S,
    REPORT_KEY,
    Prerequisites,
    Target,
    TsClient,
    proxy_stdio_argv,
    started,
)
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.interop]

HERE = Path(__file__).resolve().parent
TS2_CLIENT = HERE / "ts2_client.mjs"
SHAPE_SERVER = REPO_ROOT / "tests" / "fixtures" / "shape_server.py"
SCRIPTED_SERVER = REPO_ROOT / "tests" / "fixtures" / "scripted_server.py"
MODES = ("auto", "pin", "legacy")
# the last two: the same server speaking one era only (`--legacy-only`, `--only-2026`), so a client
# of the other era is served by the proxy's era bridge, input-required rounds and all
PATHS = (
    "http>stdio",
    "http>stdio pool",
    "http>http",
    "stdio>stdio",
    "stdio>http",
    "http>http 2025-only",
    "http>http 2026-only",
)
ERA = {"auto": "modern", "pin": "modern", "legacy": "legacy"}  # against a server speaking both
JOURNAL_BOUND_S = 30.0
_ids = itertools.count()


class Ts2Client(TsClient):
    """tests/interop/ts2_client.mjs (the v2 SDK) in a process of ours; same line protocol as TsClient."""

    def __init__(self, prereq: Prerequisites, mode: str, target: Target, env: Mapping[str, str] | None = None) -> None:
        import queue

        transport = ["http", target.url] if target.url else ["stdio", *target.argv]
        self.proc = subprocess.Popen(
            [prereq.node, str(TS2_CLIENT), mode, *transport],
            cwd=REPO_ROOT,
            env={**prereq.node_env(), **(env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.connected = self._read(CONNECT_BOUND_S)

    def ok(self, cmd: Mapping[str, Any], timeout_s: float = CALL_BOUND_S) -> Any:
        answer = self.command(cmd, timeout_s)
        assert answer["ok"], f"{cmd} threw: {answer.get('error')}"
        return answer

    def tool(self, name: str, **arguments: Any) -> dict[str, Any]:
        return dict(self.ok({"op": "callTool", "name": name, "arguments": arguments})["result"])


def _scripted_stdio(journal: Path) -> list[str]:
    return python_argv(SCRIPTED_SERVER, "--transport", "stdio", "--journal", str(journal))


@pytest.fixture(scope="module")
def scripted_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedHTTP]:
    journal = tmp_path_factory.mktemp("ts2-http") / "journal.jsonl"
    with ScriptedHTTP(journal) as server:
        yield server


@pytest.fixture(scope="module")
def http_stdio_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProcess, Path]]:
    tmp = tmp_path_factory.mktemp("ts2-http-stdio")
    journal = tmp / "journal.jsonl"
    proxy = ProxyProcess(upstream=_scripted_stdio(journal), log_path=tmp / "proxy.log")
    with started(proxy):
        yield proxy, journal


@pytest.fixture(scope="module")
def http_stdio_pool_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProcess, Path]]:
    tmp = tmp_path_factory.mktemp("ts2-http-stdio-pool")
    journal = tmp / "journal.jsonl"
    proxy = ProxyProcess(
        upstream=_scripted_stdio(journal), extra=["--stdio-modern-children", "2"], log_path=tmp / "proxy.log"
    )
    with started(proxy):
        yield proxy, journal


@pytest.fixture(scope="module")
def http_http_proxy(scripted_http: ScriptedHTTP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    tmp = tmp_path_factory.mktemp("ts2-http-http")
    with started(ProxyProcess(upstream_url=scripted_http.url, log_path=tmp / "proxy.log")) as proxy:
        yield proxy


@contextlib.contextmanager
def _one_era(tmp: Path, flag: str) -> Iterator[tuple[ProxyProcess, Journal]]:
    with ScriptedHTTP(tmp / "journal.jsonl", extra=[flag]) as server:
        with started(ProxyProcess(upstream_url=server.url, log_path=tmp / "proxy.log")) as proxy:
            yield proxy, server.journal


@pytest.fixture(scope="module")
def legacy_only_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProcess, Journal]]:
    with _one_era(tmp_path_factory.mktemp("ts2-legacy-only"), "--legacy-only") as served:
        yield served


@pytest.fixture(scope="module")
def modern_only_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProcess, Journal]]:
    with _one_era(tmp_path_factory.mktemp("ts2-modern-only"), "--only-2026") as served:
        yield served


@pytest.fixture
def leg(request: pytest.FixtureRequest, tmp_path: Path, scripted_http: ScriptedHTTP) -> tuple[Target, Journal]:
    """The path under test: how the client reaches the proxy, and the journal of the upstream."""
    path = request.param
    if path.endswith("-only"):
        proxy, journal = request.getfixturevalue("legacy_only_proxy" if "2025" in path else "modern_only_proxy")
        return Target(url=proxy.url), journal
    if path in ("http>stdio", "http>stdio pool"):
        proxy, journal = request.getfixturevalue("http_stdio_pool_proxy" if "pool" in path else "http_stdio_proxy")
        return Target(url=proxy.url), Journal(journal)
    if path == "http>http":
        proxy = request.getfixturevalue("http_http_proxy")
        return Target(url=proxy.url), scripted_http.journal
    if path == "stdio>stdio":
        journal = tmp_path / "journal.jsonl"
        return Target(argv=proxy_stdio_argv(_scripted_stdio(journal))), Journal(journal)
    assert path == "stdio>http"
    return Target(argv=proxy_stdio_argv(upstream_url=scripted_http.url)), scripted_http.journal


def _wait_journal(journal: Journal, tool: str, event: str, call: str) -> None:
    deadline = time.monotonic() + JOURNAL_BOUND_S
    while not journal.events(tool=tool, event=event, call=call):
        assert time.monotonic() < deadline, f"no {event} of {tool} {call} journaled within {JOURNAL_BOUND_S}s"
        time.sleep(0.05)


def _tag(mode: str, path: str) -> str:
    return f"{mode}-{path}-{next(_ids)}-{time.monotonic_ns()}"


@pytest.mark.parametrize("leg", PATHS, indirect=True)
@pytest.mark.parametrize("mode", MODES)
def test_user_session(
    prereq: Prerequisites, mode: str, leg: tuple[Target, Journal], request: pytest.FixtureRequest
) -> None:
    target, journal = leg
    tag = _tag(mode, "s")
    with Ts2Client(prereq, mode, target, env={"MCP_INTEROP_ELICIT_REPLY": "forty-two"}) as client:
        connected = client.connected
        assert connected["ok"], connected
        assert connected["connected"]["era"] == ERA[mode]
        assert "echo" in connected["connected"]["tools"]

        echoed = client.tool("echo", text="hello v2")
        assert echoed["structuredContent"] == {"text": "hello v2"} and not echoed["isError"]

        recovered = client.tool("flaky_read", key="k", fail_times=2, call_id=tag)
        assert not recovered["isError"]
        assert recovered["structuredContent"]["executions"] == 3
        assert recovered["_meta"]["io.mcp-recovery-proxy/attempts"] == 3

        unresolved = client.tool("always_fail", call_id=tag)
        assert unresolved["isError"] is True
        report = unresolved["_meta"][REPORT_KEY]
        assert report["stopReason"] == "attempts_exhausted" and report["attemptCount"] == 3
        assert report["errorCategory"] == "transient" and report["budgetExhausted"] is True

        # steps 0.3 s apart: the first two arrive in reads of their own even when a loaded machine
        # stalls a process for tens of milliseconds (at 50 ms apart, CI once saw only the first)
        slow = {"op": "callTool", "name": "slow_progress", "arguments": {"delay_s": 0.3}, "progress": True}
        progressed = client.ok(slow)
        # The last one may be lost by the client itself: v2 handles a notification in a microtask
        # but a response at once (dropping the call's progress handler), so a final progress that
        # arrives in the same read as the answer is dropped ("unknown token"). The proxy writes both
        # in order; it is seen through the proxy because it writes them in one chunk more often.
        assert [p["progress"] for p in progressed["progress"]][:2] == [1, 2], progressed
        assert progressed["result"]["structuredContent"] == {"steps": 3}

        resources = client.ok({"op": "listResources"})["result"]["resources"]
        assert "journal://summary" in [r["uri"] for r in resources]
        read = client.ok({"op": "readResource", "uri": "journal://summary"})["result"]
        assert '"counts"' in read["contents"][0]["text"]
        prompts = client.ok({"op": "listPrompts"})["result"]["prompts"]
        assert [p["name"] for p in prompts] == ["greet"]
        greeting = client.ok({"op": "getPrompt", "name": "greet", "arguments": {"name": "Ada"}})["result"]
        assert "Hello, Ada!" in greeting["messages"][0]["content"]["text"]

        # logging: 2025 sessions get the server's log messages (the scripted server sends them
        # without logging/setLevel, which it does not implement); 2026 requests opt in per request
        logged: dict[str, Any] = {"op": "callTool", "name": "log_then_answer", "arguments": {"message": tag}}
        if mode != "legacy":
            logged["logLevel"] = "info"
        elif "2026-only" in request.node.callspec.params["leg"]:
            # a 2026 server logs only for a request that names a level: through the bridge a 2025
            # session's messages are asked for once it set one (the proxy keeps it for the session)
            client.ok({"op": "setLoggingLevel", "level": "info"})
        client.ok(logged)
        logs = client.ok({"op": "notifications"})["result"]
        assert {"level": "info", "logger": "scripted", "data": tag} in logs

        # elicitation: 2025 by a server request mid-call; 2026 by an input_required result the v2
        # client fulfils and retries
        asked = client.tool("ask_elicitation", question="the answer?")
        assert asked["structuredContent"] == {"answer": "forty-two"}, asked

        if ERA[mode] == "modern":  # subscriptions/listen: opened, acknowledged, closed
            listened = client.ok({"op": "listen", "filter": {"toolsListChanged": True}})["result"]
            # through the bridge the filter is honoured as far as the 2025 server's capabilities
            # promise: the scripted server's handshake declares no tools.listChanged
            bridged = "2025-only" in request.node.callspec.params["leg"]
            assert listened["honoredFilter"].get("toolsListChanged") is (None if bridged else True), listened
            assert listened["closed"] == "local"

        # cancellation: the caller's AbortSignal reaches the upstream attempt
        client.ok({"op": "callTool", "name": "hang", "arguments": {"seconds": 40, "call_id": tag}, "id": "h"})
        _wait_journal(journal, "hang", "started", tag)
        if "pool" in request.node.callspec.params["leg"] and ERA[mode] == "modern":
            # with `hang` in flight on one child, the next calls reach another (started for them)
            (hung,) = journal.events(tool="hang", event="started", call=tag)
            deadline = time.monotonic() + JOURNAL_BOUND_S
            while not {e["pid"] for e in journal.events(tool="echo", call=tag)} - {hung["pid"]}:
                assert time.monotonic() < deadline, "2026 calls did not reach a second child"
                assert not client.tool("echo", text="spread", call_id=tag)["isError"]
        client.ok({"op": "abort", "id": "h"})
        aborted = client.command({"op": "await", "id": "h"})
        assert not aborted["ok"] and "abort" in aborted["error"]["message"].lower(), aborted
        _wait_journal(journal, "hang", "cancelled", tag)
        (hung,) = journal.events(tool="hang", event="started", call=tag)
        assert [e["pid"] for e in journal.events(tool="hang", event="cancelled", call=tag)] == [hung["pid"]]


def test_2026_logging_over_shared_stdio_link(
    prereq: Prerequisites, http_stdio_proxy: tuple[ProxyProcess, Path]
) -> None:
    """The usual sidecar (HTTP to the proxy, a stdio child) with a 2026 client that asks for log
    messages per request gets them: a stdio upstream's log message names no request, and the
    proxy's 2026 link is shared by every caller, so it was dropped as untied; now it goes to the
    sole open request stream when that request asked for log messages (relay.py, deliver())."""
    proxy, _ = http_stdio_proxy
    with Ts2Client(prereq, "pin", Target(url=proxy.url)) as client:
        assert client.connected["ok"], client.connected
        client.ok({"op": "callTool", "name": "log_then_answer", "arguments": {"message": "x"}, "logLevel": "info"})
        assert {"level": "info", "logger": "scripted", "data": "x"} in client.ok({"op": "notifications"})["result"]


@pytest.fixture(scope="module")
def shape_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    tmp = tmp_path_factory.mktemp("ts2-shape")
    with started(ProxyProcess(upstream=python_argv(SHAPE_SERVER), log_path=tmp / "proxy.log")) as proxy:
        yield proxy


@pytest.mark.parametrize("listen", ("http", "stdio"))
@pytest.mark.parametrize("mode", MODES)
def test_output_schema_failures_stay_results(
    prereq: Prerequisites, mode: str, listen: str, request: pytest.FixtureRequest
) -> None:
    """v2 checks structuredContent against the tool's outputSchema and throws on a mismatch: what
    the proxy answers for a failed tool with an output schema must never make it throw."""
    upstream = python_argv(SHAPE_SERVER)
    cases = {
        "lookup": ({"key": "missing"}, "validation"),  # outputSchema, the server fails it
        "refuse_conforming": ({}, "business"),  # outputSchema, its own conforming structuredContent
        "frobnicate": ({}, "business"),
        "delete_item": ({}, "validation"),  # the SDK's own input-validation failure
        "query": ({"sql": "select 1"}, "transient"),  # read-only, outputSchema, retried, then reported
    }

    def check(client: Ts2Client) -> None:
        assert client.connected["ok"], client.connected
        assert client.connected["connected"]["era"] == ERA[mode]
        for name, (arguments, category) in cases.items():
            result = client.tool(name, **arguments)
            assert result["isError"] is True, (name, result)
            assert result["_meta"][REPORT_KEY]["errorCategory"] == category, (name, result)
        assert client.tool("lookup", key="known")["structuredContent"] == {"name": "known", "kind": "thing"}

    if listen == "stdio":
        target = Target(argv=proxy_stdio_argv(upstream))
    else:
        target = Target(url=request.getfixturevalue("shape_http").url)
    with Ts2Client(prereq, mode, target) as client:
        check(client)


@pytest.fixture(scope="module")
def everything_http(prereq: Prerequisites, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    tmp = tmp_path_factory.mktemp("ts2-everything")
    upstream = [prereq.node, prereq.server_everything, "stdio"]
    with started(ProxyProcess(upstream=upstream, log_path=tmp / "proxy.log")) as proxy:
        yield proxy


@pytest.mark.parametrize("listen", ("http", "stdio"))
@pytest.mark.parametrize("mode", MODES)
def test_2025_only_upstream(prereq: Prerequisites, mode: str, listen: str, request: pytest.FixtureRequest) -> None:
    """npm server-everything speaks the 2025 handshake only: through the proxy a 2026 client (auto
    or pinned) is served over the proxy's bridge, its tools and their structured content as the
    server gives them; a 2025 client over the handshake, as directly."""
    if listen == "http":
        target = Target(url=request.getfixturevalue("everything_http").url)
    else:
        target = Target(argv=proxy_stdio_argv([prereq.node, prereq.server_everything, "stdio"]))
    with Ts2Client(prereq, mode, target) as client:
        connected = client.connected
        assert connected["ok"], connected
        assert connected["connected"]["era"] == ERA[mode]
        assert client.tool("echo", message="through")["content"][0]["text"] == "Echo: through"
        structured = client.tool("get-structured-content", location="Chicago")
        assert not structured.get("isError") and isinstance(structured.get("structuredContent"), dict), structured


def test_2025_only_upstream_with_the_bridge_off_refuses_a_pinned_2026_client(
    prereq: Prerequisites, tmp_path: Path
) -> None:
    """`--era-bridge off`: the proxy refuses 2026 as the server itself would; a pinned client is
    told at connect, with v2's typed error, not left hanging; `auto` falls back to the handshake."""
    upstream = [prereq.node, prereq.server_everything, "stdio"]
    proxy = ProxyProcess(upstream=upstream, extra=["--era-bridge", "off"], log_path=tmp_path / "proxy.log")
    with started(proxy):
        with Ts2Client(prereq, "pin", Target(url=proxy.url)) as client:
            assert not client.connected["ok"]
            assert client.connected["error"]["code"] == "ERA_NEGOTIATION_FAILED", client.connected
        with Ts2Client(prereq, "auto", Target(url=proxy.url)) as client:
            assert client.connected["ok"] and client.connected["connected"]["era"] == "legacy", client.connected
            assert client.tool("echo", message="through")["content"][0]["text"] == "Echo: through"
