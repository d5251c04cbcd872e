"""`policies suggest` against a live proxy: the real proxy in front of a real SDK server (a slow
tool, a tool failing with a text nothing classifies, a tool no policy names), calls through a
real SDK client, then the command against the proxy's admin port. Its patch applies with
`patch -p1` inside the folder, the folder passes `policies check`, the suggestion names the tool
and the value, and once the proxy has reloaded the folder the next failure is classified by the
suggested rule. The status page shows the same advice (in Chromium, where it is installed)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from lxml import html as lxml_html
from mcp import Client

from proxy.policy.render import format_duration
from tests.e2e.test_status_page import browse, chromium
from tests.fixtures.forkserver import python_argv
from tests.fixtures.helpers import PYTHON, REPO_ROOT
from tests.proxy_process import ProxyProcess

pytestmark = pytest.mark.slow

SERVER = REPO_ROOT / "tests" / "fixtures" / "suggest_server.py"
SLOW_S = 0.8  # under its 1 s attempt timeout, within 20% of it
ORDER = "order-canary-73QX"  # an argument the upstream echoes in its error text
FILES = {
    "slow_report.yaml": "tools: [slow_report]\nattempt_timeout: 1s\n",
    "frobnicate.yaml": "tools: [frobnicate]\n",
}
COMMAND_BOUND_S = 60.0


def _folder(root: Path) -> Path:
    root.mkdir()
    (root / "defaults.yaml").write_text((REPO_ROOT / "policies" / "defaults.yaml").read_text())
    for name, text in FILES.items():
        (root / name).write_text(text)
    return root


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "proxy", "policies", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=COMMAND_BOUND_S,
    )


def _wait_until(predicate: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)
    return value


async def _traffic(url: str) -> None:
    with anyio.fail_after(60):
        async with Client(url, mode="legacy") as client:
            await client.list_tools()
            for _ in range(5):
                assert not (await client.call_tool("slow_report", {"seconds": SLOW_S})).is_error
            for _ in range(3):
                failed = await client.call_tool("frobnicate", {"order": ORDER})
                assert failed.is_error and failed.structured_content["classification"]["defaulted"] is True
            assert not (await client.call_tool("plain", {})).is_error


async def _frobnicate(url: str) -> Any:
    with anyio.fail_after(30):
        async with Client(url, mode="legacy") as client:
            await client.list_tools()
            return await client.call_tool("frobnicate", {"order": "another-order"})


def test_suggest_against_a_live_proxy_gives_a_patch_that_applies_and_classifies_the_next_failure(
    tmp_path: Path,
) -> None:
    folder = _folder(tmp_path / "policies")
    extra = ["--policies", str(folder)]
    with ProxyProcess(upstream=python_argv(SERVER), extra=extra, log_path=tmp_path / "proxy.log") as proxy:
        anyio.run(_traffic, proxy.url)

        # The status page carries the same advice.
        status = httpx.get(proxy.admin + "/status.json", timeout=5).json()
        (shown,) = [t for t in status["observed"]["advice"]["tools"] if t["tool"] == "frobnicate"]
        assert shown["unclassified"] == 3 and len(shown["rules"]) == 1
        if chromium() is not None:  # and as a person sees it (the browser: tests/e2e/test_status_page.py)
            dom = lxml_html.fromstring(browse(proxy.admin + "/", tmp_path / "profile"))
            rows = {
                " ".join(tr.xpath("./td[1]")[0].text_content().split()): " ".join(tr.text_content().split())
                for tr in dom.xpath('//table[@id="observed"]/tbody/tr[@class="observed-tool"]')
            }
            assert "3 unclassified errors seen — suggested rule" in rows["frobnicate"], rows
            assert "attempt_timeout 1s → " in rows["slow_report"] and "no policy file names it" in rows["plain"]
            (shown_rule,) = dom.xpath('//table[@id="observed"]//pre[@class="rule"]')
            assert f"- name: {shown['rules'][0]['name']}" in shown_rule.text_content()

        found = _cli("suggest", str(folder), "--admin", proxy.admin, "--json")
        assert found.returncode == 0, found.stderr
        assert ORDER not in found.stdout, "the observed texts are redacted of argument values"
        advice = json.loads(found.stdout)
        slow = next(t for t in advice["tools"] if t["tool"] == "slow_report")
        (timer,) = slow["timers"]
        assert timer["setting"] == "attempt_timeout" and timer["current_s"] == 1.0
        assert slow["successes"] == 5 and slow["slowest_ms"] >= SLOW_S * 1000
        assert timer["suggested_s"] > slow["p99_ms"] / 1000 and timer["suggested_s"] > 1.0
        frob = next(t for t in advice["tools"] if t["tool"] == "frobnicate")
        (rule,) = frob["rules"]
        assert rule["count"] == 3 and "the frobnicator sulks about order [argument]" in rule["sample"]
        assert advice["unnamed"] == ["plain"]

        printed = _cli("suggest", str(folder), "--admin", proxy.admin)
        assert printed.returncode == 0, printed.stderr
        assert printed.stdout == advice["patch"]
        assert f"+attempt_timeout: {format_duration(timer['suggested_s'])}  # slow_report:" in printed.stdout
        assert "slow_report: attempt_timeout 1s -> " in printed.stderr

        version = httpx.get(proxy.admin + "/policies", timeout=5).json()["version"]
        applied = subprocess.run(
            ["patch", "-p1"], cwd=folder, input=printed.stdout, capture_output=True, text=True, timeout=COMMAND_BOUND_S
        )
        assert applied.returncode == 0, applied.stdout + applied.stderr
        checked = _cli("check", str(folder))
        assert checked.returncode == 0 and checked.stdout.startswith("OK "), checked.stderr
        assert (folder / "plain.yaml").is_file()

        # The proxy reloads the patched folder; the next failure is classified by the rule.
        _wait_until(lambda: httpx.get(proxy.admin + "/policies", timeout=5).json()["version"] != version)
        failed = anyio.run(_frobnicate, proxy.url)
        classification = failed.structured_content["classification"]
        assert classification == {"source": "rule", "code": None, "rule": rule["name"], "defaulted": False}
        assert failed.structured_content["errorCategory"] == rule["category"]
