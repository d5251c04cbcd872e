"""Process configuration (pydantic-settings): flags of `serve`, each also `MCP_RECOVERY_<FIELD>`
(a repeatable flag's field is plural and its variable a JSON list: `--allowed-host` →
`MCP_RECOVERY_ALLOWED_HOSTS='["a", "b"]'`).

Only how the process runs lives here; per-tool recovery behaviour lives in the policy files.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from proxy.state.config import check_url

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MCP_RECOVERY_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The arguments (the command line's flags), then `MCP_RECOVERY_*` variables: the only
        sources. No `.env` file or secrets directory is configured, so those two sources would
        find nothing; they are left out because they still walk every field at each start."""
        return init_settings, env_settings

    listen: str = Field("http://127.0.0.1:8080/mcp", description="http://HOST:PORT/PATH, or 'stdio'")
    upstream: str | None = Field(None, description="http(s)://… (Streamable HTTP) or sse+http(s)://… (legacy SSE)")
    upstream_command: str | None = Field(None, description="a stdio upstream, as one shell-quoted string")
    upstream_headers: list[str] = Field(default_factory=list, description="'Name: value' sent to an HTTP upstream")
    policies: Path | None = Field(None, description="the policy folder; the built-in defaults when unset")
    admin: str | None = Field(None, description="HOST:PORT of the admin endpoint (/metrics, /healthz, /readyz)")
    allowed_hosts: list[str] = Field(default_factory=list, description="Host header allow-list (host or host:port)")
    allowed_origins: list[str] = Field(default_factory=list, description="Origin allow-list (scheme://host[:port])")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_head_bytes: int = Field(64 * 1024, ge=1024, description="request line and headers; beyond it: 431")
    head_timeout_s: float = Field(10.0, gt=0, description="a request head must arrive within this; else 408")
    body_timeout_s: float = Field(30.0, gt=0, description="a request body may stall this long; else 408")
    max_connections: int = Field(
        4096,
        ge=1,
        description="open HTTP connections per port; beyond it, connections without a complete request head are "
        "closed first, then 503",
    )
    max_connections_per_client: int | None = Field(
        None,
        ge=1,
        description="open HTTP connections per port from one client address, proxies of --forwarded-allow-ips "
        "excepted (default: no cap per address); beyond it: 503",
    )
    request_timeout_s: float = Field(
        60.0, gt=0, description="every relayed request other than tools/call; then an error, cancelled upstream"
    )
    max_requests_per_session: int = Field(
        32, ge=1, description="upstream requests in flight per 2025 session (per client address for 2026)"
    )
    max_upstream_per_client: int | None = Field(
        None,
        ge=1,
        description="one client's share of an HTTP/SSE upstream's requests in flight, every session and both eras; "
        "as many more may wait, beyond that refused (default: 48 per verified principal with --auth jwt|tokens, "
        "else no share per address)",
    )
    max_sessions_per_client: int | None = Field(
        None,
        ge=1,
        description="2025 sessions per client; at it, the client's least recently used idle session is closed "
        "first (default: half of --max-sessions per verified principal with --auth jwt|tokens, else no cap per "
        "address)",
    )
    forwarded_allow_ips: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="proxies trusted to name the client in X-Forwarded-For (IP addresses or networks, "
        "comma-separated); none by default: the TCP peer is the client",
    )
    session_init_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a session with no request or notifications/initialized this long after the answer "
        "to its initialize closes",
    )
    max_sessions: int | None = Field(
        None,
        ge=1,
        description="2025 sessions held at once; at it, the least recently used idle session is closed first "
        "(default: from what a session costs, proxy/core/capacity.py: 1024 on an HTTP/SSE upstream or shared stdio "
        "children; with a stdio child each, what half the memory affords at 96 MiB a child, 16 to 256)",
    )
    stream_buffer_bytes: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        le=1024 * 1024 * 1024,
        description="what one response or listen stream queues for a client that does not read",
    )
    replay_stream_bytes: int = Field(
        17 * 1024 * 1024,
        ge=64 * 1024,
        le=1024 * 1024 * 1024,
        description="events one 2025 response stream keeps for resumption (Last-Event-ID)",
    )
    replay_total_bytes: int = Field(
        64 * 1024 * 1024,
        ge=64 * 1024,
        le=16 * 1024 * 1024 * 1024,
        description="events all 2025 response streams keep for resumption, together",
    )
    era_bridge: bool = Field(
        True,
        description="serve 2026-07-28 clients in front of a 2025-only upstream over a 2025 session of the proxy's, "
        "and 2025 clients in front of a 2026-07-28-only upstream over its 2026 link "
        "(off: they are refused as that server would refuse them)",
    )
    era_bridge_sessions: int | None = Field(
        None,
        ge=0,
        le=4096,
        description="2025 sessions the era bridge may hold for 2026 requests that declare client capabilities, "
        "each serving one request at a time so that the server can ask its caller (0: the server cannot ask; "
        "default: an eighth of max_sessions, 1 to 16)",
    )
    era_bridge_input_wait_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="how long a bridged request the server asked its 2026 caller about is held for the caller's "
        "answers before it is cancelled upstream",
    )
    resend_window_s: float = Field(
        300.0,
        ge=0,
        le=86_400,
        description="how long the undelivered answer of a state-changing or idempotent tools/call is kept for its "
        "re-send (0: re-sends are not matched, every call runs)",
    )
    resend_total_bytes: int = Field(
        64 * 1024 * 1024,
        ge=64 * 1024,
        le=16 * 1024 * 1024 * 1024,
        description="undelivered answers kept for re-sends, together (one answer at most a sixteenth of it)",
    )
    stderr_burst_lines: int = Field(
        100, ge=0, le=1_000_000, description="stdio child output lines logged at once before the rate applies"
    )
    stderr_lines_per_s: float = Field(
        20.0, ge=0, le=1_000_000, description="stdio child output lines logged per second after the burst"
    )
    max_concurrent_calls: int = Field(
        4096,
        ge=1,
        description="tools/call in flight; beyond it: 'overloaded' (a waiting call costs a task and its state, a few "
        "KiB: four per session at the session cap of an HTTP upstream)",
    )
    session_idle_timeout_s: float = Field(600.0, gt=0)
    stdio_spares: int = Field(
        1, ge=0, le=64, description="the warm pool: stdio children started ahead for new 2025 sessions (0: off)"
    )
    stdio_spares_max: int = Field(
        16,
        ge=0,
        le=64,
        description="the warm pool grows beyond --stdio-spares to the recent peak of 2025 sessions opened within one "
        "child start, up to this (at or below --stdio-spares: no growth)",
    )
    stdio_sessions: Literal["per-session", "shared"] = Field(
        "per-session",
        description="2025 sessions over a stdio upstream: a child each (per-session), or shared children (shared)",
    )
    stdio_shared_children: int = Field(
        2, ge=1, le=64, description="`--stdio-sessions shared`: the most stdio children the 2025 sessions share"
    )
    stdio_modern_children: int = Field(
        1,
        ge=1,
        le=64,
        description="2026-07-28 requests over a stdio upstream: the most children they spread over, started as the "
        "load asks (1: one child serves them all; more only for a server that keeps no state between requests)",
    )
    stdio_spare_starts: int = Field(2, ge=1, le=16, description="warm-pool children started at once while it refills")
    stdio_start_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="a stdio child must answer its first request (the handshake) within this after it was started;"
        " up to 6 times this while it is still busy starting (proxy/upstream/stdio/startwait.py)",
    )
    stdio_max_starting: int = Field(
        0, ge=0, le=256, description="stdio children starting at once, the others wait (0: the CPU count, at least 2)"
    )
    stdio_nice: int | None = Field(
        None,
        ge=0,
        le=19,
        description="stdio children run this much below the proxy's CPU priority (nice), so that their load does not"
        " delay the proxy's timers (default: 10 listening over HTTP, 0 with --listen stdio)",
    )
    shutdown_grace_s: float = Field(
        20.0, ge=0, description="on SIGTERM, how long calls in flight may finish before they end as 'shutdown'"
    )
    upstream_connect_timeout_s: float = Field(
        5.0, gt=0, description="establishing one connection to an HTTP/SSE upstream (TCP, egress proxy, TLS)"
    )
    upstream_max_connections: int | None = Field(
        None,
        ge=1,
        description="pooled connections to an HTTP/SSE upstream, the requests it runs at once; more wait their turn "
        "within their own timeout (default: one per session at the session cap, 100 to 1024; "
        "proxy/core/capacity.py)",
    )
    upstream_ca: Path | None = Field(
        None, description="PEM CA bundle trusted for an https upstream, instead of the system roots"
    )
    upstream_client_cert: Path | None = Field(None, description="PEM client certificate for mTLS to the upstream")
    upstream_client_key: Path | None = Field(None, description="PEM private key of --upstream-client-cert")
    upstream_client_key_password_file: Path | None = Field(
        None, description="a file whose first line is the passphrase of an encrypted --upstream-client-key"
    )
    ready_check_interval_s: float = Field(5.0, gt=0, description="how often /readyz re-checks a network upstream")
    state: str = Field(
        "memory",
        description="where the ledger, approvals and retry budget live: memory, or a shared store at "
        "redis://, rediss://, valkey:// or valkeys://, or a Redis Cluster at redis+cluster://, "
        "rediss+cluster://, valkey+cluster:// or valkeys+cluster:// (docs/state.md)",
    )
    state_ca: Path | None = Field(
        None, description="PEM CA bundle trusted for a rediss:// store, instead of the system roots"
    )
    state_client_cert: Path | None = Field(None, description="PEM client certificate for a rediss:// store (mTLS)")
    state_client_key: Path | None = Field(None, description="PEM private key of --state-client-cert")
    state_prefix: str = Field("mcp-recovery:", min_length=1, max_length=64, description="key prefix in the store")
    state_timeout_s: float = Field(
        0.5, gt=0, le=5, description="bound of every store operation; past it the proxy uses its local state"
    )
    state_sync_interval_s: float = Field(
        0.25, gt=0, le=10, description="how often the retry budget's counts are exchanged with the store"
    )
    state_required_for_ready: bool = Field(
        False, description="an unreachable shared store makes /readyz fail (off: the proxy serves on local state)"
    )
    log_level: str = "info"
    log_json: bool = False
    call_log: Literal["all", "problems", "off"] = Field(
        "problems", description="which tools/call get a log line: all, problems (all but first-attempt successes), off"
    )
    # Identity (proxy/auth/). Cross-field checks are in proxy.auth.check_settings.
    auth: Literal["none", "passthrough", "jwt", "tokens"] = Field(
        "none", description="who may call: none, passthrough (the upstream authenticates), jwt, tokens"
    )
    public_url: str | None = Field(
        None, description="the URL clients dial, endpoint path included (passthrough and jwt: required)"
    )
    auth_issuer: str | None = Field(None, description="jwt: the issuer whose metadata names its JWKS")
    auth_audience: str | None = Field(None, description="jwt: the audience tokens must name (default: --public-url)")
    auth_jwt_typ: Literal["at+jwt", "any"] = Field(
        "any", description="jwt: the token header's typ: at+jwt (RFC 9068 only) or any (default; docs/security.md)"
    )
    auth_tokens_file: Path | None = Field(None, description="tokens: 'NAME TOKEN' lines, '#' comments; hot-reloaded")
    auth_hash_key_file: Path | None = Field(
        None,
        description="passthrough: the key of the credential hash (principal ids); replicas that share state share it",
    )
    vouch_pings_burst: int = Field(
        5,
        ge=1,
        le=1000,
        description="passthrough: pings at once that may ask the upstream about a credential it has not accepted"
        " on a session",
    )
    vouch_pings_per_s: float = Field(
        1.0, gt=0, le=1000, description="passthrough: such pings a second per session after the burst (then 429)"
    )
    admin_token_file: Path | None = Field(
        None, description="a bearer token for /metrics and /policies on the admin port"
    )

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        if value == "stdio":
            return value
        parts = urlsplit(value)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError("--listen takes 'stdio' or http://HOST:PORT/PATH, e.g. http://127.0.0.1:8080/mcp")
        return value

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError("--public-url takes the URL clients dial, e.g. https://mcp.example.com/mcp")
        return value

    @field_validator("state")
    @classmethod
    def _check_state(cls, value: str) -> str:
        if value == "memory":
            return value
        check_url(value)  # the scheme, and nothing in the URL that would turn TLS verification off
        return value

    @field_validator("forwarded_allow_ips", mode="before")
    @classmethod
    def _split_forwarded(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [item.strip() for item in text.split(",") if item.strip()]
        if isinstance(value, list):  # a repeated flag, each possibly comma-separated
            return [item.strip() for v in value for item in str(v).split(",") if item.strip()]
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _check_forwarded(cls, value: list[str]) -> list[str]:
        for item in value:
            if item == "*":
                raise ValueError(
                    "'*' would let any caller choose its client address by writing X-Forwarded-For: "
                    "name the proxies' addresses or network (e.g. 10.0.0.0/8)"
                )
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"not an IP address or network: {item[:80]!r}") from None
        return value

    @model_validator(mode="after")
    def _check_shares(self) -> Settings:
        if self.max_sessions is None:
            # From what one session costs (proxy/core/capacity.py), not from who connects: one local
            # agent holds hundreds of sessions on an HTTP upstream or shared children.
            from proxy.core.capacity import default_max_sessions

            per_child = bool(self.upstream_command) and self.stdio_sessions == "per-session"
            self.max_sessions = default_max_sessions(child_per_session=per_child)
        if self.era_bridge_sessions is None:
            # They count against the upstream's sessions (a stdio child each with a child per
            # session): an eighth of them, so that the bridge never holds what 2025 clients need.
            self.era_bridge_sessions = max(1, min(16, self.max_sessions // 8))
        if self.upstream_max_connections is None:
            from proxy.core.capacity import default_upstream_connections

            self.upstream_max_connections = default_upstream_connections(self.max_sessions)
        if self.auth in ("jwt", "tokens"):
            # Fairness among verified principals (proxy/frontend/clients.py keys by principal then); an
            # address names no one (every caller of a pod or behind a NAT shares one), so without
            # a verified principal the per-client limits are opt-in.
            if self.max_sessions_per_client is None:
                self.max_sessions_per_client = max(1, self.max_sessions // 2)
            if self.max_upstream_per_client is None:
                self.max_upstream_per_client = 48
        return self

    @property
    def sessions_cap(self) -> int:
        """`max_sessions`, set once the settings are validated."""
        assert self.max_sessions is not None
        return self.max_sessions

    @property
    def upstream_pool(self) -> int:
        """`upstream_max_connections`, set once the settings are validated."""
        assert self.upstream_max_connections is not None
        return self.upstream_max_connections

    @model_validator(mode="after")
    def _check_replay_bounds(self) -> Settings:
        if self.replay_total_bytes < self.replay_stream_bytes:
            raise ValueError(
                f"replay_total_bytes ({self.replay_total_bytes}) must be at least replay_stream_bytes "
                f"({self.replay_stream_bytes}): one stream's events count in the total"
            )
        return self

    @property
    def upstream_argv(self) -> list[str]:
        return shlex.split(self.upstream_command) if self.upstream_command else []

    @property
    def listen_host(self) -> str:
        return urlsplit(self.listen).hostname or "127.0.0.1"

    @property
    def listen_port(self) -> int:
        return urlsplit(self.listen).port or 8080

    @property
    def listen_path(self) -> str:
        return urlsplit(self.listen).path or "/mcp"

    @property
    def upstream_tls_flags(self) -> list[str]:
        """The TLS flags that were given (each applies to an https upstream only)."""
        given = {
            "--upstream-ca": self.upstream_ca,
            "--upstream-client-cert": self.upstream_client_cert,
            "--upstream-client-key": self.upstream_client_key,
            "--upstream-client-key-password-file": self.upstream_client_key_password_file,
        }
        return [flag for flag, value in given.items() if value is not None]

    def header_pairs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in self.upstream_headers:
            name, sep, value = item.partition(":")
            if not sep or not name.strip():
                raise ValueError("--upstream-header takes 'Name: value'")
            out[name.strip()] = value.strip()
        return out
