"""The status page at `/` on the admin port, read in a real browser.

The real proxy process runs in front of the bundled flaky demo server (proxy/demo/server.py) with
policies that give every outcome an operator must see: a call recovered by retries, one left
unresolved that spends its budget (a ledger entry) and opens the tool's circuit, one refused by
that open circuit, and a state-changing call whose outcome is unknown. Real MCP SDK clients make
the calls over Streamable HTTP; Debian's headless Chromium then loads the page (behind the admin
token, which a browser sends as Basic credentials), its script runs and fetches `/status.json`,
and the test reads the DOM it left: what a person would see. No argument value and no token may
appear anywhere in it (canaries).

Chromium missing: skipped, unless MCP_BROWSER_REQUIRED=1 (CI), where that is an error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from lxml import html as lxml_html
from mcp import Client

from tests.fixtures.forkserver import python_argv
from tests.proxy_process import ProxyProcess

pytestmark = pytest.mark.slow

ARG_CANARY = "argcanary-Vb93k"  # in every argument of every call
TOKEN = "admintoken-canary-Hx72q"
BOUND_S = 60.0

POLICIES = {
    # 3 transient failures: the budget is spent (ledger) and the third opens the circuit
    "archive.yaml": (
        "tools: [search_archive]\nattempts: 3\ndeadline: 10s\nattempt_timeout: 2s\n"
        "backoff: {initial: 10ms, max: 20ms}\n"
        "anti_storm: {breaker_failures: 3, breaker_cooldown: 300s}\n"
    ),
    # state-changing, answered after the attempt timeout: outcome unknown, never repeated
    "refund.yaml": (
        "tools: [refund]\nside_effect: state_changing\nattempts: 2\ndeadline: 6s\nattempt_timeout: 1s\n"
        "report: {status_check_tool: refund_status}\n"
    ),
    "lookup.yaml": "tools: [lookup_customer]\nattempts: 3\nbackoff: {initial: 10ms, max: 20ms}\n",
}


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _require_browser() -> str:
    found = chromium()
    if found is None:
        if os.environ.get("MCP_BROWSER_REQUIRED", "") not in ("", "0", "false", "no"):
            pytest.fail("MCP_BROWSER_REQUIRED is set but chromium is not installed")
        pytest.skip("chromium is not installed (Debian's chromium package)")
    return found


def browse(url: str, profile: Path, *, screenshot: Path | None = None) -> str:
    """The DOM after the page's scripts ran (and polled at least once), as headless Chromium has it."""
    argv = [
        _require_browser(),
        "--headless",
        "--no-sandbox",  # root in CI containers; the page is ours and local
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
        # virtual time: the page's first poll and render happen before the dump; pending
        # fetches pause the clock, so this does not race the proxy
        "--virtual-time-budget=3000",
        "--window-size=1400,1700",
    ]
    argv += [f"--screenshot={screenshot}"] if screenshot is not None else ["--dump-dom"]
    done = subprocess.run([*argv, url], capture_output=True, timeout=BOUND_S, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return done.stdout.decode()


@pytest.fixture
def proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProxyProcess]:
    _require_browser()
    folder = tmp_path / "policies"
    folder.mkdir()
    for name, text in POLICIES.items():
        (folder / name).write_text(text)
    token = tmp_path / "admin-token"
    token.write_text(TOKEN + "\n")
    upstream = python_argv("-m", "proxy.demo.server")
    # the refund answers after its 1 s attempt timeout (outcome unknown), and soon enough not to
    # hold the demo server's exit
    monkeypatch.setenv("DEMO_REFUND_HANG_S", "3")
    proc = ProxyProcess(
        upstream=upstream,
        extra=["--policies", str(folder), "--admin-token-file", str(token)],
        log_path=tmp_path / "proxy.log",
    )
    proc.start(timeout_s=BOUND_S)
    try:
        yield proc
    finally:
        proc.stop()


async def _call(url: str, tool: str, args: dict[str, Any]) -> Any:
    with anyio.fail_after(BOUND_S):
        async with Client(url, mode="legacy") as client:
            await client.list_tools()
            return await client.call_tool(tool, args)


def _rows(dom: Any, table: str) -> list[str]:
    return [" ".join(tr.text_content().split()) for tr in dom.xpath(f'//table[@id="{table}"]/tbody/tr')]


async def _mixed_traffic(url: str) -> str:
    """Recovered, unresolved (budget spent, circuit opened), circuit open, outcome unknown, success;
    returns the exhausted call's budget id."""
    recovered = await _call(url, "lookup_customer", {"customer_id": f"c-{ARG_CANARY}"})
    assert not recovered.is_error
    exhausted = await _call(url, "search_archive", {"query": f"invoices {ARG_CANARY}"})
    report = exhausted.meta["io.mcp-recovery-proxy/unresolved"]
    assert report["stopReason"] == "attempts_exhausted"
    refused = await _call(url, "search_archive", {"query": f"receipts {ARG_CANARY}"})
    assert refused.meta["io.mcp-recovery-proxy/unresolved"]["stopReason"] == "circuit_open"
    unknown = await _call(url, "refund", {"order_id": f"o-{ARG_CANARY}", "amount": 12.5})
    assert unknown.meta["io.mcp-recovery-proxy/unresolved"]["outcomeUnknown"] is True
    assert not (await _call(url, "echo", {"text": ARG_CANARY})).is_error
    return str(report["operation"]["budgetId"])


def test_an_operator_sees_the_unresolved_call_the_open_circuit_and_the_ledger_entry(
    proxy: ProxyProcess, tmp_path: Path
) -> None:
    budget_id = anyio.run(_mixed_traffic, proxy.url)

    # Behind the token: nothing of the page's data without it, for a browser or anyone else.
    bare = browse(proxy.admin + "/", tmp_path / "profile-bare")
    assert "Problem calls" not in bare and "search_archive" not in bare
    assert httpx.get(proxy.admin + "/status.json", timeout=BOUND_S).status_code == 401
    challenge = httpx.get(proxy.admin + "/", timeout=BOUND_S).headers["www-authenticate"]
    assert challenge.startswith("Basic "), "a browser prompts for Basic credentials by itself"

    host = proxy.admin.removeprefix("http://")
    text = browse(f"http://operator:{TOKEN}@{host}/", tmp_path / "profile")
    dom = lxml_html.fromstring(text)
    assert "update failed" not in dom.get_element_by_id("updated").text_content(), text[-2000:]

    problems = _rows(dom, "problems")
    exhausted_row = next(r for r in problems if "search_archive" in r and "attempts_exhausted" in r)
    assert "unresolved" in exhausted_row
    assert any("search_archive" in r and "circuit_open" in r for r in problems)
    assert any("refund" in r and "outcome unknown" in r for r in problems)
    # expandable to the unresolved result, as the caller got it
    shown_reports = [pre.text_content() for pre in dom.xpath('//table[@id="problems"]//pre[@class="report"]')]
    assert any(budget_id in r and "attempts_exhausted" in r for r in shown_reports)

    circuits = _rows(dom, "circuits")
    assert any(r.startswith("search_archive") and "open (" in r for r in circuits), circuits

    ledger = _rows(dom, "ledger")
    (entry,) = [r for r in ledger if budget_id in r]
    assert "attempts_exhausted" in entry and " s" in entry

    recent = _rows(dom, "recent")
    assert any("lookup_customer" in r and "recovered" in r for r in recent)
    assert any(r.startswith(tuple("0123456789")) and "echo" in r and "success" in r for r in recent)
    tools = _rows(dom, "tools")
    assert any(r.startswith("lookup_customer") for r in tools)
    assert dom.xpath('//table[@id="tools"]//*[local-name()="svg"]/*[local-name()="polyline"]'), "sparklines"
    assert dom.get_element_by_id("pol-version").text_content() not in ("", "…", "none")
    assert "up" in dom.get_element_by_id("up-state").text_content()
    options = dom.xpath('//select[@id="explain-tool"]/option/@value')
    assert {"search_archive", "refund", "echo"} <= set(options)

    for where, content in (("page", text), ("status.json", _authorized_json(proxy))):
        assert ARG_CANARY not in content, f"an argument value reached the {where}"
        assert TOKEN not in content, f"the admin token reached the {where}"

    if os.environ.get("MCP_STATUS_SCREENSHOT"):
        shot = Path(os.environ["MCP_STATUS_SCREENSHOT"])
        browse(f"http://operator:{TOKEN}@{host}/", tmp_path / "profile-shot", screenshot=shot)


def _authorized_json(proxy: ProxyProcess) -> str:
    answer = httpx.get(proxy.admin + "/status.json", headers={"authorization": f"Bearer {TOKEN}"}, timeout=BOUND_S)
    assert answer.status_code == 200
    explain = httpx.get(
        proxy.admin + "/status/explain",
        params={"tool": "refund"},
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=BOUND_S,
    )
    assert explain.status_code == 200 and explain.json()["tool"] == "refund"
    assert any(row["setting"] == "side_effect" for row in explain.json()["rows"])
    nobody = httpx.get(
        proxy.admin + "/status/explain",
        params={"tool": "never-listed"},
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=BOUND_S,
    )
    assert nobody.status_code == 404
    return answer.text + explain.text
