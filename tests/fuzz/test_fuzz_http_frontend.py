"""The Streamable HTTP frontend under arbitrary bodies and request heads (in-process, through the
ASGI app, in front of a real stdio upstream: the scripted SDK server over real pipes).

Properties, for every example:
- no 5xx and no error or traceback in the log (the upstream is healthy, so nothing a caller sends
  justifies one);
- every JSON answer is a JSON-RPC message; a 4xx on POST carries a JSON-RPC error; a request with a
  valid id that reaches the relay gets its own id back;
- no hang: each example is bounded (`Rig.run`).
- Valid input is still answered: an `echo` of any text comes back as that text, in both eras.

Findings of the fuzzers, fixed by the Host/Origin parser and the JSON depth bound, are pinned by the
tests at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonrpc
from tests.fuzz.rig import Response, Rig, modern_call, proxy_rig
from tests.fuzz.strategies import JSON, client_requests, jsonrpc_shaped, modern_request

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with proxy_rig(tmp_path_factory.mktemp("http-fuzz")) as rig:
        yield rig


def _sent_request_id(body: bytes) -> Any:
    """The id the caller may expect back: that of a valid JSON-RPC request, else a marker."""
    try:
        message = jsonrpc.loads(body)
    except ValueError:
        return _NONE
    if jsonrpc.validate(message) is None and jsonrpc.is_request(message):
        return message["id"]
    return _NONE


_NONE = object()


def check(rig: Rig, response: Response, body: bytes) -> None:
    problems = rig.logs.take()
    assert not problems, problems
    assert response.status < 500, (response, body[:300])
    messages = response.messages()
    for message in messages:
        assert jsonrpc.validate(message) is None, message
    if 400 <= response.status < 500 and response.content_type.startswith("application/json"):
        (message,) = messages
        assert isinstance(message["error"].get("code"), int), message
        assert isinstance(message["error"].get("message"), str), message
    if response.status == 202:
        assert response.body == b"", response
    expected = _sent_request_id(body)
    answers = [m for m in messages if jsonrpc.is_response(m)]
    if expected is not _NONE and answers and answers[-1]["id"] is not None:
        # A rejection before the body is read (Content-Type, Accept, Host) may answer id null.
        assert answers[-1]["id"] == expected, (answers, body[:300])


_BODIES = st.one_of(
    st.binary(max_size=200),
    JSON.map(jsonrpc.dumps),
    jsonrpc_shaped().map(jsonrpc.dumps),
    client_requests().map(jsonrpc.dumps),
)


@settings(deadline=None)  # each example is bounded by Rig.run: a wall-clock deadline would flake on a busy machine
@given(body=_BODIES, era=st.sampled_from(["legacy", "no-session", "modern-headers"]))
def test_post_bodies_get_a_clear_answer(rig: Rig, body: bytes, era: str) -> None:
    if era == "legacy":
        headers = rig.legacy_headers()
    elif era == "modern-headers":
        headers = {"mcp-protocol-version": "2026-07-28"}
    else:
        headers = {}
    response = rig.run(rig.post(None, headers, raw=body))
    check(rig, response, body)
    if era == "legacy" and _sent_request_id(body) is not _NONE:
        # A valid request in a live session is relayed and answered (errors are JSON-RPC errors).
        assert response.status == 200, (response, body[:300])


@settings(deadline=None)  # each example is bounded by Rig.run: a wall-clock deadline would flake on a busy machine
@given(case=modern_request(names=st.sampled_from(["echo", "no_such_tool", "rpc_error"]) | st.text(max_size=6)))
def test_modern_requests_with_any_routing_headers_get_a_clear_answer(
    rig: Rig, case: tuple[dict[str, Any], dict[str, str]]
) -> None:
    message, headers = case
    body = jsonrpc.dumps(message)
    response = rig.run(rig.post(None, headers, raw=body))
    check(rig, response, body)
    assert response.messages(), response  # a 2026 request always gets a JSON-RPC answer


_HEADER_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=40)


def _header(draw: st.DrawFn, valid: list[str]) -> str | None:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return None
    if choice == 1:
        return draw(_HEADER_VALUE)
    return draw(st.sampled_from(valid))


@st.composite
def heads(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "DELETE", "PUT", "OPTIONS"]))
    candidates = {
        "host": ["127.0.0.1:8080", "localhost:8080", "127.0.0.1", "evil.example", "127.0.0.1.evil:8080"],
        "origin": ["http://127.0.0.1:8080", "http://localhost", "https://evil.example", "null"],
        "accept": ["application/json, text/event-stream", "text/event-stream", "application/json", "*/*", "text/html"],
        "content-type": ["application/json", "application/json; charset=utf-8", "text/plain", ""],
        "mcp-session-id": ["SESSION", "nope", ""],
        "mcp-protocol-version": ["2025-11-25", "2025-06-18", "2026-07-28", "1999-01-01", ""],
        "last-event-id": ["r1:0", "r99999:1", ":", "x:y:z", "r1:-1"],
    }
    headers: dict[str, str] = {}
    for name, valid in candidates.items():
        value = _header(draw, valid)
        if value is not None:
            headers[name] = value
    return method, headers


@settings(deadline=None)  # each example is bounded by Rig.run: a wall-clock deadline would flake on a busy machine
@given(head=heads())
def test_request_heads_with_any_values_get_a_clear_answer(rig: Rig, head: tuple[str, dict[str, str]]) -> None:
    method, headers = head
    if headers.get("mcp-session-id") == "SESSION":
        if method == "DELETE":
            headers["mcp-session-id"] = "not-the-fixture-session"  # keep the shared session alive
        else:
            headers["mcp-session-id"] = rig.session_id
    body = jsonrpc.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}) if method == "POST" else b""
    raw = [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]
    response = rig.run(rig.request(method, raw, body))
    check(rig, response, body)
    host = headers.get("host")
    if host in ("evil.example", "127.0.0.1.evil:8080") or host is None:
        assert response.status == 421, response
    plain = (
        method == "POST"
        and host in ("127.0.0.1:8080", "localhost:8080", "127.0.0.1")
        and headers.get("origin", "http://localhost") in ("http://127.0.0.1:8080", "http://localhost")
        and headers.get("content-type", "").startswith("application/json")
        and any(a in headers.get("accept", "*/*") for a in ("application/json", "text/event-stream", "*/*"))
        and headers.get("mcp-session-id") == rig.session_id
        and headers.get("mcp-protocol-version", "2025-11-25") in jsonrpc.LEGACY_VERSIONS
    )
    if plain:
        assert response.status == 200 and response.messages()[0].get("result") == {}, response


@settings(deadline=None)  # each example is bounded by Rig.run: a wall-clock deadline would flake on a busy machine
@given(text=st.text(max_size=200), era=st.sampled_from(["legacy", "modern"]), id_=st.integers(0, 2**31) | st.text())
def test_valid_calls_are_still_answered(rig: Rig, text: str, era: str, id_: Any) -> None:
    if era == "legacy":
        message: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": id_,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": text}},
        }
        headers = rig.legacy_headers()
    else:
        message, headers = modern_call(id_, "tools/call", {"name": "echo", "arguments": {"text": text}})
    body = jsonrpc.dumps(message)
    response = rig.run(rig.post(None, headers, raw=body))
    check(rig, response, body)
    (answer,) = [m for m in response.messages() if jsonrpc.is_response(m)]
    assert answer["id"] == id_
    assert answer["result"]["content"][0]["text"] == text, answer


# ------------------------------------------ findings pinned: Host/Origin matching, JSON nesting depth


def _ping_with(rig: Rig, **headers: str) -> Response:
    return rig.run(rig.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, {**rig.legacy_headers(), **headers}))


def test_an_ipv6_loopback_host_with_a_port_is_accepted(rig: Rig) -> None:
    """`[::1]` in the allow-list is a host, not a character class (read as a glob,
    a normal IPv6 request got 421). Minimal input: `Host: [::1]:8080`."""
    response = _ping_with(rig, host="[::1]:8080")
    rig.logs.take()
    assert response.status == 200, response


@pytest.mark.parametrize(
    ("header", "value", "status"),
    [("host", "1:80", 421), ("origin", "http://127.0.0.1:1@evil.com", 403)],
)
def test_lookalike_hosts_and_origins_are_refused(rig: Rig, header: str, value: str, status: int) -> None:
    """Glob patterns would accept `Host: 1:80` (via `[::1]:*`) and an Origin whose
    real host, after userinfo, is evil.com: both are refused."""
    response = _ping_with(rig, **{header: value})
    rig.logs.take()
    assert response.status == status, response


def test_a_duplicate_host_header_is_refused(rig: Rig) -> None:
    """Two Host headers are refused: otherwise the last one would win silently."""
    headers = [
        (b"host", b"evil.example"),
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json"),
        (b"mcp-session-id", rig.session_id.encode()),
    ]
    response = rig.run(rig.request("POST", headers, b'{"jsonrpc":"2.0","id":1,"method":"ping"}'))
    rig.logs.take()
    assert 400 <= response.status < 500, response


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_deep_json_is_a_client_error_not_a_500(rig: Rig, era: str) -> None:
    """Arguments nested 300 deep parse (orjson reads 1024 levels) but cannot be
    written upstream (orjson writes 255): without a depth bound, a 500 and a traceback per
    request. Minimal input: a tools/call whose arguments hold `{"a": ` 300 times."""
    deep = '{"a":' * 300 + "1" + "}" * 300
    if era == "legacy":
        message: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "x", "deep": "@"}},
        }
        headers = rig.legacy_headers()
    else:
        message, headers = modern_call(5, "tools/call", {"name": "echo", "arguments": {"text": "x", "deep": "@"}})
    body = json.dumps(message).replace('"@"', deep).encode()
    response = rig.run(rig.post(None, headers, raw=body))
    problems = rig.logs.take()
    assert response.status < 500 and not problems, (response, problems)


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_regression_array_params_are_refused_not_left_unanswered(rig: Rig, era: str) -> None:
    """Found by the body property above: `"params": []` (JSON-RPC by-position params, which MCP
    does not have) was relayed; the SDK upstream drops such a message unanswered, and the caller's
    request hung (a tools/call would time out; a ping never)."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 3, "method": "ping", "params": []}
    if era == "legacy":
        headers = rig.legacy_headers()
    else:
        headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "ping"}
    body = jsonrpc.dumps(message)
    response = rig.run(rig.post(None, headers, raw=body), timeout_s=5)
    check(rig, response, body)
    assert response.status == 400, response
    (answer,) = response.messages()
    assert answer["id"] == 3 and answer["error"]["code"] == jsonrpc.INVALID_REQUEST, answer
