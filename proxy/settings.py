"""Process configuration (pydantic-settings): flags of `serve`, each also `MCP_RECOVERY_<FIELD>`
(a repeatable flag's field is plural and its variable a JSON list: `--allowed-host` →
`MCP_RECOVERY_ALLOWED_HOSTS='["a", "b"]'`).

Only how the process runs lives here; per-tool recovery behaviour lives in the policy files.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MCP_RECOVERY_", extra="ignore")

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
    max_connections: int = Field(1024, ge=1, description="open HTTP connections per port; beyond it: 503")
    request_timeout_s: float = Field(
        60.0, gt=0, description="every relayed request other than tools/call; then an error, cancelled upstream"
    )
    max_requests_per_session: int = Field(
        32, ge=1, description="upstream requests in flight per 2025 session (per client address for 2026)"
    )
    max_sessions_per_client: int = Field(16, ge=1, description="2025 sessions per client address")
    session_init_timeout_s: float = Field(
        10.0, gt=0, description="a session with no request or notifications/initialized after initialize closes"
    )
    max_sessions: int = Field(64, ge=1, description="legacy sessions (each may own an upstream child)")
    max_concurrent_calls: int = Field(256, ge=1, description="tools/call in flight; beyond it: 'overloaded'")
    session_idle_timeout_s: float = Field(600.0, gt=0)
    stdio_spares: int = Field(
        1, ge=0, le=1, description="stdio children started ahead for the next 2025 session (0 turns it off)"
    )
    upstream_connect_timeout_s: float = Field(5.0, gt=0)
    upstream_ca: Path | None = Field(
        None, description="PEM CA bundle trusted for an https upstream, instead of the system roots"
    )
    upstream_client_cert: Path | None = Field(None, description="PEM client certificate for mTLS to the upstream")
    upstream_client_key: Path | None = Field(None, description="PEM private key of --upstream-client-cert")
    upstream_client_key_password_file: Path | None = Field(
        None, description="a file whose first line is the passphrase of an encrypted --upstream-client-key"
    )
    ready_check_interval_s: float = Field(5.0, gt=0, description="how often /readyz re-checks a network upstream")
    log_level: str = "info"
    log_json: bool = False
    call_log: Literal["all", "problems", "off"] = Field(
        "problems", description="which tools/call get a log line: all, problems (all but first-attempt successes), off"
    )
    # Identity (issue 14; proxy/auth/). Cross-field checks are in proxy.auth.check_settings.
    auth: Literal["none", "passthrough", "jwt", "tokens"] = Field(
        "none", description="who may call: none, passthrough (the upstream authenticates), jwt, tokens"
    )
    public_url: str | None = Field(
        None, description="the URL clients dial, endpoint path included (passthrough and jwt: required)"
    )
    auth_issuer: str | None = Field(None, description="jwt: the issuer whose metadata names its JWKS")
    auth_audience: str | None = Field(None, description="jwt: the audience tokens must name (default: --public-url)")
    auth_tokens_file: Path | None = Field(None, description="tokens: 'NAME TOKEN' lines, '#' comments; hot-reloaded")
    auth_hash_key_file: Path | None = Field(
        None,
        description="passthrough: the key of the credential hash (principal ids); replicas that share state share it",
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
