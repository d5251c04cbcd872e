"""No credential reaches an exported span, on any auth path (docs/security.md, "Where credentials
are looked for").

The real proxy process exports its spans over OTLP/HTTP (configured by OTEL_* variables only) to
a receiver this test runs (tests/telemetry/test_otlp.py). Each mode is driven through its
successes and its refusals with canary credentials: `tokens` with the admin token (right and
wrong, on every admin path), `jwt` with valid, expired, forged and wrongly signed tokens, and
`passthrough` with the upstream accepting, refusing (401) and refusing for scope (403), its
credential hash under a canary `--auth-hash-key-file`. The proxy is then stopped (its exporter
flushes on the way out) and every exported span is searched whole (its protobuf text: name,
attributes, events and their attributes, status, links) and every resource: no canary, nor any
part of a JWT. The spans are not vacuous: the calls' spans carry the principal, which is checked.
Logs, /metrics, /policies and results are searched by the tests of each mode
(test_tokens_e2e.py, test_passthrough_e2e.py, test_jwt_e2e.py); the upstream client key's
canary through spans is in tests/e2e/test_upstream_tls.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.auth.rig import modern_call, protected_server
from tests.fixtures.authserver import AuthServer
from tests.fixtures.helpers import free_port
from tests.proxy_process import ProxyProcess, scripted_stdio_command
from tests.telemetry.test_otlp import Receiver, attributes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
BOUND_S = 30.0


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    with Receiver() as r:
        yield r


def otel_env(receiver: Receiver) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}", "OTEL_BSP_SCHEDULE_DELAY": "100"}


def assert_no_canary_in_spans(receiver: Receiver, canaries: list[str], principal_prefix: str) -> None:
    spans = receiver.spans()
    principals = {attributes(span).get("mcp_recovery.principal") for _, span in spans}
    assert any(isinstance(p, str) and p.startswith(principal_prefix) for p in principals), principals
    for resource, span in spans:
        text = str(resource) + str(span)
        for canary in canaries:
            assert canary not in text, f"{canary[:12]}… leaked into the span {span.name!r}: {text[:2000]}"


def call(proxy: ProxyProcess, name: str, arguments: dict[str, Any], token: str | None) -> httpx.Response:
    headers, body = modern_call(name, arguments, token)
    return httpx.post(proxy.url, content=body, headers=headers, timeout=BOUND_S)


def stopped(proxy: ProxyProcess) -> None:
    """SIGTERM: the proxy drains and its span exporter flushes before it exits."""
    assert proxy.stop() == 0, proxy.log_tail()


def test_tokens_mode_and_the_admin_token_never_reach_a_span(tmp_path: Path, receiver: Receiver) -> None:
    alice, unknown = "alice-span-canary-4d1e7b90", "unknown-span-canary-8c2f6a13"
    admin, wrong_admin = "admin-span-canary-0a9b8c7d", "wrong-admin-canary-6e5f4d3c"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {alice}\n")
    (tmp_path / "admin").write_text(admin + "\n")
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "defaults.yaml").write_text(
        "retry_on: [transient]\nattempts: 3\ndeadline: 5s\nattempt_timeout: 2s\nbackoff: {initial: 10ms, max: 20ms}\n"
        "unclassified: transient\n"
    )
    journal = tmp_path / "journal.jsonl"
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal, tmp_path / "state.json"),
        extra=[
            *("--auth", "tokens", "--auth-tokens-file", str(tokens), "--admin-token-file", str(tmp_path / "admin")),
            *("--policies", str(policies)),
        ],
        log_path=tmp_path / "proxy.log",
        env=otel_env(receiver),
    )
    proxy.start(timeout_s=BOUND_S * 2)
    try:
        key = uuid.uuid4().hex
        ok = call(proxy, "flaky_read", {"key": key, "call_id": key, "fail_times": 2}, alice)  # 3 attempts
        assert ok.status_code == 200, ok.text
        assert call(proxy, "echo", {"text": alice}, alice).status_code == 200  # the token in the arguments too
        assert call(proxy, "echo", {"text": "x"}, unknown).status_code == 401
        assert call(proxy, "echo", {"text": "x"}, None).status_code == 401
        assert call(proxy, "echo", {"text": "x"}, f"Bearer {unknown} x").status_code == 401  # malformed
        assert call(proxy, "echo", {"text": "x"}, f"Basic {unknown}").status_code == 401
        for path in ("/metrics", "/policies", "/status.json", "/"):
            assert httpx.get(proxy.admin + path, headers={"authorization": f"Bearer {wrong_admin}"}).status_code == 401
            assert httpx.get(proxy.admin + path, headers={"authorization": f"Bearer {admin}"}).status_code == 200
    finally:
        stopped(proxy)
    assert_no_canary_in_spans(receiver, [alice, unknown, admin, wrong_admin], "token:alice")


def test_jwt_tokens_never_reach_a_span(tmp_path: Path, receiver: Receiver) -> None:
    with AuthServer(issuer_path="/tenant") as auth:
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        journal = tmp_path / "journal.jsonl"
        proxy = ProxyProcess(
            upstream=scripted_stdio_command(journal, tmp_path / "state.json"),
            port=port,
            extra=["--auth", "jwt", "--public-url", url, "--auth-issuer", auth.issuer],
            log_path=tmp_path / "proxy.log",
            env=otel_env(receiver),
        )
        proxy.start(timeout_s=BOUND_S * 2)
        good = auth.issue(aud=url, scope="tools")
        expired = auth.issue(aud=url, exp=1_000_000)
        other_audience = auth.issue(aud="http://127.0.0.1:9/elsewhere")
        forged = auth.forge_alg_none(aud=url)
        hmac_forged = auth.forge_hmac_with_public_key(aud=url)
        impostor = auth.issue(aud=url, key=auth.new_key(kid=auth.signing.kid))  # type: ignore[union-attr]
        try:
            assert call(proxy, "echo", {"text": "hello"}, good).status_code == 200
            for bad in (expired, other_audience, forged, hmac_forged, impostor):
                assert call(proxy, "echo", {"text": "x"}, bad).status_code == 401
        finally:
            stopped(proxy)
    tokens = [good, expired, other_audience, forged, hmac_forged, impostor]
    # every token whole, and each one's signature (a JWT's payload is not secret, its signature
    # and the whole token are)
    canaries = tokens + [t.rsplit(".", 1)[1] for t in tokens if t.rsplit(".", 1)[1]]
    assert_no_canary_in_spans(receiver, canaries, f"jwt:{auth.issuer}#")


def test_passthrough_credentials_and_the_hash_key_never_reach_a_span(tmp_path: Path, receiver: Receiver) -> None:
    good, weak, revoked = "good-span-canary-7e1d0c2b", "weak-span-canary-3f4a5b6c", "revoked-span-canary-9d8e7f60"
    hash_key = "hash-key-span-canary-" + "k" * 24
    tokens = tmp_path / "upstream-tokens"
    tokens.write_text(f"{good} mcp:read\n{weak} -\n")
    (tmp_path / "hash-key").write_text(hash_key + "\n")
    journal = tmp_path / "journal.jsonl"
    with protected_server("protected_server.py", tokens, journal, bound_s=BOUND_S) as port:
        proxy_port = free_port()
        proxy = ProxyProcess(
            upstream_url=f"http://127.0.0.1:{port}/mcp",
            port=proxy_port,
            extra=[
                *("--auth", "passthrough", "--public-url", f"http://127.0.0.1:{proxy_port}/mcp"),
                *("--auth-hash-key-file", str(tmp_path / "hash-key")),
            ],
            log_path=tmp_path / "proxy.log",
            env=otel_env(receiver),
        )
        proxy.start(timeout_s=BOUND_S * 2)
        try:
            cid = uuid.uuid4().hex[:12]
            ok = call(proxy, "flaky", {"call_id": cid, "fail_times": 2}, good)  # retried, every attempt with it
            assert ok.status_code == 200, ok.text
            assert call(proxy, "echo", {"text": "x"}, revoked).status_code == 401  # the upstream's 401
            assert call(proxy, "echo", {"text": "x"}, weak).status_code == 403  # the upstream's 403
            assert call(proxy, "echo", {"text": "x"}, None).status_code == 401
        finally:
            stopped(proxy)
    assert_no_canary_in_spans(receiver, [good, weak, revoked, hash_key], "passthrough:")
