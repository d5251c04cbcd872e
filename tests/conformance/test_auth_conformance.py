"""The official suite's client auth scenarios, with and without the proxy in `--auth passthrough`
between the SDK's conformance client and the suite's mock server.

The suite plays the MCP server and the authorization server and judges the client; the client
is the Python SDK's own conformance client (`.github/actions/conformance/client.py` of the
mcp==2.3.0 sdist that scripts/setup-conformance.sh fetches: read from there, never copied here).
For each requirement set (`conformance list --requirements 2025-11-25` and `2026-07-28`), every
scored `auth/*` scenario runs twice: directly (`client.py SERVER_URL`) and through the proxy
(`auth_via_proxy.py`, which starts the proxy in front of SERVER_URL and hands the client the
proxy's URL). The proxied verdict of every scenario must equal the direct one: passthrough
changes nothing a client sees. docs/conformance.md has the table of a run.

The suite's client mode starts its mock servers on every interface, so each run happens in a
network namespace of its own (`unshare -n`, loopback brought up inside): nothing is reachable
from outside, and parallel runs cannot collide on ports. Runs go two at a time (a proxied run
starts a Python process per scenario; on two busy cores more only queue), each bounded.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conformance_harness import ConformanceTools, child_env, dump_json, skip_or_fail

LEGS = ("2025-11-25", "2026-07-28")
CLIENT_MEMBER = "/.github/actions/conformance/client.py"
WRAPPER = Path(__file__).resolve().with_name("auth_via_proxy.py")
SCENARIO_TIMEOUT_S = 400  # the proxy's start (bounded at 150 s in auth_via_proxy.py) and the scenario
WORKERS = int(os.environ.get("MCP_AUTH_CONFORMANCE_WORKERS", "2"))

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.conformance, pytest.mark.timeout(3600)]


@dataclass(frozen=True)
class Verdict:
    scenario: str
    passed: bool
    checks: str  # "a/b" as the suite printed it, or what went wrong
    log: Path


@pytest.fixture(scope="module")
def auth_client(conformance_tools: ConformanceTools, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SDK's conformance client, extracted from the sdist the setup script downloaded."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        skip_or_fail("the auth scenarios need unshare and ip (util-linux, iproute2) for a private network")
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        skip_or_fail(f"cannot create a network namespace here: {probe.stderr.decode(errors='replace')[:200]}")
    sdists = sorted((conformance_tools.cache / "sdist").glob("mcp-*.tar.gz"))
    if not sdists:
        skip_or_fail(f"no mcp sdist in {conformance_tools.cache / 'sdist'}: run scripts/setup-conformance.sh")
    out = tmp_path_factory.mktemp("auth-client")
    with tarfile.open(sdists[-1]) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith(CLIENT_MEMBER)), None)
        if member is None:
            skip_or_fail(f"{sdists[-1].name} has no {CLIENT_MEMBER}")
        assert member is not None
        source = tar.extractfile(member)
        assert source is not None
        client = out / "client.py"
        client.write_bytes(source.read())
    return client


def auth_scenarios(tools: ConformanceTools, leg: str) -> list[str]:
    """The scored `auth/*` scenarios of a requirement set (those listed before the suite's
    "Run and reported, but never scored" part)."""
    listing = subprocess.run(
        [str(tools.node), str(tools.suite_js), "list", "--requirements", leg],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert listing.returncode == 0, listing.stderr
    scored = listing.stdout.split("Run and reported", 1)[0]
    return re.findall(r"^\s+- (auth/\S+)\s*$", scored, flags=re.MULTILINE)


def run_scenario(tools: ConformanceTools, command: list[str], scenario: str, leg: str, work: Path) -> Verdict:
    work.mkdir(parents=True, exist_ok=True)
    suite = [
        str(tools.node),
        str(tools.suite_js),
        "client",
        "--command",
        shlex.join(command),
        "--scenario",
        scenario,
        "--spec-version",
        leg,
        "--timeout",
        str((SCENARIO_TIMEOUT_S - 30) * 1000),
        "-o",
        str(work / "results"),
    ]
    log = work / "suite.log"
    env = child_env(MCP_AUTH_PROXY_LOG_DIR=str(work))
    try:
        done = subprocess.run(
            ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *suite],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=SCENARIO_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired as expired:
        log.write_bytes(expired.stdout or b"")
        return Verdict(scenario, False, f"no verdict within {SCENARIO_TIMEOUT_S} s", log)
    text = done.stdout.decode("utf-8", "replace")
    log.write_text(text)
    counted = re.search(r"Passed: (\d+/\d+), (\d+) failed", text)
    overall = "OVERALL: PASSED" in text
    return Verdict(scenario, done.returncode == 0 and overall, counted.group(1) if counted else "no summary", log)


@pytest.mark.parametrize("leg", LEGS)
def test_auth_scenarios_pass_through_the_proxy_exactly_as_directly(
    leg: str,
    conformance_tools: ConformanceTools,
    auth_client: Path,
    tmp_path: Path,
    record_score,
) -> None:
    scenarios = auth_scenarios(conformance_tools, leg)
    assert len(scenarios) >= 10, f"the {leg} requirement set lists only {scenarios}: did the suite change?"
    direct = [sys.executable, str(auth_client)]
    proxied = [sys.executable, str(WRAPPER), sys.executable, str(auth_client)]
    jobs = [
        (name, target, command) for name in scenarios for target, command in (("direct", direct), ("proxy", proxied))
    ]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = {
            (name, target): pool.submit(
                run_scenario, conformance_tools, command, name, leg, tmp_path / target / name.replace("/", "_")
            )
            for name, target, command in jobs
        }
        verdicts = {key: future.result() for key, future in futures.items()}

    rows = []
    differ = []
    for name in scenarios:
        d, p = verdicts[(name, "direct")], verdicts[(name, "proxy")]
        rows.append({"scenario": name, "direct": [d.passed, d.checks], "proxy": [p.passed, p.checks]})
        if d.passed != p.passed:
            differ.append(
                f"  - {name}: direct {'pass' if d.passed else 'FAIL'} ({d.checks}, {d.log}), "
                f"proxy {'pass' if p.passed else 'FAIL'} ({p.checks}, {p.log})"
            )
    dump_json(tmp_path / "auth-results.json", {"leg": leg, "scenarios": rows})
    direct_passed = sum(verdicts[(n, "direct")].passed for n in scenarios)
    proxy_passed = sum(verdicts[(n, "proxy")].passed for n in scenarios)
    record_score(
        f"conformance auth/* {leg}: direct {direct_passed}/{len(scenarios)}, "
        f"proxy (passthrough) {proxy_passed}/{len(scenarios)} scenarios"
    )
    if differ:
        pytest.fail(
            f"passthrough changed the verdict of {len(differ)} scenario(s) on {leg}:\n" + "\n".join(differ),
            pytrace=False,
        )
