"""A TypeScript SDK v2 server (tests/interop/ts2_server.mjs) behind the proxy (docs/interop.md).

The server is wired as the v2 README deploys it: `serveStdio(factory)` for stdio (the proxy spawns
`node ts2_server.mjs --stdio`), `toNodeHandler(createMcpHandler(factory))` for Streamable HTTP
(`--upstream http://127.0.0.1:PORT/mcp`); both serve 2026-07-28 and, by default, the 2025
handshake (HTTP: stateless per request). In front of each proxy: the Python SDK 2.3 client in both
eras (`mode="legacy"`, `mode="2026-07-28"`) and the TS SDK v1 client (tests/interop/ts_client.mjs,
2025-11-25). Every leg = upstream transport x client.

What each leg shows, counted in the server's own journal (one line per execution, written before
the tool answers):
- tools/list, a plain call, a tool with an outputSchema (structuredContent intact), a resource and
  a prompt relay unchanged: equal to what the same client gets from the server directly;
- `flaky` (idempotent) recovered within one call: exactly the policy's 3 executions, no more; with
  more failures than attempts, an unresolved result of the contract's shape after exactly 3;
- `charge` (unannotated: state-changing) failing transiently after it charged: executed once, never
  repeated, `outcomeUnknown`;
- `hang` past the attempt timeout: every attempt cancelled upstream (the journal's "cancelled"
  line carries the request id of an attempt that started), the call unresolved;
- progress and log messages relayed to the caller;
- the server killed mid-call (stdio: the proxy starts a new child, the next call is answered by
  it; HTTP: the connection resets): transient, dispatch unknown, not repeated (state-changing).
Every process is started here and stopped by its pid; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.fixtures.helpers import free_port
from tests.interop.harness import (
    HERE,
    PROXY_START_BOUND_S,
    REPORT_KEY,
    Prerequisites,
    Process,
    Target,
    TsClient,
)
from tests.proxy_process import ProxyProcess
from tests.recovery.test_recovery_report import TABLE_KEYS

pytestmark = [pytest.mark.slow, pytest.mark.interop]
TS2_SERVER = HERE / "ts2_server.mjs"
UPSTREAMS = ("stdio", "http")
CLIENTS = ("py-legacy", "py-2026", "ts")
BOUND_S = 60.0
ATTEMPTS_KEY = "io.mcp-recovery-proxy/attempts"

POLICIES = {
    "flaky.yaml": (
        "tools: [flaky]\nattempts: 3\ndeadline: 30s\nattempt_timeout: 10s\n"
        "backoff: {initial: 20ms, max: 100ms, multiplier: 2, jitter: full}\n"
    ),
    "hang.yaml": "tools: [hang]\nattempts: 2\ndeadline: 20s\nattempt_timeout: 1s\nmin_attempt_time: 100ms\n"
    "backoff: {initial: 20ms, max: 100ms, multiplier: 2, jitter: full}\n",
    "charge.yaml": "tools: [charge]\nattempts: 3\ndeadline: 40s\nattempt_timeout: 30s\n",
    "slow.yaml": "tools: [slow]\nattempts: 3\ndeadline: 50s\nattempt_timeout: 45s\n",
}
# The contract's table (tests/recovery/test_recovery_report.py keeps it), less the one key that
# appears only when there is a delay to suggest.
REPORT_KEYS = TABLE_KEYS - {"retryAfterMs"}


# --- the parts ------------------------------------------------------------------------------


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self, key: str | None = None) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = [json.loads(line) for line in lines if line.strip()]
        return [e for e in out if key is None or e.get("key") == key]

    def count(self, key: str, event: str) -> int:
        return sum(1 for e in self.entries(key) if e["event"] == event)

    def wait_for(self, key: str, event: str, n: int, timeout_s: float = BOUND_S) -> list[dict[str, Any]]:
        """The key's `event` entries once there are `n` of them (a file, so polled), bounded."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [e for e in self.entries(key) if e["event"] == event]
            if len(found) >= n:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} {event!r} for {key} not journalled in {timeout_s}s: {self.entries(key)}")
            time.sleep(0.05)


def ts2_stdio_argv(prereq: Prerequisites, journal: Path) -> list[str]:
    return [prereq.node, str(TS2_SERVER), "--stdio", str(journal)]


def ts2_http_server(prereq: Prerequisites, port: int, journal: Path) -> Process:
    return Process(
        argv=[prereq.node, str(TS2_SERVER), "--http", str(port), str(journal)],
        env=prereq.node_env(),
        ready_line=f"listening {port}".encode(),
    )


def write_policies(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in POLICIES.items():
        (folder / name).write_text(text)
    return folder


@dataclass
class Leg:
    upstream: str
    proxy: ProxyProcess
    journal: Journal
    server: Process | None = None  # the HTTP upstream; None for stdio (the proxy's child)


@contextlib.contextmanager
def leg(prereq: Prerequisites, upstream: str, tmp: Path) -> Iterator[Leg]:
    tmp.mkdir(parents=True, exist_ok=True)
    journal = Journal(tmp / "journal.jsonl")
    extra = ["--policies", str(write_policies(tmp / "policies"))]
    env = {"MCP_INTEROP_NODE_MODULES": prereq.node_modules}
    server = None
    if upstream == "stdio":
        # A node child loading the SDK took 8-17 s to answer under this machine's load (about 10),
        # past the default 10 s start bound: the probe failed and readiness came late.
        extra += ["--stdio-start-timeout-s", "30"]
        proxy = ProxyProcess(
            upstream=ts2_stdio_argv(prereq, journal.path), extra=extra, env=env, log_path=tmp / "proxy.log"
        )
    else:
        port = free_port()
        server = ts2_http_server(prereq, port, journal.path).start()
        proxy = ProxyProcess(upstream_url=f"http://127.0.0.1:{port}/mcp", extra=extra, log_path=tmp / "proxy.log")
    try:
        proxy.start(timeout_s=PROXY_START_BOUND_S)
        yield Leg(upstream, proxy, journal, server)
    finally:
        proxy.stop()
        if server:
            server.stop()


@pytest.fixture(scope="module")
def legs(prereq: Prerequisites, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Leg]]:
    with contextlib.ExitStack() as stack:
        yield {u: stack.enter_context(leg(prereq, u, tmp_path_factory.mktemp(f"ts2-{u}"))) for u in UPSTREAMS}


# --- one client session, whatever the client --------------------------------------------------


@dataclass
class Answer:
    ok: bool
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    progress: list[float] | None = None
    logs: list[Any] | None = None

    @property
    def text(self) -> str:
        blocks = (self.result or {}).get("content") or []
        return "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")

    @property
    def report(self) -> dict[str, Any]:
        report = ((self.result or {}).get("_meta") or {}).get(REPORT_KEY)
        assert isinstance(report, dict), f"no unresolved report in {self.result or self.error}"
        return report

    @property
    def structured(self) -> Any:
        r = self.result or {}
        return r.get("structuredContent", r.get("structured_content"))


def _py_dump(obj: Any) -> dict[str, Any]:
    return dict(obj.model_dump(mode="json", by_alias=True, exclude_none=True))


async def _py_session(target: Target, mode: str, script: list[dict[str, Any]], env: dict[str, str]) -> list[Answer]:
    from mcp import Client, StdioServerParameters

    server: Any = target.url
    if target.argv:
        server = StdioServerParameters(command=target.argv[0], args=list(target.argv[1:]), env=env)

    logs: list[Any] = []
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async def on_log(params: Any) -> None:
        logs.append(params.data)

    answers: list[Answer] = []
    with anyio.fail_after(BOUND_S * (1 + len(script))):
        async with Client(server, mode=mode, logging_callback=on_log, log_level="debug") as client:  # type: ignore[arg-type]
            tools = {t.name: t for t in (await client.list_tools()).tools}
            answers.append(Answer(True, {"tools": sorted(tools)}))
            for cmd in script:
                logs.clear()
                progress.clear()
                try:
                    with anyio.fail_after(BOUND_S):
                        if cmd["op"] == "callTool":
                            result: Any = await client.call_tool(
                                cmd["name"], cmd["arguments"], progress_callback=on_progress
                            )
                        elif cmd["op"] == "readResource":
                            result = await client.read_resource(cmd["uri"])
                        else:
                            result = await client.get_prompt(cmd["name"], cmd["arguments"])
                except TimeoutError:
                    raise
                except Exception as exc:  # what a user of this SDK sees instead of a result
                    answers.append(Answer(False, error={"name": type(exc).__name__, "message": str(exc)[:2000]}))
                else:
                    answers.append(Answer(True, _py_dump(result), progress=list(progress), logs=list(logs)))
    return answers


def session(prereq: Prerequisites, client: str, to: str | Target, script: list[dict[str, Any]]) -> list[Answer]:
    """Connect `client` to `to` (a URL, or a Target), run the script, return [tools answer, one
    Answer per command]."""
    target = Target(url=to) if isinstance(to, str) else to
    if client.startswith("py-"):
        mode = "legacy" if client == "py-legacy" else "2026-07-28"
        return anyio.run(_py_session, target, mode, script, prereq.node_env())
    with TsClient(prereq, target) as ts:
        answers = [Answer(True, {"tools": sorted(ts.connected["connected"]["tools"])})]
        for cmd in script:
            raw = ts.command({**cmd, "progress": True} if cmd["op"] == "callTool" else cmd, BOUND_S)
            answers.append(
                Answer(
                    bool(raw["ok"]),
                    raw.get("result"),
                    raw.get("error"),
                    [p["progress"] for p in raw.get("progress", [])],
                    [entry.get("data") for entry in raw.get("logs", [])],
                )
            )
        return answers


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"op": "callTool", "name": name, "arguments": arguments}


def key() -> str:
    return uuid.uuid4().hex[:12]


def assert_report_shape(report: dict[str, Any], category: str, stop: str) -> None:
    assert REPORT_KEYS <= set(report), f"missing {REPORT_KEYS - set(report)} in {report}"
    assert report["errorCategory"] == category, report
    assert report["stopReason"] == stop, report
    assert report["isRetryable"] is False, report
    assert len(report["attemptedSteps"]) == report["attemptCount"], report


@pytest.fixture(params=[(u, c) for u in UPSTREAMS for c in CLIENTS], ids=lambda p: f"{p[0]}-{p[1]}")
def path(request: pytest.FixtureRequest, legs: dict[str, Leg]) -> tuple[Leg, str]:
    upstream, client = request.param
    return legs[upstream], client


# --- the tests ------------------------------------------------------------------------------


def test_tools_resources_prompts_relay(prereq: Prerequisites, path: tuple[Leg, str]) -> None:
    leg_, client = path
    tools, echo, forecast, unknown_city, resource, prompt = session(
        prereq,
        client,
        leg_.proxy.url,
        [
            call("echo", text="hello v2"),
            call("forecast", city="Paris"),
            call("forecast", city="Atlantis"),
            {"op": "readResource", "uri": "note://readme"},
            {"op": "getPrompt", "name": "greet", "arguments": {"name": "Ada"}},
        ],
    )
    assert tools.result == {"tools": ["charge", "echo", "flaky", "forecast", "hang", "progress", "slow"]}
    assert echo.ok and echo.text == "hello v2", echo
    assert forecast.ok and forecast.structured == {"city": "Paris", "temperature": 18}, forecast
    # an isError result of a tool with an outputSchema: the TS client checks structuredContent
    assert unknown_city.ok, unknown_city.error
    assert (unknown_city.result or {}).get("isError", (unknown_city.result or {}).get("is_error")) is True
    assert "City not found: Atlantis" in unknown_city.text
    assert unknown_city.report["errorCategory"] == "validation"
    assert resource.ok and resource.result["contents"][0]["text"] == "ts2 server readme", resource  # type: ignore[index]
    assert prompt.ok and prompt.result["messages"][0]["content"]["text"] == "Hello, Ada!", prompt  # type: ignore[index]


def test_flaky_tool_recovered_within_the_policys_attempts(prereq: Prerequisites, path: tuple[Leg, str]) -> None:
    leg_, client = path
    recovered, exhausted = key(), key()
    _, ok, gave_up = session(
        prereq,
        client,
        leg_.proxy.url,
        [call("flaky", key=recovered, failures=2), call("flaky", key=exhausted, failures=5)],
    )
    assert ok.ok and ok.text == "flaky ok after 3 executions", ok
    assert ok.result["_meta"][ATTEMPTS_KEY] == 3, ok.result  # type: ignore[index]
    assert leg_.journal.count(recovered, "executed") == 3
    assert gave_up.ok, gave_up.error
    assert leg_.journal.count(exhausted, "executed") == 3  # the policy's attempts, no more
    report = gave_up.report
    assert_report_shape(report, "transient", "attempts_exhausted")
    assert report["attemptCount"] == report["maxAttempts"] == 3
    assert report["budgetExhausted"] is True and report["outcomeUnknown"] is False
    assert report["operation"]["tool"] == "flaky" and report["operation"]["sideEffect"] == "idempotent", report


def test_state_changing_tool_never_repeated_when_outcome_unknown(prereq: Prerequisites, path: tuple[Leg, str]) -> None:
    leg_, client = path
    k = key()
    _, charged = session(prereq, client, leg_.proxy.url, [call("charge", key=k, fail=True)])
    assert charged.ok, charged.error
    assert leg_.journal.count(k, "executed") == 1
    report = charged.report
    assert_report_shape(report, "transient", "outcome_unknown")
    assert report["outcomeUnknown"] is True and report["attemptCount"] == 1, report
    assert report["operation"]["sideEffect"] == "state_changing", report


def test_hang_attempts_cancelled_upstream_on_timeout(prereq: Prerequisites, path: tuple[Leg, str]) -> None:
    leg_, client = path
    k = key()
    _, hung = session(prereq, client, leg_.proxy.url, [call("hang", key=k)])
    assert hung.ok, hung.error
    report = hung.report
    assert_report_shape(report, "transient", "attempts_exhausted")
    assert report["attemptCount"] == 2, report
    started = leg_.journal.wait_for(k, "started", 2)
    cancelled = leg_.journal.wait_for(k, "cancelled", 2)  # the cancel may land after the answer
    assert sorted(str(e["id"]) for e in cancelled) == sorted(str(e["id"]) for e in started)
    assert leg_.journal.count(k, "executed") == 0


def test_progress_and_logging_relayed(prereq: Prerequisites, path: tuple[Leg, str]) -> None:
    leg_, client = path
    _, done = session(prereq, client, leg_.proxy.url, [call("progress", steps=3)])
    assert done.ok and done.text == "done 3", done
    assert done.progress == [1, 2, 3], done.progress
    assert done.logs == ["step 1 of 3", "step 2 of 3", "step 3 of 3"], done.logs


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_server_killed_mid_call(prereq: Prerequisites, upstream: str, tmp_path: Path) -> None:
    """The upstream process killed while a state-changing call runs: transient, dispatch unknown,
    outcome unknown, not repeated. Over stdio the proxy starts a new child for the next call."""
    with leg(prereq, upstream, tmp_path) as leg_:
        k = key()

        def kill_when_started() -> None:
            (entry,) = leg_.journal.wait_for(k, "started", 1)
            os.kill(int(entry["pid"]), signal.SIGKILL)

        async def run() -> list[Answer]:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, kill_when_started)
                answers = await anyio.to_thread.run_sync(
                    session, prereq, "py-2026", leg_.proxy.url, [call("charge", key=k, hold_ms=30000)]
                )
            return answers

        _, killed = anyio.run(run)
        assert killed.ok, killed.error
        report = killed.report
        assert_report_shape(report, "transient", "outcome_unknown")
        assert report["outcomeUnknown"] is True and report["attemptCount"] == 1, report
        assert report["attemptedSteps"][0]["dispatched"] == "unknown", report
        assert leg_.journal.count(k, "started") == 1 and leg_.journal.count(k, "executed") == 0
        if upstream == "stdio":
            (old,) = leg_.journal.wait_for(k, "started", 1)
            after = key()
            _, echo = session(prereq, "py-2026", leg_.proxy.url, [call("flaky", key=after, failures=0)])
            assert echo.ok and echo.text == "flaky ok after 1 executions", echo
            (new,) = leg_.journal.wait_for(after, "executed", 1)
            assert new["pid"] != old["pid"]


def _comparable(answer: Answer) -> Any:
    """The answer as the client returned it, without the proxy's own `_meta` keys."""
    result = dict(answer.result or {})
    meta = {k: v for k, v in (result.pop("_meta", None) or {}).items() if not k.startswith("io.mcp-recovery-proxy/")}
    if meta:
        result["_meta"] = meta
    return {"ok": answer.ok, "result": result, "error": answer.error, "progress": answer.progress}


def test_proxied_answers_equal_direct_ones(prereq: Prerequisites, path: tuple[Leg, str], tmp_path: Path) -> None:
    """Successes through the proxy are what the same client gets from the server itself."""
    leg_, client = path
    if leg_.upstream == "stdio":
        direct: str | Target = Target(argv=tuple(ts2_stdio_argv(prereq, tmp_path / "direct.jsonl")))
    else:
        assert leg_.server is not None
        direct = leg_.proxy.upstream_url or ""
    script = [
        call("echo", text="same"),
        call("forecast", city="Oslo"),
        call("progress", steps=2),
        {"op": "readResource", "uri": "note://readme"},
        {"op": "getPrompt", "name": "greet", "arguments": {"name": "Ada"}},
    ]
    proxied = session(prereq, client, leg_.proxy.url, script)
    straight = session(prereq, client, direct, script)
    for got, want in zip(proxied, straight, strict=True):
        if leg_.upstream == "stdio" and client == "ts":
            # The v1 TS client spawning the server itself reports no progress, although the server
            # wrote both notifications before its result (seen on a tap of the pipe); through the
            # proxy it speaks HTTP and gets them. A client quirk, not what this test compares.
            got.progress = want.progress = None
        assert _comparable(got) == _comparable(want)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_a_callers_cancellation_reaches_the_v2_server(
    prereq: Prerequisites, legs: dict[str, Leg], upstream: str, mode: str
) -> None:
    """The Python client gives up on a `slow` call (its cancel scope: `notifications/cancelled` in
    the 2025 era, the response stream closed in 2026): the attempt in flight is cancelled upstream
    (its attempt timeout, 45 s, is far off: only the caller's cancel stops it) and no new one
    starts."""
    leg_, k = legs[upstream], key()

    async def run() -> None:
        from mcp import Client

        with anyio.fail_after(BOUND_S):
            async with Client(leg_.proxy.url, mode=mode) as client:  # type: ignore[arg-type]
                async with anyio.create_task_group() as tg:
                    scope = anyio.CancelScope()

                    async def hang() -> None:
                        with scope:
                            await client.call_tool("slow", {"key": k})

                    tg.start_soon(hang)
                    await anyio.to_thread.run_sync(leg_.journal.wait_for, k, "started", 1)
                    scope.cancel()

    anyio.run(run)
    (started,) = leg_.journal.wait_for(k, "started", 1)
    (cancelled,) = leg_.journal.wait_for(k, "cancelled", 1, timeout_s=30.0)  # before the 45 s timeout
    assert str(cancelled["id"]) == str(started["id"])
    assert leg_.journal.count(k, "started") == 1 and leg_.journal.count(k, "executed") == 0


def test_2026_calls_spread_over_two_v2_server_children(prereq: Prerequisites, tmp_path: Path) -> None:
    """`--stdio-modern-children 2` in front of the v2 server over stdio: with a `slow` call in
    flight on the first node child, the next 2026 calls start and reach a second one; the caller's
    cancellation of the `slow` call reaches the child that runs it (its pid in the journal)."""
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(
        upstream=ts2_stdio_argv(prereq, journal.path),
        extra=[
            "--policies",
            str(write_policies(tmp_path / "policies")),
            "--stdio-start-timeout-s",
            "30",
            "--stdio-modern-children",
            "2",
        ],
        env={"MCP_INTEROP_NODE_MODULES": prereq.node_modules},
        log_path=tmp_path / "proxy.log",
    )
    k = key()

    def echo_pids() -> set[int]:
        return {e["pid"] for e in journal.entries() if e.get("tool") == "echo"}

    async def run() -> None:
        from mcp import Client

        with anyio.fail_after(2 * BOUND_S):
            async with Client(proxy.url, mode="2026-07-28") as client:
                await client.call_tool("echo", {"text": "first"})
                async with anyio.create_task_group() as tg:
                    scope = anyio.CancelScope()

                    async def slow() -> None:
                        with scope:
                            await client.call_tool("slow", {"key": k})

                    tg.start_soon(slow)
                    await anyio.to_thread.run_sync(journal.wait_for, k, "started", 1)
                    while len(echo_pids()) < 2:  # bounded by fail_after: a second child starts for the load
                        result = await client.call_tool("echo", {"text": "more"})
                        assert not result.is_error
                    scope.cancel()

    proxy.start(timeout_s=PROXY_START_BOUND_S)
    try:
        anyio.run(run)
        (started,) = journal.wait_for(k, "started", 1)
        (cancelled,) = journal.wait_for(k, "cancelled", 1, timeout_s=30.0)
        assert cancelled["pid"] == started["pid"] and str(cancelled["id"]) == str(started["id"])
        assert len(echo_pids()) == 2
    finally:
        proxy.stop()
