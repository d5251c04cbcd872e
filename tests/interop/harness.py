"""The interop matrix's moving parts: prerequisites, targets, and the two clients that drive them.

Contract:
- `prerequisites()` reads `.cache/interop/manifest.json` (written by scripts/setup-interop.sh;
  `MCP_INTEROP_CACHE` moves it) and checks every file it names. Something missing is a skip on a
  developer's machine and a failure in CI (`CI=true` or `MCP_INTEROP_REQUIRED=1`): the matrix
  must never pass in CI by not running.
- A `Target` is how a client reaches a server: an HTTP URL, or a stdio command the client spawns.
- `run_ts(...)` and `run_py(...)` run one scripted list of `Call`s with one client and return one
  `Reply` per call: the result as the client's SDK returned it (JSON), or the error it threw.
  The TypeScript client is tests/interop/ts_client.mjs on the pinned TS SDK; the Python client is
  the SDK in our venv (mcp 2.3), pinned to the newest revision the server speaks: 2026-07-28 for
  the Python servers, the 2025 handshake for the TypeScript ones (what `mode="auto"` picks).
- Every process started here is stopped by its pid; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from tests.fixtures.helpers import PYTHON, REPO_ROOT, terminate
from tests.proxy_process import ProxyProcess

HERE = Path(__file__).resolve().parent
TS_CLIENT = HERE / "ts_client.mjs"
TS_HTTP_SERVER = HERE / "ts_http_server.mjs"
REPORT_KEY = "io.mcp-recovery-proxy/unresolved"
PROXY_META_PREFIX = "io.mcp-recovery-proxy/"
PyMode = Literal["legacy", "2026-07-28"]
CALL_BOUND_S = 60.0  # one scripted call, the long-running operation included
CONNECT_BOUND_S = 60.0  # a client launching `serve --listen stdio`: the proxy starts and probes first
# A proxy in front of a Python server probes it at start (mcp-server-git imports gitpython): seen
# taking 7-20 s on this 2-core machine under other engineers' load, so its readiness gets room.
PROXY_START_BOUND_S = 60.0


def required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("MCP_INTEROP_REQUIRED", "") not in (
        "",
        "0",
        "false",
        "no",
    )


def skip_or_fail(reason: str) -> None:
    if required():
        pytest.fail(f"interop prerequisite missing (required in CI): {reason}", pytrace=False)
    pytest.skip(f"{reason} (run scripts/setup-interop.sh)")


@dataclass(frozen=True)
class Prerequisites:
    node: str
    node_modules: str
    server_everything: str
    server_filesystem: str
    server_memory: str
    mcp_server_time: str
    mcp_server_git: str
    python_mcp19: str

    def node_env(self) -> dict[str, str]:
        return {**os.environ, "MCP_INTEROP_NODE_MODULES": self.node_modules}


def prerequisites() -> Prerequisites | str:
    """The installed parts, or why they are not usable."""
    cache = Path(os.environ.get("MCP_INTEROP_CACHE", REPO_ROOT / ".cache" / "interop"))
    manifest = cache / "manifest.json"
    try:
        found = json.loads(manifest.read_text())
        prereq = Prerequisites(**{k: found[k] for k in Prerequisites.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"no usable {manifest}: {exc}"
    for name, path in vars(prereq).items():
        if not Path(path).exists():
            return f"{name}: {path} does not exist"
    return prereq


@dataclass(frozen=True)
class Target:
    """How a client reaches a server: `url` (Streamable HTTP) or `argv` (stdio, client-spawned)."""

    url: str | None = None
    argv: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert (self.url is None) != (not self.argv), "exactly one of url and argv"


@contextlib.contextmanager
def started(proxy: ProxyProcess) -> Iterator[ProxyProcess]:
    """`proxy` started (ready on /readyz within PROXY_START_BOUND_S), and stopped by its pid."""
    proxy.start(timeout_s=PROXY_START_BOUND_S)
    try:
        yield proxy
    finally:
        proxy.stop()


def proxy_stdio_argv(upstream: Sequence[str] = (), upstream_url: str | None = None) -> tuple[str, ...]:
    """The proxy as a stdio server a client launches (`serve --listen stdio`), shipped defaults."""
    argv = [PYTHON, "-m", "proxy", "serve", "--listen", "stdio"]
    if upstream_url:
        argv += ["--upstream", upstream_url]
    if upstream:
        argv += ["--", *upstream]
    return tuple(argv)


@dataclass(frozen=True)
class Call:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Reply:
    """One call's outcome as a client saw it."""

    ok: bool  # the client returned a result (False: it threw)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    progress: list[Any] = field(default_factory=list)
    output_schema: dict[str, Any] | None = None  # the tool's, as listed to this client (Py only)

    @property
    def texts(self) -> str:
        """Every text block of the result, joined; the thrown message when the client threw."""
        if not self.ok:
            return str((self.error or {}).get("message", ""))
        blocks = (self.result or {}).get("content") or []
        return "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")

    @property
    def report(self) -> dict[str, Any] | None:
        meta = (self.result or {}).get("_meta") or {}
        report = meta.get(REPORT_KEY)
        return report if isinstance(report, dict) else None


# --- the TypeScript client ------------------------------------------------------------------


class TsConnectFailed(RuntimeError):
    """The TS client could not connect; `error` is what the SDK threw (name, message, code, data)."""

    def __init__(self, target: Target, reply: Mapping[str, Any]) -> None:
        super().__init__(f"TS client could not connect to {target}: {reply}")
        error = reply.get("error")
        self.error: dict[str, Any] = dict(error) if isinstance(error, Mapping) else {}


class TsClient:
    """tests/interop/ts_client.mjs in a process of ours, one JSON line per command and reply."""

    def __init__(self, prereq: Prerequisites, target: Target, env: Mapping[str, str] | None = None) -> None:
        transport = ["http", target.url] if target.url else ["stdio", *target.argv]
        self.proc = subprocess.Popen(
            [prereq.node, str(TS_CLIENT), *transport],
            cwd=REPO_ROOT,
            env={**prereq.node_env(), **(env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the client's and a stdio server's stderr go to pytest's capture
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        # A thread, because a pipe read cannot be bounded otherwise without an event loop here.
        threading.Thread(target=self._pump, daemon=True).start()
        self.connected = self._read(CONNECT_BOUND_S)
        if not self.connected.get("ok"):
            self.close()
            raise TsConnectFailed(target, self.connected)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(b"")

    def _read(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"TS client gave no answer within {timeout_s}s") from None
        if not line:
            raise RuntimeError(f"TS client exited (status {self.proc.poll()}) without answering")
        return dict(json.loads(line))

    def command(self, cmd: Mapping[str, Any], timeout_s: float = CALL_BOUND_S) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        self.proc.stdin.flush()
        return self._read(timeout_s)

    def call(self, call: Call, *, progress: bool = False, timeout_s: float = CALL_BOUND_S) -> Reply:
        raw = self.command(
            {"op": "callTool", "name": call.name, "arguments": dict(call.arguments), "progress": progress},
            timeout_s,
        )
        return Reply(
            ok=bool(raw["ok"]), result=raw.get("result"), error=raw.get("error"), progress=raw.get("progress", [])
        )

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()  # the client closes its session and exits 0 on end of input
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        terminate(self.proc)

    def __enter__(self) -> TsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_ts(
    prereq: Prerequisites, target: Target, calls: Sequence[Call], env: Mapping[str, str] | None = None
) -> list[Reply]:
    with TsClient(prereq, target, env) as client:
        return [client.call(call) for call in calls]


# --- the Python SDK client (mcp 2.3, our venv) ------------------------------------------------


def _dump(result: Any) -> dict[str, Any]:
    return dict(result.model_dump(mode="json", by_alias=True, exclude_none=True))


def _describe(exc: BaseException) -> dict[str, Any]:
    error = getattr(exc, "error", None)
    return {
        "name": type(exc).__name__,
        "message": str(getattr(error, "message", None) or exc)[:4000],
        "code": getattr(error, "code", None),
    }


async def _run_py(target: Target, calls: Sequence[Call], env: Mapping[str, str] | None, mode: PyMode) -> list[Reply]:
    from mcp import Client, StdioServerParameters

    server: Any
    if target.url:
        server = target.url
    else:
        server = StdioServerParameters(
            command=target.argv[0], args=list(target.argv[1:]), cwd=str(REPO_ROOT), env={**os.environ, **(env or {})}
        )
    replies: list[Reply] = []
    with anyio.fail_after(CONNECT_BOUND_S + CALL_BOUND_S * max(1, len(calls))):
        async with Client(server, mode=mode) as client:
            # as real clients do: output schemas known before calls
            schemas = {t.name: t.output_schema for t in (await client.list_tools()).tools}
            for call in calls:
                try:
                    with anyio.fail_after(CALL_BOUND_S):
                        result = await client.call_tool(call.name, dict(call.arguments))
                except TimeoutError:
                    raise
                except Exception as exc:  # what a user of this SDK would see instead of a result
                    replies.append(Reply(ok=False, error=_describe(exc)))
                else:
                    replies.append(Reply(ok=True, result=_dump(result), output_schema=schemas.get(call.name)))
    return replies


def run_py(target: Target, calls: Sequence[Call], mode: PyMode, env: Mapping[str, str] | None = None) -> list[Reply]:
    """`mode` as the SDK's Client takes it: "legacy" (the 2025 handshake) or "2026-07-28". Not
    "auto": its probe can time out against a slow-starting server and fall back, so a direct run
    and a proxied one could speak different revisions (and differ by the 2026 serverInfo stamp)."""
    return anyio.run(_run_py, target, calls, env, mode)


# --- comparing answers ----------------------------------------------------------------------

_MCP_ERROR_PREFIX = re.compile(r"^(?:MCP error -?\d+: )+")


def core_message(text: str) -> str:
    """The server's own words: without the TS SDK's "MCP error -32602: " prefix, bounded."""
    return _MCP_ERROR_PREFIX.sub("", text.strip())[:300]


def without_proxy_meta(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A result without the proxy's own `_meta` keys (what it may legitimately add)."""
    if result is None:
        return None
    out = dict(result)
    meta = {k: v for k, v in (out.pop("_meta", None) or {}).items() if not k.startswith(PROXY_META_PREFIX)}
    if meta:
        out["_meta"] = meta
    return out


@dataclass
class Process:
    """A server process of ours (the TS HTTP server), stopped by its pid."""

    argv: Sequence[str]
    env: Mapping[str, str]
    ready_line: bytes
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> Process:
        self.proc = subprocess.Popen(
            list(self.argv), cwd=REPO_ROOT, env=dict(self.env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
        )
        lines: queue.Queue[bytes] = queue.Queue()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)
            lines.put(b"")

        threading.Thread(target=pump, daemon=True).start()
        try:
            line = lines.get(timeout=timeout_s)
        except queue.Empty:
            self.stop()
            raise TimeoutError(f"{self.argv} not ready after {timeout_s}s") from None
        if not line.startswith(self.ready_line):
            self.stop()
            raise RuntimeError(f"{self.argv} did not start: {line!r}, status {self.proc.poll()}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> int | None:
        return terminate(self.proc) if self.proc else None


def ts_http_server(prereq: Prerequisites, port: int) -> Process:
    return Process(
        argv=[prereq.node, str(TS_HTTP_SERVER), str(port)],
        env=prereq.node_env(),
        ready_line=f"listening {port}".encode(),
    )
