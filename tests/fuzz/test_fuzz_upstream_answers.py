"""What an upstream writes, fuzzed into the relay: a real stdio upstream (tests/fuzz/mirror_upstream.py
over real pipes) writes arbitrary lines during a caller's `tools/call`, then a valid result.

The lines: raw bytes, JSON values, JSON-RPC-shaped objects, answers to the caller's own request id
with results and errors of any shape, progress and log notifications with arbitrary tokens and
data, server-to-client requests with arbitrary ids.

Properties, for both eras: the caller gets exactly one valid JSON-RPC answer with its own id (no 5xx),
nothing is logged as an error or with a traceback, no hang, and the link still serves the next call.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonrpc
from tests.fixtures.helpers import PYTHON
from tests.fuzz.rig import Rig, modern_call, proxy_rig
from tests.fuzz.strategies import IDS, JSON, jsonrpc_shaped

pytestmark = pytest.mark.slow

MIRROR = Path(__file__).resolve().with_name("mirror_upstream.py")
_PLACEHOLDER = "@ID@"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("upstream-fuzz")
    policies = tmp / "policies"
    policies.mkdir()
    # One attempt: an upstream error a line makes up is reported, not retried with backoff.
    (policies / "mirror.yaml").write_text("tools: [mirror]\nattempts: 1\n")
    with proxy_rig(tmp, argv=[PYTHON, str(MIRROR)], policies=policies) as rig:
        yield rig


def _with_own_id(message: dict[str, Any]) -> bytes:
    """Dump a message whose id is the caller's own (the mirror fills it in)."""
    return jsonrpc.dumps({**message, "id": _PLACEHOLDER}).replace(b'"@ID@"', b"@ID@")


_ANY_ID = st.one_of(IDS, st.just(_PLACEHOLDER))
_UPSTREAM_LINES = st.one_of(
    st.binary(max_size=80).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" ")),
    JSON.map(jsonrpc.dumps),
    jsonrpc_shaped(st.sampled_from(["notifications/progress", "notifications/message", "sampling/createMessage"])).map(
        jsonrpc.dumps
    ),
    # An answer to the caller's own request, of any shape.
    st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0")}, optional={"result": JSON, "error": JSON | st.just({"code": -32000})}
    ).map(_with_own_id),
    # Notifications a tool call really produces, with arbitrary contents.
    st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": st.just("notifications/progress")},
        optional={"params": st.fixed_dictionaries({}, optional={"progressToken": _ANY_ID, "progress": JSON})},
    ).map(jsonrpc.dumps),
    st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "method": st.just("notifications/message"), "params": JSON}).map(
        jsonrpc.dumps
    ),
    # A server-to-client request with an arbitrary id (the mirror never waits for its answer).
    st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "id": IDS, "method": st.sampled_from(["sampling/createMessage", "roots/list"])},
        optional={"params": JSON},
    ).map(jsonrpc.dumps),
)


def _call(rig: Rig, era: str, id_: Any, arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    if era == "legacy":
        params = {"name": "mirror", "arguments": arguments}
        return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}, rig.legacy_headers()
    return modern_call(id_, "tools/call", {"name": "mirror", "arguments": arguments})


@settings(deadline=None)  # each example is bounded by Rig.run: a wall-clock deadline would flake on a busy machine
@given(lines=st.lists(_UPSTREAM_LINES, max_size=6), era=st.sampled_from(["legacy", "modern"]))
def test_any_upstream_output_during_a_call_ends_in_one_answer_to_the_caller(
    rig: Rig, lines: list[bytes], era: str
) -> None:
    emit = [base64.b64encode(line).decode() for line in lines]
    message, headers = _call(rig, era, 41, {"emit": emit})
    body = jsonrpc.dumps(message)
    response = rig.run(rig.post(None, headers, raw=body))
    problems = rig.logs.take()
    assert not problems, problems
    assert response.status < 500, response
    messages = response.messages()
    # What the upstream sent besides the answer is relayed as it came (an upstream's malformed
    # notification is its own); each is still one JSON object.
    assert all(isinstance(m, dict) for m in messages), messages
    answers = [m for m in messages if jsonrpc.is_response(m) and m.get("id") == 41]
    assert len(answers) == 1, messages
    answer = answers[0]
    assert jsonrpc.validate(answer) is None, answer
    assert isinstance(answer.get("result"), dict) or isinstance(answer.get("error"), dict), answer
    # The link is still usable: a plain call right after is answered with the mirror's result.
    message, headers = _call(rig, era, 42, {})
    after = rig.run(rig.post(None, headers, raw=jsonrpc.dumps(message)))
    assert not rig.logs.take()
    (answer,) = [m for m in after.messages() if jsonrpc.is_response(m)]
    assert answer["id"] == 42 and answer["result"]["isError"] is False, answer
