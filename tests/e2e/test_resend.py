"""A call re-sent after its answer was lost never runs twice.

Real processes: the proxy (HTTP in) in front of the scripted SDK server over stdio, whose `charge`
tool (state-changing, no annotations) journals its effect first, then waits; raw HTTP clients of
both eras, whose connection is closed mid-call the way a client's read timeout or a network drop
closes it. The journal shows every execution; the admin port's /status.json what the proxy holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import lxml.html
import pytest
from jsonschema import Draft202012Validator

from tests.e2e.test_status_page import browse
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
MODERN = "2026-07-28"
LEGACY = "2025-11-25"
RESEND = "io.mcp-recovery-proxy/resend"
BOUND_S = 60.0
POLICIES = {
    "charge.yaml": "tools: [charge]\nside_effect: state_changing\nattempts: 2\ndeadline: 40s\nattempt_timeout: 30s\n",
    "hang.yaml": "tools: [hang]\nside_effect: read_only\nattempts: 1\ndeadline: 40s\nattempt_timeout: 30s\n",
}
# the same tool, under another name's policy: the proxy places an idempotency key upstream
KEYED_POLICY = "idempotency_key:\n  location: argument\n  name: idempotency_key\n"
KEY = "io.mcp-recovery-proxy/idempotencyKey"
BASE_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def modern(id_: int, name: str, arguments: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    body = {
        "jsonrpc": "2.0",
        "id": id_,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta},
    }
    headers = {**BASE_HEADERS, "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": name}
    return headers, body


def legacy(id_: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def answer_of(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    """The JSON-RPC answer of a POST, whether it came as JSON or as an event stream."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    for line in response.text.splitlines():
        if line.startswith("data: ") and '"id"' in line:
            message = json.loads(line[6:])
            if "result" in message or "error" in message:
                return message
    raise AssertionError(response.text[:500])


async def open_session(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "resend", "version": "1"}},
    }
    opened = await http.post(url, json=init, headers=BASE_HEADERS)
    assert opened.status_code == 200, opened.text[:300]
    headers = {**BASE_HEADERS, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": LEGACY}
    done = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert done.status_code == 202
    return headers


async def status(proxy: ProxyProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5.0) as admin:
        doc = (await admin.get(proxy.admin + "/status.json")).json()
    resends = doc["resends"]
    assert isinstance(resends, dict)
    return resends


async def until_listed(proxy: ProxyProcess, key: str, n: int = 1) -> None:
    """Until the proxy has seen the dropped call's client go (its flight is listed)."""
    with anyio.fail_after(10):
        # another process's state: nothing to wait on but polling its admin port
        while (await status(proxy))[key] < n:  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def drop_mid_call(
    url: str, headers: dict[str, str], body: dict[str, Any], journal: Journal, tool: str, call: str
) -> None:
    """POST `body` on a connection of its own and close that connection once the tool's
    execution has begun (its `started` line is in the journal): no answer is read."""
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        async with anyio.create_task_group() as tg:

            async def post() -> None:
                await http.post(url, headers=headers, json=body)

            tg.start_soon(post)
            await journal.await_for(lambda j: j.events(tool=tool, event="started", call=call), timeout_s=20)
            tg.cancel_scope.cancel()


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    policies = tmp_path / "policies"
    policies.mkdir()
    for name, text in POLICIES.items():
        (policies / name).write_text(text)
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, tmp_path / "state.json"),
        extra=["--policies", str(policies)],
        log_path=tmp_path / "proxy.log",
    )
    with proxy:
        yield proxy, journal


async def test_a_2026_call_whose_stream_was_cut_is_answered_once_to_its_reissue(rig: Any, tmp_path: Path) -> None:
    proxy, journal = rig
    arguments = {"account": "a-1", "amount": 5, "then": "hang", "hang_s": 1.5, "call_id": "m1"}
    headers, body = modern(1, "charge", arguments)
    with anyio.fail_after(BOUND_S):
        await drop_mid_call(proxy.url, headers, body, journal, "charge", "m1")
        await until_listed(proxy, "running")
        # the client re-issues the request with a new id, as the 2026 revision requires
        _, again = modern(2, "charge", arguments)
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            answer = answer_of(await http.post(proxy.url, headers=headers, json=again))
    assert answer["id"] == 2
    result = answer["result"]
    assert result.get("isError") is not True, result
    assert result["structuredContent"]["charged"] is True
    assert result["_meta"][RESEND] == {"attached": True}
    assert journal.executions("charge", "m1") == 1
    assert len(journal.effects("charge", "m1")) == 1
    assert not journal.events(tool="charge", event="cancelled", call="m1")  # ran to its end
    assert (await status(proxy))["attached"] == 1
    # the operator's status page counts it (headless Chromium renders the page)
    page = await anyio.to_thread.run_sync(browse, proxy.admin + "/", tmp_path / "profile")
    cells = [td.text_content() for td in lxml.html.fromstring(page).xpath('//table[@id="resends"]/tbody/tr/td')]
    assert cells == ["0", "0", "0", "1", "300 s"], cells


async def test_an_answer_kept_after_its_call_ended_goes_to_the_reissue_and_only_once(rig: Any) -> None:
    proxy, journal = rig
    arguments = {"account": "a-2", "amount": 7, "then": "hang", "hang_s": 0.5, "call_id": "m2"}
    headers, body = modern(1, "charge", arguments)
    with anyio.fail_after(BOUND_S):
        await drop_mid_call(proxy.url, headers, body, journal, "charge", "m2")
        await journal.await_for(lambda j: j.events(tool="charge", event="completed", call="m2"), timeout_s=20)
        await until_listed(proxy, "kept")
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            _, again = modern(9, "charge", arguments)
            first = answer_of(await http.post(proxy.url, headers=headers, json=again))
            # delivered now: a deliberate repeat is a new call, and runs
            _, repeat = modern(10, "charge", arguments)
            second = answer_of(await http.post(proxy.url, headers=headers, json=repeat))
    assert first["result"]["_meta"][RESEND] == {"attached": True}
    assert RESEND not in (second["result"].get("_meta") or {})
    assert journal.executions("charge", "m2") == 2
    assert (await status(proxy))["kept"] == 0


async def test_a_2025_call_dropped_mid_way_is_answered_once_on_a_new_connection_and_on_a_new_session(
    rig: Any,
) -> None:
    proxy, journal = rig
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        with anyio.fail_after(BOUND_S):
            session = await open_session(http, proxy.url)
            arguments = {"account": "a-3", "amount": 1, "then": "hang", "hang_s": 1.5, "call_id": "l1"}
            await drop_mid_call(proxy.url, session, legacy(5, "charge", arguments), journal, "charge", "l1")
            await until_listed(proxy, "running")
            same = answer_of(await http.post(proxy.url, headers=session, json=legacy(6, "charge", arguments)))

            arguments = {"account": "a-4", "amount": 2, "then": "hang", "hang_s": 1.5, "call_id": "l2"}
            await drop_mid_call(proxy.url, session, legacy(7, "charge", arguments), journal, "charge", "l2")
            await until_listed(proxy, "running")
            async with httpx.AsyncClient(timeout=BOUND_S) as fresh:
                other = await open_session(fresh, proxy.url)
                assert other["mcp-session-id"] != session["mcp-session-id"]
                renewed = answer_of(await fresh.post(proxy.url, headers=other, json=legacy(1, "charge", arguments)))
    for answer, call, id_ in ((same, "l1", 6), (renewed, "l2", 1)):
        assert answer["id"] == id_
        assert answer["result"]["structuredContent"]["account"] == ("a-3" if call == "l1" else "a-4")
        assert answer["result"]["_meta"][RESEND] == {"attached": True}
        assert journal.executions("charge", call) == 1


async def test_a_read_only_call_whose_stream_was_cut_is_cancelled_upstream_and_a_reissue_runs_again(
    rig: Any,
) -> None:
    proxy, journal = rig
    arguments = {"seconds": 20, "call_id": "r1"}
    headers, body = modern(1, "hang", arguments)
    with anyio.fail_after(BOUND_S):
        await drop_mid_call(proxy.url, headers, body, journal, "hang", "r1")
        await journal.await_for(lambda j: j.events(tool="hang", event="cancelled", call="r1"), timeout_s=20)
        _, again = modern(2, "hang", {"seconds": 0.1, "call_id": "r1"})
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            answer = answer_of(await http.post(proxy.url, headers=headers, json=again))
    assert RESEND not in (answer["result"].get("_meta") or {})
    assert journal.executions("hang", "r1") == 2
    resends = await status(proxy)
    assert (resends["running"], resends["kept"], resends["attached"]) == (0, 0, 0)


async def test_a_dropped_2025_call_its_client_then_cancelled_is_not_taken_by_a_later_identical_call(
    rig: Any,
) -> None:
    proxy, journal = rig
    arguments = {"account": "a-5", "amount": 3, "then": "hang", "hang_s": 2, "call_id": "x1"}
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        with anyio.fail_after(BOUND_S):
            session = await open_session(http, proxy.url)
            await drop_mid_call(proxy.url, session, legacy(11, "charge", arguments), journal, "charge", "x1")
            await until_listed(proxy, "running")
            # an explicit cancellation is not a lost answer: the execution stops, nothing is kept
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 11}}
            assert (await http.post(proxy.url, headers=session, json=cancel)).status_code == 202
            await journal.await_for(lambda j: j.events(tool="charge", event="cancelled", call="x1"), timeout_s=20)
            answer = answer_of(await http.post(proxy.url, headers=session, json=legacy(12, "charge", arguments)))
    assert RESEND not in (answer["result"].get("_meta") or {})
    assert journal.executions("charge", "x1") == 2
    resends = await status(proxy)
    assert (resends["running"], resends["kept"]) == (0, 0)


async def test_a_callers_idempotency_key_answers_a_repeat_even_after_delivery_and_refuses_other_arguments(
    rig: Any,
) -> None:
    proxy, journal = rig
    arguments = {"account": "k-1", "amount": 4, "call_id": "k1"}
    headers, body = modern(1, "charge", arguments)
    body["params"]["_meta"][KEY] = "order-17"
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        with anyio.fail_after(BOUND_S):
            first = answer_of(await http.post(proxy.url, headers=headers, json=body))
            again = {**body, "id": 2}
            repeat = answer_of(await http.post(proxy.url, headers=headers, json=again))
            other = {**body, "id": 3, "params": {**body["params"], "arguments": {**arguments, "amount": 5}}}
            # invalid params: HTTP 400 in the 2026 revision's table
            refused = answer_of(await http.post(proxy.url, headers=headers, json=other), 400)
            fresh = {**body, "id": 4, "params": {**body["params"], "_meta": {**body["params"]["_meta"], KEY: "o-18"}}}
            new_key = answer_of(await http.post(proxy.url, headers=headers, json=fresh))
    assert RESEND not in (first["result"].get("_meta") or {})
    assert repeat["id"] == 2 and repeat["result"]["_meta"][RESEND] == {"attached": True}
    assert repeat["result"]["structuredContent"] == first["result"]["structuredContent"]
    assert refused["error"]["code"] == -32602 and "other arguments" in refused["error"]["message"]
    assert RESEND not in (new_key["result"].get("_meta") or {})
    assert journal.executions("charge", "k1") == 2  # the first call and the one with a new key


async def test_the_callers_key_is_the_key_the_policy_places_upstream(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "charge.yaml").write_text(POLICIES["charge.yaml"] + KEYED_POLICY)
    journal = Journal(tmp_path / "journal.jsonl")
    upstream = scripted_stdio_command(journal.path, tmp_path / "state.json")
    with ProxyProcess(upstream=upstream, extra=["--policies", str(policies)], log_path=tmp_path / "p.log") as proxy:
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            with anyio.fail_after(BOUND_S):
                session = await open_session(http, proxy.url)
                keyed = legacy(1, "charge", {"account": "p-1", "amount": 1, "call_id": "p1"})
                keyed["params"]["_meta"] = {KEY: "charge-p-1"}
                unkeyed = legacy(2, "charge", {"account": "p-2", "amount": 1, "call_id": "p2"})
                for call in (keyed, unkeyed):
                    answer = answer_of(await http.post(proxy.url, headers=session, json=call))
                    assert answer["result"].get("isError") is not True, answer
    ((placed,), (generated,)) = journal.effects("charge", "p1"), journal.effects("charge", "p2")
    assert placed["idempotency_key"] == "charge-p-1"
    assert generated["idempotency_key"] not in (None, "charge-p-1")  # the proxy's own, per call


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_over_stdio_a_keyed_repeat_is_answered_by_the_first_execution_and_never_waits_for_ever(
    tmp_path: Path, mode: str
) -> None:
    """`--listen stdio`: the client's pipe is its delivery, so a call with the caller's key is
    answered and kept as it is written, and the repeat takes that answer (one effect), at once."""
    from mcp import Client, StdioServerParameters

    from tests.fixtures.helpers import PYTHON, REPO_ROOT

    policies = tmp_path / "policies"
    policies.mkdir()
    for name, text in POLICIES.items():
        (policies / name).write_text(text)
    journal = tmp_path / "journal.jsonl"
    upstream = scripted_stdio_command(journal, tmp_path / "state.json")
    argv = ["-m", "proxy", "serve", "--listen", "stdio", "--policies", str(policies), "--", *upstream]
    params = StdioServerParameters(command=PYTHON, args=argv, cwd=str(REPO_ROOT))
    arguments = {"account": "s-1", "amount": 3, "call_id": f"stdio-key-{mode}"}
    with anyio.fail_after(BOUND_S):
        async with Client(params, mode=mode) as client:
            first = await client.call_tool("charge", arguments, meta={KEY: f"stdio-order-{mode}"})
            repeat = await client.call_tool("charge", arguments, meta={KEY: f"stdio-order-{mode}"})
    assert not first.is_error and not repeat.is_error
    assert repeat.meta is not None and repeat.meta[RESEND] == {"attached": True}
    assert repeat.structured_content == first.structured_content
    assert Journal(journal).executions("charge", f"stdio-key-{mode}") == 1


UNRESOLVED = "io.mcp-recovery-proxy/unresolved"
DEADLINE = "io.mcp-recovery-proxy/deadlineMs"
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "proxy/schemas/unresolved-result.schema.json").read_text())


@pytest.mark.parametrize("era", [MODERN, LEGACY])
async def test_a_re_send_keeps_its_own_deadline_and_the_execution_goes_on_for_the_next_one(rig: Any, era: str) -> None:
    """A re-send that carries a deadline shorter than the execution it repeats is answered
    `still_running` at its deadline (nothing runs for it); that answer is not the execution's,
    so the next re-send still gets the execution's own answer, and the tool ran once."""
    proxy, journal = rig
    call = f"d-{era}"
    arguments = {"account": "a-6", "amount": 4, "then": "hang", "hang_s": 4, "call_id": call}
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        with anyio.fail_after(BOUND_S):
            if era == MODERN:
                headers, body = modern(1, "charge", arguments)
                _, short = modern(2, "charge", arguments)
                _, again = modern(3, "charge", arguments)
            else:
                headers = await open_session(http, proxy.url)
                body, short, again = (legacy(n, "charge", arguments) for n in (1, 2, 3))
            short["params"]["_meta"] = {**short["params"].get("_meta", {}), DEADLINE: 1000}
            await drop_mid_call(proxy.url, headers, body, journal, "charge", call)
            await until_listed(proxy, "running")
            cut = answer_of(await http.post(proxy.url, headers=headers, json=short))
            # answered before the execution ended: by its own deadline, not by the execution
            assert not journal.events(tool="charge", event="completed", call=call)
            final = answer_of(await http.post(proxy.url, headers=headers, json=again))
    assert cut["id"] == 2
    result = cut["result"]
    assert result["isError"] is True
    report = result["_meta"][UNRESOLVED]
    Draft202012Validator(SCHEMA).validate(report)
    assert report["stopReason"] == "still_running"
    assert (report["attemptCount"], report["deadlineMs"], report["outcomeUnknown"]) == (0, 1000, True)
    assert [a["action"] for a in report["suggestedActions"]] == ["resend"]
    assert "was not run again" in result["content"][-1]["text"]
    assert final["id"] == 3
    assert final["result"].get("isError") is not True, final
    assert final["result"]["structuredContent"]["charged"] is True
    assert final["result"]["_meta"][RESEND] == {"attached": True}
    assert journal.executions("charge", call) == 1
    assert len(journal.effects("charge", call)) == 1
