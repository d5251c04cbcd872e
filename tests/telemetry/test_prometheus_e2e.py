"""A real Prometheus scrapes the real proxy under traffic; every dashboard query must return data.

The proxy runs in front of the scripted upstream (stdio) with a small policy set; SDK clients make
calls that succeed, recover after failures, exhaust their attempts, end with an unknown outcome, and
crash the upstream child once. Debian's Prometheus scrapes the admin `/metrics` every second and
loads deploy/prometheus/rules.yml. Then:
- every panel query of every dashboard (Grafana variables replaced by fixed values) returns data
  through `/api/v1/query`, with at least one finite value;
- every metric name in the dashboards and rules appears in the real scrape;
- `promtool check metrics` is clean on that scrape;
- every alerting rule evaluates without error on the real series.
Every process is started and stopped by pid; every wait is bounded.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from tests.fixtures.helpers import free_port, terminate
from tests.proxy_process import ProxyProcess, scripted_stdio_command
from tests.telemetry import promql

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        promql.prometheus() is None or promql.promtool() is None,
        reason="prometheus/promtool not found: install Debian's `prometheus` package (apt-get install -y prometheus)",
    ),
    pytest.mark.timeout(180),
]
BOUND_S = 30.0
JOB = "mcp-recovery-proxy"

POLICIES = {
    "defaults.yaml": """
retry_on: [transient]
attempts: 3
deadline: 4s
attempt_timeout: 1s
min_attempt_time: 200ms
backoff: {initial: 20ms, max: 100ms, multiplier: 2, jitter: full}
retry_after_cap: 30s
unclassified: transient
ledger_window: 60s
""",
    "charge.yaml": """
tools: [charge]
attempt_timeout: 500ms
""",
    "always_fail.yaml": """
# a circuit breaker, so mcp_recovery_circuit_open has a series (three failures in a row open it)
tools: [always_fail]
anti_storm: {breaker_failures: 3, breaker_cooldown: 1s}
""",
}


def wait_until(predicate: Any, what: str, timeout_s: float = BOUND_S, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


class Prometheus:
    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "prometheus.yml"
        self.config.write_text(
            f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {promql.RULES}
scrape_configs:
  - job_name: {JOB}
    metrics_path: /metrics
    static_configs:
      - targets: ["{target}"]
"""
        )
        self.data = tmp / "tsdb"
        self.log = tmp / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        binary = promql.prometheus()
        assert binary is not None
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.data}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        try:
            wait_until(
                lambda: self._alive() and httpx.get(self.url + "/-/ready", timeout=1).status_code == 200,
                "prometheus ready",
            )
        except BaseException:
            self.__exit__()
            raise
        return self

    def _alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        return True

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            terminate(self.proc, timeout_s=10)

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def scraped_value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None


def call_id() -> str:
    return uuid.uuid4().hex[:12]


async def traffic(url: str, crash: bool) -> None:
    """Calls that succeed, recover after two failures, exhaust their attempts, end outcome-unknown."""
    with anyio.fail_after(BOUND_S * 2):
        async with Client(url, mode="legacy") as client:
            await client.list_tools()
            for i in range(5):
                result = await client.call_tool("echo", {"text": f"hello {i}"})
                assert not result.is_error
            for _ in range(2):
                result = await client.call_tool(
                    "flaky_read", {"key": uuid.uuid4().hex, "fail_times": 2, "call_id": call_id()}
                )
                assert not result.is_error, result
            result = await client.call_tool("always_fail", {"category": "transient", "retryable": True})
            assert result.is_error
            result = await client.call_tool(
                "charge", {"account": "acct-1", "amount": 1.0, "then": "hang", "hang_s": 2.0}
            )
            assert result.is_error
            if crash:  # the stdio child exits mid-call once; the supervisor restarts it
                await client.call_tool("flaky_read", {"key": uuid.uuid4().hex, "fail_times": 1, "mode": "crash"})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProcess, Prometheus]]:
    tmp = tmp_path_factory.mktemp("prometheus-e2e")
    policies = tmp / "policies"
    policies.mkdir()
    for name, text in POLICIES.items():
        (policies / name).write_text(text)
    command = scripted_stdio_command(tmp / "journal.jsonl", tmp / "state.json")
    proxy = ProxyProcess(upstream=command, extra=["--policies", str(policies)], log_path=tmp / "proxy.log")
    with proxy, Prometheus(tmp, f"127.0.0.1:{proxy.admin_port}") as prom:
        # Warm-up: every series exists before Prometheus first sees it, so rates count the main round.
        anyio.run(traffic, proxy.url, False)
        wait_until(
            lambda: prom.scraped_value(f'sum(mcp_recovery_calls_total{{job="{JOB}"}})'), "a first scrape with calls"
        )
        anyio.run(traffic, proxy.url, True)
        # A refused reload: a policy file that does not parse.
        (policies / "broken.yaml").write_text("tools: [echo]\nattempts: [not, a, number]\n")
        expected = float(_scrape_sum(proxy, "mcp_recovery_calls_total"))
        wait_until(
            lambda: (prom.scraped_value(f'sum(mcp_recovery_calls_total{{job="{JOB}"}})') or 0) >= expected,
            "a scrape after the main round",
        )
        time.sleep(2.5)  # let a few more scrapes land (rates need two samples after the last increment)
        yield proxy, prom


def _scrape(proxy: ProxyProcess) -> str:
    return httpx.get(proxy.admin + "/metrics", timeout=10).text


def _scrape_sum(proxy: ProxyProcess, name: str) -> float:
    total = 0.0
    for line in _scrape(proxy).splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


@pytest.mark.parametrize(("board", "title", "expr"), promql.dashboard_targets(), ids=lambda v: str(v)[:60])
def test_every_dashboard_query_returns_data_from_the_real_scrape(
    stack: tuple[ProxyProcess, Prometheus], board: str, title: str, expr: str
) -> None:
    _, prom = stack
    result = prom.query(promql.substitute(expr))
    assert result, f"{board} / {title}: no data for {promql.substitute(expr)}"
    assert _finite(result), f"{board} / {title}: only NaN/Inf for {promql.substitute(expr)}: {result}"


def test_dashboard_variables_list_the_tools_called(stack: tuple[ProxyProcess, Prometheus]) -> None:
    _, prom = stack
    response = httpx.get(
        prom.url + "/api/v1/label/tool/values", params={"match[]": "mcp_recovery_calls_total"}, timeout=10
    )
    assert {"echo", "flaky_read", "always_fail", "charge"} <= set(response.json()["data"])


def test_every_metric_the_dashboard_and_rules_use_is_in_the_real_scrape(stack: tuple[ProxyProcess, Prometheus]) -> None:
    proxy, _ = stack
    scraped = {line.split("{")[0].split(" ")[0] for line in _scrape(proxy).splitlines() if line and line[0] != "#"}
    used: set[str] = set()
    for _, _, expr in promql.dashboard_targets():
        used |= promql.metric_names(expr)
    for _, expr in promql.rule_exprs():
        used |= promql.metric_names(expr)
    for query in promql.dashboard_variable_queries():
        used |= promql.metric_names(query)
    missing = sorted(used - scraped)
    assert not missing, f"used by the dashboard or rules but absent from the real scrape: {missing}"


def test_rule_unit_tests_use_series_of_the_real_scrape(stack: tuple[ProxyProcess, Prometheus]) -> None:
    proxy, _ = stack
    text = _scrape(proxy)
    for series in promql.rules_test_series():
        name, _, rest = series.partition("{")
        keys = sorted(k for k in re.findall(r"(\w+)=", rest) if k not in ("job", "instance"))
        lines = [line for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")]
        assert lines, f"{name} (rules_test.yml) is not in the real scrape"
        real_keys = sorted(re.findall(r"(\w+)=", lines[0].split(" ")[0]))
        assert keys == real_keys, f"{series}: labels {keys} but the real scrape has {real_keys}"


def test_promtool_check_metrics_is_clean_on_the_real_scrape(stack: tuple[ProxyProcess, Prometheus]) -> None:
    proxy, _ = stack
    tool = promql.promtool()
    assert tool is not None
    result = subprocess.run(
        [tool, "check", "metrics"], input=_scrape(proxy), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_every_alerting_rule_evaluates_on_the_real_series(stack: tuple[ProxyProcess, Prometheus]) -> None:
    _, prom = stack

    def evaluated() -> list[dict[str, Any]] | None:
        groups = httpx.get(prom.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return (
            rules
            if rules
            and all(
                r.get("lastEvaluation", "").startswith("2") and not r["lastEvaluation"].startswith("0001")
                for r in rules
            )
            else None
        )

    rules = wait_until(evaluated, "every rule evaluated once")
    assert {r["name"] for r in rules} == {name for name, _ in promql.rule_exprs()}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
