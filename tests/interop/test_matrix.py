"""The interop matrix (docs/interop.md): real servers x paths x real clients.

Each server is reached directly and through the proxy with its shipped default policies:
HTTP->stdio (one proxy per server module, started once), stdio->stdio (the client launches
`serve --listen stdio`), and for our TypeScript-SDK HTTP server HTTP->HTTP and stdio->HTTP. Each
path is driven by the TypeScript SDK client (tests/interop/ts_client.mjs, the 2025-11-25
handshake) and the Python SDK 2.3 client (2026-07-28 where the server speaks it: mcp-server-time
and -git; else the handshake), each running one scripted list of calls per path; the tests then
read those answers.

- Successes: the proxied answer equals the direct one (after removing the proxy's own `_meta`
  keys and normalising what legitimately differs between runs: a per-run tag in the names this
  run creates, the current time).
- Errors (a missing file, an invalid timezone, a missing branch, an unknown tool, invalid
  arguments, ...): the client does not throw (the TS SDK throws when an error's
  `structuredContent` violates the tool's output schema; for the Python client the test checks
  that schema itself); the result is `isError`; the server's own message
  (as the same client saw it directly) is readable in its text; the report in
  `_meta["io.mcp-recovery-proxy/unresolved"]` has the category of the shipped table
  (docs/recovery.md) and no `outcomeUnknown`.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.fixtures.helpers import free_port
from tests.interop.harness import (
    Call,
    Prerequisites,
    PyMode,
    Reply,
    Target,
    core_message,
    proxy_stdio_argv,
    run_py,
    run_ts,
    started,
    ts_http_server,
    without_proxy_meta,
)
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.interop]
CLIENTS = ("ts", "py")
TAG = "{tag}"  # replaced in call arguments by a per-run tag; answers have it replaced back


@dataclass(frozen=True)
class ErrorCase:
    call: Call
    category: str  # the shipped classification table's category for this server's message
    why: str


@dataclass
class ServerCase:
    name: str
    successes: Sequence[Call]
    errors: Sequence[ErrorCase]
    stdio: Sequence[str] = ()  # the server's stdio command, or empty for an HTTP server
    url: str | None = None
    normalise: Callable[[str], str] = lambda s: s
    py_mode: PyMode = "legacy"  # the Python client's revision: the newest the server speaks
    paths: dict[str, Target] = field(default_factory=dict)


def _everything(prereq: Prerequisites, tmp: Path) -> ServerCase:
    return ServerCase(
        "server-everything",
        stdio=[prereq.node, prereq.server_everything, "stdio"],
        successes=[
            Call("echo", {"message": "hello from " + TAG}),
            Call("get-sum", {"a": 2, "b": 40}),
            Call("get-structured-content", {"location": "Chicago"}),  # declares an outputSchema
        ],
        errors=[
            ErrorCase(Call("get-sum", {"a": "two", "b": 3}), "validation", "invalid arguments"),
            ErrorCase(Call("no-such-tool", {}), "validation", "unknown tool"),
        ],
    )


def _filesystem(prereq: Prerequisites, tmp: Path) -> ServerCase:
    root = tmp / "files"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("hello interop\n")
    (root / "sub" / "b.txt").write_text("bee\n")
    root = root.resolve()
    return ServerCase(
        "server-filesystem",
        stdio=[prereq.node, prereq.server_filesystem, str(root)],
        successes=[  # every filesystem tool declares an outputSchema
            Call("read_text_file", {"path": str(root / "a.txt")}),
            Call("list_directory", {"path": str(root)}),
            Call("list_allowed_directories", {}),
        ],
        errors=[
            ErrorCase(Call("read_text_file", {"path": str(root / "missing.txt")}), "validation", "missing file"),
            ErrorCase(Call("read_text_file", {"path": "/etc/hostname"}), "permission", "outside allowed dirs"),
            ErrorCase(Call("read_text_file", {"path": 5}), "validation", "invalid arguments"),
            ErrorCase(Call("no_such_tool", {}), "validation", "unknown tool"),
        ],
    )


def _memory(prereq: Prerequisites, tmp: Path) -> ServerCase:
    store = tmp / "memory.jsonl"
    entity = {"name": "ada-" + TAG, "entityType": "person", "observations": ["wrote the notes"]}
    return ServerCase(
        "server-memory",
        # `env` so every path (direct, and the proxy's children) uses this run's store
        stdio=["env", f"MEMORY_FILE_PATH={store}", prereq.node, prereq.server_memory],
        successes=[
            Call("create_entities", {"entities": [entity]}),
            Call("open_nodes", {"names": ["ada-" + TAG]}),
        ],
        errors=[
            # add_observations is state-changing (no hints): a refusal is not "outcome unknown"
            ErrorCase(
                Call("add_observations", {"observations": [{"entityName": "nobody-" + TAG, "contents": ["x"]}]}),
                "validation",
                "missing entity",
            ),
            ErrorCase(Call("no_such_tool", {}), "validation", "unknown tool"),
        ],
    )


_NOW = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?")


def _time(prereq: Prerequisites, tmp: Path) -> ServerCase:
    return ServerCase(
        "mcp-server-time",
        stdio=[prereq.mcp_server_time, "--local-timezone", "UTC"],
        successes=[
            Call("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
            Call("get_current_time", {"timezone": "UTC"}),
        ],
        errors=[
            ErrorCase(Call("get_current_time", {"timezone": "Mars/Olympus"}), "validation", "invalid timezone"),
            ErrorCase(Call("get_current_time", {}), "validation", "missing argument"),
            ErrorCase(Call("no_such_tool", {}), "validation", "unknown tool"),
        ],
        normalise=lambda s: _NOW.sub("<now>", s),
        py_mode="2026-07-28",
    )


def _git(prereq: Prerequisites, tmp: Path) -> ServerCase:
    repo = (tmp / "repo").resolve()
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=Interop", "-c", "user.email=interop@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True, timeout=30)
    (repo / "README").write_text("interop\n")
    subprocess.run([*git, "add", "README"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True, timeout=30)
    return ServerCase(
        "mcp-server-git",
        stdio=[prereq.mcp_server_git, "--repository", str(repo)],
        successes=[
            Call("git_status", {"repo_path": str(repo)}),
            Call("git_log", {"repo_path": str(repo), "max_count": 5}),
            Call("git_branch", {"repo_path": str(repo), "branch_type": "local"}),
        ],
        errors=[
            # git_checkout is state-changing: a checkout git refused is not "outcome unknown"
            ErrorCase(
                Call("git_checkout", {"repo_path": str(repo), "branch_name": "no-such-branch"}),
                "validation",
                "missing branch",
            ),
            ErrorCase(Call("git_status", {}), "validation", "missing argument"),
            ErrorCase(Call("no_such_tool", {}), "validation", "unknown tool"),
        ],
        py_mode="2026-07-28",
    )


def _ts_http(prereq: Prerequisites, tmp: Path) -> ServerCase:
    return ServerCase(
        "ts-sdk-http-server",
        successes=[
            Call("echo", {"text": "hello from " + TAG}),
            Call("forecast", {"city": "Paris"}),  # declares an outputSchema
        ],
        errors=[
            # forecast declares an outputSchema: the TS client checks any structuredContent against it
            ErrorCase(Call("forecast", {"city": "Atlantis"}), "validation", "tool error, output schema"),
            ErrorCase(Call("echo", {"text": 5}), "validation", "invalid arguments"),
            ErrorCase(Call("no_such_tool", {}), "validation", "unknown tool"),
        ],
    )


SERVERS: Mapping[str, Callable[[Prerequisites, Path], ServerCase]] = {
    "everything": _everything,
    "filesystem": _filesystem,
    "memory": _memory,
    "time": _time,
    "git": _git,
    "ts-http": _ts_http,
}
STDIO_PATHS = ("direct", "http->stdio", "stdio->stdio")
HTTP_PATHS = ("direct", "http->http", "stdio->http")


class Matrix:
    """One server's processes (started once) and each (path, client) run, made on first use."""

    def __init__(self, prereq: Prerequisites, case: ServerCase) -> None:
        self.prereq, self.case = prereq, case
        self._runs: dict[tuple[str, str], tuple[str, list[Reply]]] = {}

    def run(self, path: str, client: str) -> tuple[str, list[Reply]]:
        """(tag, replies) for the success calls then the error calls, in order."""
        if (path, client) not in self._runs:
            tag = f"{client}-{path}".replace(">", "").replace("-", "")
            calls = [_tagged(c, tag) for c in (*self.case.successes, *(e.call for e in self.case.errors))]
            target = self.case.paths[path]
            if client == "ts":
                replies = run_ts(self.prereq, target, calls)
            else:
                replies = run_py(target, calls, self.case.py_mode)
            self._runs[path, client] = tag, replies
        return self._runs[path, client]

    def successes(self, path: str, client: str) -> list[Any]:
        tag, replies = self.run(path, client)
        out = []
        for reply in replies[: len(self.case.successes)]:
            answer = without_proxy_meta(reply.result) if reply.ok else reply.error
            text = json.dumps(answer, sort_keys=True).replace(tag, "<tag>")
            out.append((reply.ok, self.case.normalise(text)))
        return out

    def errors(self, path: str, client: str) -> tuple[str, list[Reply]]:
        tag, replies = self.run(path, client)
        return tag, replies[len(self.case.successes) :]


def _tagged(call: Call, tag: str) -> Call:
    def sub(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(TAG, tag)
        if isinstance(value, list):
            return [sub(v) for v in value]
        if isinstance(value, dict):
            return {k: sub(v) for k, v in value.items()}
        return value

    return Call(call.name, sub(dict(call.arguments)))


def _is_http(server: str) -> bool:
    return server == "ts-http"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Only the paths each server has: (server, path, client), the server's processes per module."""
    if "matrix" not in metafunc.fixturenames:
        return
    combos = [
        pytest.param(server, path, client, id=f"{server}-{path}-{client}")
        for server in SERVERS
        for path in (HTTP_PATHS if _is_http(server) else STDIO_PATHS)[1:]
        for client in CLIENTS
    ]
    metafunc.parametrize(("matrix", "path", "client"), combos, indirect=["matrix"], scope="module")


@pytest.fixture(scope="module")
def matrix(
    request: pytest.FixtureRequest, prereq: Prerequisites, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Matrix]:
    tmp = tmp_path_factory.mktemp(f"interop-{request.param}")
    case = SERVERS[request.param](prereq, tmp)
    with contextlib.ExitStack() as stack:
        if case.stdio:
            proxy = stack.enter_context(started(ProxyProcess(upstream=case.stdio, log_path=tmp / "proxy.log")))
            case.paths = {
                "direct": Target(argv=tuple(case.stdio)),
                "http->stdio": Target(url=proxy.url),
                "stdio->stdio": Target(argv=proxy_stdio_argv(upstream=case.stdio)),
            }
        else:
            port = free_port()
            server = ts_http_server(prereq, port).start()
            stack.callback(server.stop)
            direct = f"http://127.0.0.1:{port}/mcp"
            proxy = stack.enter_context(started(ProxyProcess(upstream_url=direct, log_path=tmp / "proxy.log")))
            case.paths = {
                "direct": Target(url=direct),
                "http->http": Target(url=proxy.url),
                "stdio->http": Target(argv=proxy_stdio_argv(upstream_url=direct)),
            }
        yield Matrix(prereq, case)


def test_successes_are_the_same_direct_and_proxied(matrix: Matrix, path: str, client: str) -> None:
    direct = matrix.successes("direct", client)
    assert all(ok for ok, _ in direct), f"the scripted successes must succeed directly: {direct}"
    for call, want, got in zip(matrix.case.successes, direct, matrix.successes(path, client), strict=True):
        assert got == want, f"{call.name}: proxied answer differs from direct"


def test_errors_are_readable_and_classified(matrix: Matrix, path: str, client: str) -> None:
    direct_tag, direct = matrix.errors("direct", client)
    tag, proxied = matrix.errors(path, client)
    problems: list[str] = []
    for case, seen_direct, reply in zip(matrix.case.errors, direct, proxied, strict=True):
        what = f"{case.call.name} ({case.why})"
        # the per-run tag in a message (a missing entity's name) is the one difference allowed
        own_words = core_message(seen_direct.texts).replace(direct_tag, tag)
        assert own_words, f"{what}: no server message directly: {seen_direct}"
        if not reply.ok:
            problems.append(f"{what}: the client threw: {reply.error}")
            continue
        result = reply.result or {}
        if result.get("isError") is not True:
            problems.append(f"{what}: not an isError result: {result}")
        if own_words not in reply.texts:
            problems.append(f"{what}: the server's message {own_words!r} is not readable in {reply.texts[:600]!r}")
        structured = result.get("structuredContent")
        if reply.output_schema is not None and structured is not None:
            # The TS SDK checks this itself (and throws); the Python client is checked here.
            try:
                jsonschema.validate(structured, reply.output_schema)
            except jsonschema.ValidationError as exc:
                problems.append(f"{what}: structuredContent violates the tool's output schema: {exc.message}")
        report = reply.report
        if report is None:
            problems.append(f"{what}: no report in _meta: {sorted(result.get('_meta') or {})}")
            continue
        if report.get("errorCategory") != case.category:
            problems.append(
                f"{what}: category {report.get('errorCategory')!r} (classification {report.get('classification')}),"
                f" the table says {case.category!r}"
            )
        if report.get("outcomeUnknown"):
            problems.append(f"{what}: reported as outcome unknown")
    assert not problems, "\n".join(problems)
