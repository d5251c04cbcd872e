"""The command line and the process settings: flags, environment variables, clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.settings import Settings
from tests.fixtures.helpers import REPO_ROOT

pytestmark = pytest.mark.slow


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_every_flag_has_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_RECOVERY_LISTEN", "stdio")
    monkeypatch.setenv("MCP_RECOVERY_UPSTREAM_COMMAND", "npx -y 'some server'")
    monkeypatch.setenv("MCP_RECOVERY_MAX_SESSIONS", "7")
    monkeypatch.setenv("MCP_RECOVERY_ALLOWED_HOSTS", '["mcp.internal:*"]')
    settings = Settings()
    assert settings.listen == "stdio"
    assert settings.upstream_argv == ["npx", "-y", "some server"]
    assert settings.max_sessions == 7 and settings.allowed_hosts == ["mcp.internal:*"]


def test_a_repeatable_flags_variable_has_the_plural_name_and_holds_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.cli import build_parser

    monkeypatch.setenv("MCP_RECOVERY_UPSTREAM_HEADERS", '["X-Api-Key: k"]')
    monkeypatch.setenv("MCP_RECOVERY_ALLOWED_ORIGINS", '["https://app.example"]')
    settings = Settings()
    assert settings.upstream_headers == ["X-Api-Key: k"] and settings.allowed_origins == ["https://app.example"]
    args = build_parser().parse_args(
        ["serve", "--upstream-header", "A: 1", "--allowed-host", "h", "--allowed-origin", "o"]
    )
    for field in ("upstream_headers", "allowed_hosts", "allowed_origins"):
        assert field in Settings.model_fields and len(getattr(args, field)) == 1, "the flag fills the plural field"


def test_the_open_host_warning_names_a_flag_and_a_variable_that_exist(caplog: pytest.LogCaptureFixture) -> None:
    import re

    from proxy.cli import build_parser
    from proxy.core.service import Service
    from proxy.frontend.http.app import McpHttpApp
    from proxy.upstream.stdio import StdioUpstream

    settings = Settings(listen="http://0.0.0.0:8080/mcp", upstream_command="x")
    with caplog.at_level("WARNING", logger="proxy.frontend.http"):
        McpHttpApp(Service(settings, StdioUpstream(["x"])), settings)
    (message,) = [r.getMessage() for r in caplog.records if "any Host header" in r.getMessage()]
    (flag,) = re.findall(r"--[a-z-]+", message)
    assert build_parser().parse_args(["serve", flag, "mcp.internal"]).allowed_hosts == ["mcp.internal"]
    (variable,) = re.findall(r"MCP_RECOVERY_[A-Z_]+", message)
    assert variable.removeprefix("MCP_RECOVERY_").lower() in Settings.model_fields


def test_a_flag_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_RECOVERY_MAX_SESSIONS", "7")
    assert Settings(max_sessions=3).max_sessions == 3


@pytest.mark.parametrize("listen", ["127.0.0.1:8080", "https://127.0.0.1:8080/mcp", "http://127.0.0.1/mcp"])
def test_a_bad_listen_address_is_refused_with_an_example(listen: str) -> None:
    done = run_cli("serve", "--listen", listen, "--", "true")
    assert done.returncode == 2
    assert "--listen" in done.stderr and "http://127.0.0.1:8080/mcp" in done.stderr


def test_serve_without_an_upstream_says_how_to_give_one() -> None:
    done = run_cli("serve", "--listen", "http://127.0.0.1:1/mcp")
    assert done.returncode == 2 and "--upstream" in done.stderr and "-- COMMAND" in done.stderr


def test_serve_refuses_an_invalid_policy_folder_naming_every_problem(tmp_path: Path) -> None:
    (tmp_path / "defaults.yaml").write_text("attempts: 0\nbogus: 1\n")
    done = run_cli("serve", "--listen", "http://127.0.0.1:1/mcp", "--policies", str(tmp_path), "--", "true")
    assert done.returncode == 2
    assert "defaults.yaml" in done.stderr and "attempts" in done.stderr and "bogus" in done.stderr


def test_policies_check_and_explain_on_the_shipped_folder() -> None:
    check = run_cli("policies", "check", "policies")
    assert check.returncode == 0 and "OK" in check.stdout
    explain = run_cli("policies", "explain", "policies", "lookup", "--annotations", '{"readOnlyHint": true}')
    assert explain.returncode == 0
    assert "read_only" in explain.stdout and "annotations:readOnlyHint" in explain.stdout


def test_call_log_takes_a_flag_or_the_environment_and_refuses_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.cli import build_parser

    assert Settings().call_log == "problems"
    monkeypatch.setenv("MCP_RECOVERY_CALL_LOG", "all")
    assert Settings().call_log == "all"
    args = build_parser().parse_args(["serve", "--call-log", "off"])  # main() splits off `-- COMMAND` first
    assert args.call_log == "off"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--call-log", "some"])


BOUND_SETTINGS = {
    # field: (flag value, the default it replaces)
    "stream_buffer_bytes": ("131072", 4 * 1024 * 1024),
    "replay_stream_bytes": ("1048576", 17 * 1024 * 1024),
    "replay_total_bytes": ("33554432", 64 * 1024 * 1024),
    "stderr_burst_lines": ("5", 100),
    "stderr_lines_per_s": ("0.5", 20.0),
    "stdio_start_timeout_s": ("45", 10.0),  # at a load of ~20 a server's start exceeds 10 s
    "vouch_pings_burst": ("2", 5),  # passthrough: proxy/auth/vouch.py
    "vouch_pings_per_s": ("0.5", 1.0),
}


@pytest.mark.parametrize("field", sorted(BOUND_SETTINGS))
def test_the_stream_replay_and_stderr_bounds_are_settings_with_their_defaults(
    field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bound (streams, replay buffers, stderr, a child's start, passthrough pings) is a setting:
    its default, and a flag that sets it."""
    from proxy.cli import build_parser

    value, default = BOUND_SETTINGS[field]
    assert Settings().model_dump()[field] == default
    args = build_parser().parse_args(["serve", f"--{field.replace('_', '-')}", value])
    assert float(getattr(args, field)) == float(value)
    monkeypatch.setenv(f"MCP_RECOVERY_{field.upper()}", value)
    assert float(Settings().model_dump()[field]) == float(value)


@pytest.mark.parametrize(
    ("values", "wrong"),
    [
        ({"stream_buffer_bytes": 1024}, "stream_buffer_bytes"),
        ({"replay_stream_bytes": 10}, "replay_stream_bytes"),
        ({"replay_stream_bytes": 8 << 20, "replay_total_bytes": 4 << 20}, "replay_total_bytes"),
        ({"stderr_burst_lines": -1}, "stderr_burst_lines"),
        ({"stderr_lines_per_s": -1}, "stderr_lines_per_s"),
        ({"stdio_start_timeout_s": 0}, "stdio_start_timeout_s"),
        ({"vouch_pings_burst": 0}, "vouch_pings_burst"),
        ({"vouch_pings_per_s": 0}, "vouch_pings_per_s"),
    ],
)
def test_the_bounds_are_validated(values: dict[str, int], wrong: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=wrong):
        Settings(**values)


def test_trusted_proxies_are_addresses_or_networks_never_anyone(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from proxy.cli import build_parser

    assert Settings().forwarded_allow_ips == [], "none by default: X-Forwarded-For is not read"
    args = build_parser().parse_args(["serve", "--forwarded-allow-ips", "10.0.0.0/8, 192.0.2.7"])
    assert Settings(forwarded_allow_ips=args.forwarded_allow_ips).forwarded_allow_ips == ["10.0.0.0/8", "192.0.2.7"]
    repeated = ["serve", "--forwarded-allow-ips", "10.0.0.0/8", "--forwarded-allow-ips", "192.168.0.0/16,192.0.2.7"]
    args = build_parser().parse_args(repeated)
    assert Settings(forwarded_allow_ips=args.forwarded_allow_ips).forwarded_allow_ips == [
        "10.0.0.0/8",
        "192.168.0.0/16",
        "192.0.2.7",
    ], "every repeat kept, not the last alone"
    monkeypatch.setenv("MCP_RECOVERY_FORWARDED_ALLOW_IPS", "fd00::/8,10.1.2.3")
    assert Settings().forwarded_allow_ips == ["fd00::/8", "10.1.2.3"]
    for bad in ("*", "ingress.local", "10.0.0.0/99"):
        with pytest.raises(ValidationError, match="forwarded_allow_ips"):
            Settings(forwarded_allow_ips=bad)


def test_session_cap_follows_what_a_session_costs_and_per_client_caps_are_per_principal_only() -> None:
    from proxy.core import capacity

    # Cheap sessions (an HTTP upstream, shared stdio children): hundreds for one local agent.
    assert Settings(upstream="http://127.0.0.1:1/mcp").max_sessions == capacity.CHEAP_SESSIONS
    assert Settings(upstream_command="srv", stdio_sessions="shared").max_sessions == capacity.CHEAP_SESSIONS
    # A child each: what half the memory affords, bounded.
    gib = 1024**3
    assert capacity.default_max_sessions(child_per_session=True, memory=24 * gib) == 128
    assert capacity.default_max_sessions(child_per_session=True, memory=1 * gib) == capacity.MIN_CHILD_SESSIONS
    assert capacity.default_max_sessions(child_per_session=True, memory=1024 * gib) == capacity.MAX_CHILD_SESSIONS
    per_child = Settings(upstream_command="srv").max_sessions
    assert per_child is not None and capacity.MIN_CHILD_SESSIONS <= per_child <= capacity.MAX_CHILD_SESSIONS
    assert Settings(max_sessions=7).max_sessions == 7
    # An address names no one: no cap per address unless asked for.
    none = Settings(upstream="http://127.0.0.1:1/mcp")
    assert none.max_sessions_per_client is None
    assert none.max_upstream_per_client is None
    assert none.max_connections_per_client is None
    assert Settings(max_sessions_per_client=3).max_sessions_per_client == 3
    # A verified principal is someone: half the sessions each, and a share of the upstream.
    jwt = Settings(upstream="http://127.0.0.1:1/mcp", auth="jwt", max_sessions=100)
    assert jwt.max_sessions_per_client == 50
    assert jwt.max_upstream_per_client == 48


def test_serve_help_shows_the_stdio_upstream_form_and_the_inspector_cli_form(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from proxy.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: mcp-recovery-proxy serve [flags] [--upstream URL | -- COMMAND [ARG ...]]")
    assert "-- mcp-recovery-proxy serve --listen stdio -- npx -y some-mcp-server" in out


def test_a_server_command_without_its_double_dash_is_refused_saying_where_it_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What a launcher that strips `--` (the MCP Inspector CLI) makes of `serve --listen stdio -- npx …`."""
    from proxy.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--listen", "stdio", "npx", "-y", "some-mcp-server"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: npx -y some-mcp-server" in err
    assert "goes after `--`" in err and "--cli --method tools/list -- mcp-recovery-proxy serve" in err
    with pytest.raises(SystemExit):
        main(["serve", "--listen", "stdio", "--no-such-flag"])
    assert "goes after" not in capsys.readouterr().err  # a mistyped flag is only that
