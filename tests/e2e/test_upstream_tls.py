"""The real proxy process in front of an HTTPS upstream that requires a client certificate, reached
through an egress proxy that requires credentials (docs/security.md, "Upstream TLS and egress").

The upstream is the scripted SDK server (tests/fixtures/scripted_server.py) under uvicorn with a
private CA, server certificate and client CA generated here (tests/fixtures/tls.py); the proxy
gets `--upstream-ca`, `--upstream-client-cert`, an encrypted `--upstream-client-key` and its
passphrase file, and `HTTPS_PROXY=http://agent:PASSWORD@127.0.0.1:PORT`. The upstream's name,
`mcp-upstream.test`, resolves only inside the egress proxy (tests/fixtures/egress_proxy.py), so
every request the upstream journals went through a tunnel, over TLS (it serves nothing else).

Canaries: the proxy URL's password and the client key's passphrase are searched for in the whole
log (`--log-level debug --call-log all`), /readyz, /metrics, /policies and every answer, on the
working path and on the failing ones (a refused tunnel, an untrusted certificate, a missing client
certificate).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.types import TextContent

from tests.fixtures.egress_proxy import EgressProxy
from tests.fixtures.helpers import ScriptedHTTP, wait_port
from tests.fixtures.tls import Pki, make_pki
from tests.proxy_process import ProxyProcess
from tests.telemetry.test_otlp import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.filterwarnings("ignore:.*deprecated as of 2026-07-28")]
BOUND_S = 30.0
NAME = "mcp-upstream.test"
PASSWORD = "egress-canary-Hw3k9"
PASSPHRASE = "keyphrase-canary-Pz6t"
CANARIES = (PASSWORD, PASSPHRASE)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), dns_names=(NAME, "localhost"), client_key_password=PASSPHRASE)


@pytest.fixture(scope="module")
def upstream(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedHTTP]:
    tmp = tmp_path_factory.mktemp("tls-upstream")
    extra = [
        *("--ssl-certfile", str(pki.server_cert), "--ssl-keyfile", str(pki.server_key)),
        *("--ssl-ca-certs", str(pki.ca), "--allowed-host", NAME),
    ]
    with ScriptedHTTP(tmp / "journal.jsonl", tmp / "state.json", extra=extra) as server:
        yield server


def tls_flags(pki: Pki, folder: Path, *, ca: bool = True, client: bool = True) -> list[str]:
    password_file = folder / "key-passphrase"
    password_file.write_text(PASSPHRASE + "\n")
    flags = ["--upstream-ca", str(pki.ca)] if ca else []
    if client:
        flags += ["--upstream-client-cert", str(pki.client_cert), "--upstream-client-key", str(pki.client_key)]
        flags += ["--upstream-client-key-password-file", str(password_file)]
    return flags


def assert_clean(where: str, text: str) -> None:
    for canary in CANARIES:
        assert canary not in text, f"{canary!r} leaked into {where}: {text[:2000]}"


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def proxy_for(
    upstream: ScriptedHTTP,
    flags: list[str],
    egress: EgressProxy,
    password: str,
    log: Path,
    env: dict[str, str] | None = None,
) -> ProxyProcess:
    return ProxyProcess(
        upstream_url=f"https://{NAME}:{upstream.port}/mcp",
        extra=[*flags, "--log-level", "debug", "--call-log", "all", "--ready-check-interval-s", "0.5"],
        log_path=log,
        env={"HTTPS_PROXY": f"http://agent:{password}@127.0.0.1:{egress.port}", "NO_PROXY": "localhost", **(env or {})},
    )


def key_text(pki: Pki) -> list[str]:
    """The client key file's text, as canaries: each line of its PEM body."""
    return [line for line in pki.client_key.read_text().splitlines() if line and not line.startswith("-----")]


async def test_both_eras_and_a_retried_call_go_over_mtls_through_the_tunnel(
    pki: Pki, upstream: ScriptedHTTP, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    with EgressProxy(user="agent", password=PASSWORD, names={NAME: "127.0.0.1"}) as egress, Receiver() as receiver:
        # every span exported too: no secret (the client key, its passphrase, the egress password)
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        proxy = proxy_for(upstream, tls_flags(pki, tmp_path), egress, PASSWORD, tmp_path / "proxy.log", otel)
        await anyio.to_thread.run_sync(proxy.start)
        try:
            for mode in ("legacy", "2026-07-28"):
                with anyio.fail_after(BOUND_S):
                    async with Client(proxy.url, mode=mode) as client:
                        assert text_of(await client.call_tool("echo", {"text": f"tls-{mode}"})) == f"tls-{mode}"
                        call_id = f"retried-{mode}"
                        result = await client.call_tool(
                            "flaky_read", {"key": call_id, "call_id": call_id, "fail_times": 2}
                        )
                        assert not result.is_error, text_of(result)
                        assert result.meta is not None and result.meta["io.mcp-recovery-proxy/attempts"] == 3
                # Every attempt reached the upstream, which only the tunnel can reach, over TLS.
                assert upstream.journal.executions("flaky_read", call=call_id) == 3
            assert egress.opened, "no tunnel was opened"
            assert {t.authority for t in egress.tunnels} == {f"{NAME}:{upstream.port}"}
            assert all(t.status == 200 and t.authorization is not None for t in egress.tunnels)
            async with httpx.AsyncClient(timeout=BOUND_S) as http:
                for path in ("/readyz", "/metrics", "/policies"):
                    answer = await http.get(proxy.admin + path)
                    assert answer.status_code == 200, answer.text
                    assert_clean(path, answer.text)
        finally:
            proxy.stop()  # SIGTERM: the span exporter flushes on the way out
        spans = receiver.spans()
    log = proxy.log_tail(10**7)
    assert "through the egress proxy http://agent@127.0.0.1" in log
    assert_clean("the log", log)
    assert len(spans) >= 6, "the calls' spans were exported"
    for resource, span in spans:
        text = str(resource) + str(span)
        assert_clean(f"the span {span.name!r}", text)
        for line in key_text(pki):
            assert line not in text and line not in log, f"the client key leaked into the span {span.name!r}"


FAILURES = {
    # what is wrong: (TLS flags, the password the proxy sends, what /readyz and the answer must say)
    "untrusted certificate": ({"ca": False}, PASSWORD, "--upstream-ca"),
    "no client certificate": ({"client": False}, PASSWORD, "--upstream-client-cert"),
    "proxy credentials refused": ({}, PASSWORD, "407"),
}


@pytest.mark.parametrize("case", list(FAILURES))
async def test_a_failing_upstream_connection_says_what_failed_and_leaks_nothing(
    pki: Pki, upstream: ScriptedHTTP, tmp_path: Path, case: str
) -> None:
    flag_options, password, expected = FAILURES[case]
    # For the 407 case the egress proxy expects another password than the (canary) one it gets.
    expected_password = "another-password" if case == "proxy credentials refused" else PASSWORD
    with EgressProxy(user="agent", password=expected_password, names={NAME: "127.0.0.1"}) as egress:
        proxy = proxy_for(upstream, tls_flags(pki, tmp_path, **flag_options), egress, password, tmp_path / "proxy.log")
        await anyio.to_thread.run_sync(proxy.spawn)
        try:
            await anyio.to_thread.run_sync(wait_port, proxy.admin_port, BOUND_S)
            async with httpx.AsyncClient(timeout=BOUND_S) as http:
                deadline = time.monotonic() + BOUND_S
                while expected not in (readyz := await http.get(proxy.admin + "/readyz")).text:
                    assert time.monotonic() < deadline, readyz.text
                    await anyio.sleep(0.1)
                assert readyz.status_code == 503
                assert_clean("/readyz", readyz.text)
                await anyio.to_thread.run_sync(wait_port, proxy.port, BOUND_S)
                answer = await http.post(
                    proxy.url,
                    json={
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "tools/call",
                        "params": {
                            "name": "echo",
                            "arguments": {"text": "x"},
                            "_meta": {
                                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                "io.modelcontextprotocol/clientCapabilities": {},
                            },
                        },
                    },
                    headers={
                        "accept": "application/json, text/event-stream",
                        "mcp-protocol-version": "2026-07-28",
                        "mcp-method": "tools/call",
                        "mcp-name": "echo",
                    },
                )
                assert expected in answer.text, answer.text
                assert_clean("the tools/call answer", answer.text)
                for path in ("/metrics", "/policies"):
                    assert_clean(path, (await http.get(proxy.admin + path)).text)
            if case == "proxy credentials refused":
                assert egress.tunnels and not egress.opened
        finally:
            proxy.stop()
        log = proxy.log_tail(10**7)
        assert expected in log, log[-3000:]
        assert_clean("the log", log)


async def test_renewed_tls_files_are_used_without_a_restart_and_a_bad_renewal_keeps_the_last_good(
    pki: Pki, upstream: ScriptedHTTP, tmp_path: Path
) -> None:
    """The CA file first holds a CA that did not sign the upstream's certificate (the state of a
    rotation not yet rolled out): the upstream is untrusted. A half-written file is refused and
    the last good context kept; the right CA is then picked up from the file, no restart."""
    secret = tmp_path / "secret"  # the mounted folder the watcher watches
    secret.mkdir()
    ca_file = secret / "ca.pem"
    ca_file.write_bytes(pki.other_ca.read_bytes())
    flags = tls_flags(pki, tmp_path)
    flags[flags.index("--upstream-ca") + 1] = str(ca_file)
    with EgressProxy(user="agent", password=PASSWORD, names={NAME: "127.0.0.1"}) as egress:
        proxy = proxy_for(upstream, flags, egress, PASSWORD, tmp_path / "proxy.log")
        await anyio.to_thread.run_sync(proxy.spawn)
        try:
            await anyio.to_thread.run_sync(wait_port, proxy.admin_port, BOUND_S)
            async with httpx.AsyncClient(timeout=BOUND_S) as http:

                async def readyz_until(predicate: Any) -> httpx.Response:
                    deadline = time.monotonic() + BOUND_S
                    while not predicate(answer := await http.get(proxy.admin + "/readyz")):
                        assert time.monotonic() < deadline, answer.text
                        await anyio.sleep(0.1)
                    return answer

                await readyz_until(lambda r: r.status_code == 503 and "--upstream-ca" in r.text)
                ca_file.write_text("-----BEGIN CERTIFICATE-----\nhalf-written-renewal\n")
                deadline = time.monotonic() + BOUND_S
                while "keeping the last good" not in proxy.log_tail(10**6):
                    assert time.monotonic() < deadline, proxy.log_tail()
                    await anyio.sleep(0.1)
                ca_file.write_bytes(pki.ca.read_bytes())
                await readyz_until(lambda r: r.status_code == 200)
            with anyio.fail_after(BOUND_S):
                async with Client(proxy.url, mode="legacy") as client:
                    assert text_of(await client.call_tool("echo", {"text": "renewed"})) == "renewed"
        finally:
            proxy.stop()
    log = proxy.log_tail(10**7)
    assert "upstream TLS files reloaded (watch)" in log
    assert "half-written-renewal" not in log  # the problem names the file, never its content
    assert_clean("the log", log)
