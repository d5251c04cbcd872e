"""The command line: `serve`, `policies check|explain|init|suggest`, `demo`.

Every `serve` flag also reads from `MCP_RECOVERY_<FLAG>` (pydantic-settings); a flag given on the
command line wins over the environment. A repeatable flag's variable is named after the plural
setting and holds a JSON list (`--upstream-header` → `MCP_RECOVERY_UPSTREAM_HEADERS`,
`--allowed-host` → `MCP_RECOVERY_ALLOWED_HOSTS`, `--allowed-origin` →
`MCP_RECOVERY_ALLOWED_ORIGINS`). The command after `--` is a stdio upstream
(`MCP_RECOVERY_UPSTREAM_COMMAND` holds it as one shell-quoted string).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.upstream.stdio import early

if TYPE_CHECKING:
    from proxy.settings import Settings

# Only cheap modules above: `serve --listen stdio` starts its upstream (`proxy.upstream.stdio.early`) before the
# rest (pydantic, asyncio, the server) is imported, so that the two overlap.


def _upstream_flags(p: argparse.ArgumentParser) -> None:
    """The flags that name an HTTP/SSE upstream and how to reach it (`serve`, `policies init`)."""
    s = argparse.SUPPRESS
    p.add_argument("--upstream", default=s, help="http(s)://HOST:PORT/mcp or sse+http(s)://HOST:PORT/sse")
    p.add_argument(
        "--upstream-header",
        dest="upstream_headers",
        action="append",
        default=s,
        help="'Name: value' sent on every upstream HTTP request (repeatable)",
    )
    p.add_argument("--upstream-ca", default=s, help="PEM CA bundle for an https upstream (replaces system roots)")
    p.add_argument("--upstream-client-cert", default=s, help="PEM client certificate for mTLS to the upstream")
    p.add_argument("--upstream-client-key", default=s, help="PEM private key of the client certificate")
    p.add_argument(
        "--upstream-client-key-password-file", default=s, help="file holding the encrypted client key's passphrase"
    )
    p.add_argument(
        "--upstream-connect-timeout-s",
        type=float,
        default=s,
        help="establishing one upstream connection: TCP, egress proxy, TLS (5)",
    )
    p.add_argument(
        "--upstream-max-connections",
        type=int,
        default=s,
        help="pooled connections to an HTTP/SSE upstream, its requests at once; more wait their turn within their own"
        " timeout (one per session at the session cap, 100-1024)",
    )


def _serve_flags(p: argparse.ArgumentParser, *, demo: bool = False) -> None:
    s = argparse.SUPPRESS
    p.add_argument("--listen", default=s, help="http://HOST:PORT/PATH (default http://127.0.0.1:8080/mcp) or 'stdio'")
    if not demo:
        _upstream_flags(p)
    p.add_argument("--policies", default=s, help="policy folder (default: the built-in defaults)")
    p.add_argument("--admin", default=s, help="HOST:PORT for /metrics, /healthz, /readyz, /policies")
    p.add_argument("--allowed-host", dest="allowed_hosts", action="append", default=s, help="allowed Host (repeatable)")
    p.add_argument("--allowed-origin", dest="allowed_origins", action="append", default=s, help="allowed Origin")
    p.add_argument("--max-body-bytes", type=int, default=s)
    p.add_argument("--max-head-bytes", type=int, default=s, help="request line and headers (64 KiB; 431 beyond)")
    p.add_argument("--head-timeout-s", type=float, default=s, help="a request head must arrive within (10; 408)")
    p.add_argument("--body-timeout-s", type=float, default=s, help="a request body may stall at most (30; 408)")
    p.add_argument(
        "--max-connections",
        type=int,
        default=s,
        help="open HTTP connections per port (4096); at it, one without a complete request head is closed, else 503",
    )
    p.add_argument(
        "--max-connections-per-client",
        type=int,
        default=s,
        help="open HTTP connections per port from one client address (none: no cap per address; 503)",
    )
    p.add_argument(
        "--request-timeout-s", type=float, default=s, help="relayed requests other than tools/call (60; then an error)"
    )
    p.add_argument(
        "--max-requests-per-session", type=int, default=s, help="upstream requests in flight per session (32)"
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=s,
        help="2025 sessions at once; at it the least recently used idle one is closed first (from a session's cost:"
        " 1024 on an HTTP/SSE upstream or shared stdio children, else what the memory affords, 16-256)",
    )
    p.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=s,
        help="2025 sessions per client; at it the client's least recently used idle one is closed first (half of"
        " --max-sessions per principal with --auth jwt|tokens; else none per address)",
    )
    p.add_argument(
        "--max-upstream-per-client",
        type=int,
        default=s,
        help="one client's share of an HTTP/SSE upstream's requests in flight, every session and era (48 per principal"
        " with --auth jwt|tokens; else none per address)",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        action="append",
        default=s,
        help="proxies trusted to name the client in X-Forwarded-For, comma-separated addresses/networks;"
        " repeatable (none)",
    )
    p.add_argument(
        "--session-init-timeout-s", type=float, default=s, help="an uninitialized session is closed after (10)"
    )
    p.add_argument(
        "--stream-buffer-bytes", type=int, default=s, help="queued per response or listen stream not read (4 MiB)"
    )
    p.add_argument(
        "--replay-stream-bytes", type=int, default=s, help="kept for resumption per 2025 response stream (17 MiB)"
    )
    p.add_argument("--replay-total-bytes", type=int, default=s, help="kept for resumption in total (64 MiB)")
    p.add_argument(
        "--era-bridge",
        choices=["on", "off"],
        default=s,
        help="2026-07-28 clients in front of a 2025-only upstream: served over a 2025 session (on, default) or refused",
    )
    p.add_argument(
        "--era-bridge-sessions",
        type=int,
        default=s,
        help="2025 sessions the bridge holds for requests whose server may ask the 2026 caller "
        "(an eighth of --max-sessions, 1 to 16; 0: none)",
    )
    p.add_argument(
        "--era-bridge-input-wait-s",
        type=float,
        default=s,
        help="a bridged request waiting on its 2026 caller's answers is held this long (300)",
    )
    p.add_argument(
        "--resend-window-s",
        type=float,
        default=s,
        help="an undelivered answer of a tool that is not read-only is kept this long for its re-send (300; 0: off)",
    )
    p.add_argument(
        "--resend-total-bytes", type=int, default=s, help="undelivered answers kept for re-sends, together (64 MiB)"
    )
    p.add_argument("--stderr-burst-lines", type=int, default=s, help="stdio child output lines logged at once (100)")
    p.add_argument(
        "--stderr-lines-per-s", type=float, default=s, help="stdio child output lines logged a second after (20)"
    )
    p.add_argument(
        "--max-concurrent-calls", type=int, default=s, help="tools/call in flight before 'overloaded' (4096)"
    )
    p.add_argument("--session-idle-timeout-s", type=float, default=s)
    p.add_argument(
        "--stdio-spares", type=int, default=s, help="warm pool: stdio children started ahead for 2025 sessions (1)"
    )
    p.add_argument(
        "--stdio-spares-max",
        type=int,
        default=s,
        help="warm pool: the most spares it grows to under bursts of 2025 sessions (16; 1: no growth)",
    )
    p.add_argument(
        "--stdio-sessions",
        choices=["per-session", "shared"],
        default=s,
        help="2025 sessions over a stdio upstream: a child each (default), or a few shared children",
    )
    p.add_argument(
        "--stdio-shared-children",
        type=int,
        default=s,
        help="with --stdio-sessions shared: the most children the sessions share (2)",
    )
    p.add_argument(
        "--stdio-modern-children",
        type=int,
        default=s,
        help="2026-07-28 requests over a stdio upstream: the most children they spread over (1: one serves all;"
        " more only for a server that keeps no state between requests)",
    )
    p.add_argument(
        "--stdio-spare-starts", type=int, default=s, help="warm-pool children started at once while it refills (2)"
    )
    p.add_argument(
        "--stdio-start-timeout-s",
        type=float,
        default=s,
        help="a stdio child must answer its handshake within, from its start (10); up to 6 times that while it is"
        " still busy starting (a busy host); more for a start that waits on the network",
    )
    p.add_argument(
        "--stdio-max-starting",
        type=int,
        default=s,
        help="stdio children starting at once; the others wait their turn (0: the CPU count, at least 2)",
    )
    p.add_argument(
        "--stdio-nice",
        type=int,
        default=s,
        help="stdio children run this much below the proxy's CPU priority, so that a busy server does not delay"
        " the proxy's timers (0-19; default 10 listening over HTTP, 0 with --listen stdio)",
    )
    p.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=s,
        help="on SIGTERM (or stdin closing, with --listen stdio): calls in flight may finish within (20)",
    )
    p.add_argument("--ready-check-interval-s", type=float, default=s, help="/readyz re-checks a network upstream")
    p.add_argument(
        "--auth",
        choices=["none", "passthrough", "jwt", "tokens"],
        default=s,
        help="who may call: none (default), passthrough (the upstream authenticates), jwt, tokens",
    )
    p.add_argument("--public-url", default=s, help="the URL clients dial, endpoint path included")
    p.add_argument("--auth-issuer", default=s, help="jwt: the issuer URL whose metadata names its JWKS")
    p.add_argument("--auth-audience", default=s, help="jwt: the audience tokens must name (default: --public-url)")
    p.add_argument(
        "--auth-jwt-typ",
        choices=["at+jwt", "any"],
        default=s,
        help="jwt: accept only typ at+jwt (RFC 9068), or any typ (default: the audience check does the work)",
    )
    p.add_argument("--auth-tokens-file", default=s, help="tokens: 'NAME TOKEN' per line, '#' comments; hot-reloaded")
    p.add_argument(
        "--auth-hash-key-file", default=s, help="passthrough: the credential hash's key (share it between replicas)"
    )
    p.add_argument("--admin-token-file", default=s, help="a bearer token required for /metrics and /policies")
    p.add_argument(
        "--vouch-pings-burst",
        type=int,
        default=s,
        help="passthrough: pings at once per session asking the upstream about a credential not yet accepted (5)",
    )
    p.add_argument(
        "--vouch-pings-per-s", type=float, default=s, help="passthrough: such pings a second after the burst (1; 429)"
    )
    p.add_argument(
        "--state",
        default=s,
        help="memory (default) or a shared store: redis://, rediss://, valkey://, redis+cluster:// (docs/state.md)",
    )
    p.add_argument("--state-ca", default=s, help="PEM CA bundle trusted for a rediss:// store (not the system roots)")
    p.add_argument("--state-client-cert", default=s, help="PEM client certificate for a rediss:// store (mTLS)")
    p.add_argument("--state-client-key", default=s, help="PEM private key of --state-client-cert")
    p.add_argument("--state-prefix", default=s, help="key prefix in the shared store (mcp-recovery:)")
    p.add_argument("--state-timeout-s", type=float, default=s, help="bound of every store operation (0.5)")
    p.add_argument(
        "--state-sync-interval-s", type=float, default=s, help="retry budget counts exchanged with the store (0.25)"
    )
    p.add_argument(
        "--state-required-for-ready",
        action="store_true",
        default=s,
        help="an unreachable shared store fails /readyz (default: serve on local state)",
    )
    p.add_argument("--log-level", default=s)
    p.add_argument("--log-json", action="store_true", default=s)
    p.add_argument(
        "--call-log",
        choices=["all", "problems", "off"],
        default=s,
        help="tools/call log lines: problems (default: all but first-attempt successes), all, off",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcp-recovery-proxy", description="A recovery proxy for MCP tool servers.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the proxy in front of an upstream MCP server",
        usage="%(prog)s [flags] [--upstream URL | -- COMMAND [ARG ...]]",
        description="Run the proxy in front of an upstream MCP server: a Streamable HTTP or SSE server\n"
        "(--upstream URL), or a stdio server it spawns and supervises: the command after `--`.",
        epilog="examples:\n"
        "  mcp-recovery-proxy serve --listen http://127.0.0.1:8080/mcp -- npx -y some-mcp-server\n"
        "  mcp-recovery-proxy serve --listen stdio --upstream http://127.0.0.1:3001/mcp\n"
        "  MCP Inspector CLI (it strips the first `--`, so put the proxy after its own flags and `--`):\n"
        "  npx @modelcontextprotocol/inspector --cli --method tools/list \\\n"
        "      -- mcp-recovery-proxy serve --listen stdio -- npx -y some-mcp-server",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _serve_flags(serve)
    demo = sub.add_parser("demo", help="run the proxy in front of a bundled, deliberately flaky demo server")
    _serve_flags(demo, demo=True)
    pol = sub.add_parser("policies", help="validate a policy folder, explain one tool's policy, or draft a folder")
    psub = pol.add_subparsers(dest="policies_command", required=True)
    check = psub.add_parser("check", help="validate every file of a policy folder")
    check.add_argument("dir")
    explain = psub.add_parser("explain", help="the effective policy of one tool and where each value came from")
    explain.add_argument("dir")
    explain.add_argument("tool")
    explain.add_argument("--annotations", help="the tool's MCP annotations as JSON, e.g. '{\"readOnlyHint\": true}'")
    explain.add_argument("--json", action="store_true", help="print JSON")
    init = psub.add_parser(
        "init",
        help="draft a policy folder from a server's tools/list",
        usage="%(prog)s DIR [flags] [--upstream URL | -- COMMAND [ARG ...]]",
        description="List the tools of a server (every page) and write a policy folder for a person to\n"
        "review: the shipped defaults.yaml, and a file per tool with its side-effect class from its\n"
        "annotations, each inferred value with a comment saying where it came from. An existing\n"
        "folder is never overwritten: new files are written beside its files, and a file that would\n"
        "differ is left as it is and printed as a diff (exit status 1).",
        epilog="examples:\n"
        "  mcp-recovery-proxy policies init policies/ -- npx -y @modelcontextprotocol/server-memory\n"
        "  mcp-recovery-proxy policies init policies/ --upstream http://127.0.0.1:3001/mcp --dry-run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suggest = psub.add_parser(
        "suggest",
        help="suggest changes to a policy folder from what a running proxy observed",
        description="Read what a running proxy observed (its admin port's /status.json, or a saved copy):\n"
        "per tool the latency of successful attempts, the error texts nothing classified, the tools\n"
        "no policy file names and the rules that never matched; print the changes to DIR as a unified\n"
        "diff (apply it inside DIR with `patch -p1` or `git apply`) and a summary on stderr.",
        epilog="examples:\n"
        "  mcp-recovery-proxy policies suggest policies/ --admin 127.0.0.1:9464 > suggested.patch\n"
        "  mcp-recovery-proxy policies suggest policies/ --from-file status.json --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suggest.add_argument("dir")
    source = suggest.add_mutually_exclusive_group(required=True)
    source.add_argument("--admin", help="the proxy's admin address, HOST:PORT or URL")
    source.add_argument("--from-file", help="a saved /status.json of the proxy")
    suggest.add_argument("--admin-token-file", help="a file holding the admin token (--admin-token-file of serve)")
    suggest.add_argument("--json", action="store_true", help="print the findings and the patch as JSON")
    init.add_argument("dir")
    _upstream_flags(init)
    init.add_argument("--dry-run", action="store_true", help="print what would be written; write nothing")
    init.add_argument(
        "--timeout-s", type=float, default=60.0, help="the whole listing, process start included, must end within (60)"
    )
    return parser


def _configure_logging(settings: Settings) -> None:
    from proxy.telemetry.logsetup import configure

    configure(level=settings.log_level, json_lines=settings.log_json)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    early.start(argv)
    try:
        return _main(argv)
    finally:
        early.discard()  # one nobody took: the settings were invalid, or the proxy stopped early


def _main(argv: list[str]) -> int:
    import asyncio
    import shlex

    from pydantic import ValidationError

    from proxy.errors import PolicyError
    from proxy.settings import Settings

    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        hint = ""
        if args.command in ("serve", "demo") and not command and not extra[0].startswith("-"):
            # A launcher that strips `--` (the MCP Inspector CLI does) passed the server's command
            # as arguments of ours: say where it belongs instead of only "unrecognized".
            hint = (
                "; a stdio upstream goes after `--` (mcp-recovery-proxy serve [flags] -- COMMAND ...). A launcher"
                " that strips `--`, like the MCP Inspector CLI, needs its own `--` before the proxy's command:"
                " inspector --cli --method tools/list -- mcp-recovery-proxy serve --listen stdio -- COMMAND ..."
            )
        parser.error(f"unrecognized arguments: {' '.join(extra)[:200]}{hint}")
    if args.command == "policies":
        from proxy.policy import cli as policy_cli

        if args.policies_command == "check":
            return policy_cli.check(args.dir)
        if args.policies_command == "suggest":
            return policy_cli.suggest(
                args.dir,
                admin=args.admin,
                admin_token_file=args.admin_token_file,
                from_file=args.from_file,
                as_json=args.json,
            )
        if args.policies_command == "init":
            from proxy.policy import init as policy_init

            upstream = {k: v for k, v in vars(args).items() if k.startswith("upstream")}
            if command:
                upstream.update(upstream_command=shlex.join(command), listen="stdio")
            return policy_init.run(args.dir, upstream, dry_run=args.dry_run, timeout_s=args.timeout_s)
        return policy_cli.explain(args.dir, args.tool, args.annotations, as_json=args.json)
    values: dict[str, Any] = {k: v for k, v in vars(args).items() if k not in ("command", "policies_command")}
    if command:
        values["upstream_command"] = shlex.join(command)
    if args.command == "demo":
        values["upstream_command"] = shlex.join([sys.executable, "-m", "proxy.demo.server"])
        # One refund book for every demo server process of this run (each 2025 session has its own).
        import atexit
        import tempfile

        state = Path(tempfile.gettempdir()) / f"mcp-recovery-proxy-demo-{os.getpid()}.json"
        if "DEMO_STATE_FILE" not in os.environ:
            os.environ["DEMO_STATE_FILE"] = str(state)
            atexit.register(lambda: state.unlink(missing_ok=True))
    try:
        settings = Settings(**values)
        if args.command == "demo" and "policies" not in values:
            settings = settings.model_copy(update={"policies": _demo_policies()})
        _configure_logging(settings)
        from proxy.server import run

        if args.command == "demo":
            _print_demo_banner(settings)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(run(settings))
    except PolicyError as exc:
        print(f"mcp-recovery-proxy: the policy folder is invalid ({len(exc.problems)} problems):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            print(f"mcp-recovery-proxy: --{where.replace('_', '-')}: {err['msg']}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"mcp-recovery-proxy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _loop_factory() -> Any:
    """uvloop when it is installed (uvicorn[standard] brings it): the proxy's own loop, not uvicorn's,
    since both servers run inside it. Set MCP_RECOVERY_ASYNCIO_LOOP=asyncio to use the stdlib loop."""
    if os.environ.get("MCP_RECOVERY_ASYNCIO_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _demo_policies() -> Any:
    return Path(__file__).with_name("demo") / "policies"


def _print_demo_banner(settings: Settings) -> None:
    where = settings.listen
    admin = f"http://{settings.admin}" if settings.admin else None
    lines = [
        "mcp-recovery-proxy demo: the proxy in front of a bundled, deliberately flaky MCP server.",
        "",
        f"  MCP endpoint (Streamable HTTP, both protocol eras): {where}",
    ]
    if admin:
        lines.append(f"  status page (open it in a browser): {admin}/")
        lines.append(f"  admin: {admin}/readyz  {admin}/metrics  {admin}/policies")
    lines += [
        "",
        "Try, with any MCP client (for example the MCP inspector CLI):",
        f"  npx @modelcontextprotocol/inspector --cli {where} --transport http --method tools/list",
        f"  npx @modelcontextprotocol/inspector --cli {where} --transport http --method tools/call "
        "--tool-name lookup_customer --tool-arg customer_id=c-42",
        "",
        "  lookup_customer  fails twice, then answers: recovered within one call",
        "  search_archive   the archive is down: an unresolved result with every attempt and what it found",
        "  refund           state-changing and slow: reported as outcome unknown, never repeated",
        "  refund_status    the status check a refund's result points to",
        "  slow_report      progress notifications relayed through the proxy",
        "",
        "A second identical search_archive call within 60 s is refused by the ledger; a coordinator",
        'opens one fresh budget by repeating it with _meta {"io.mcp-recovery-proxy/approveBudget":',
        '"<budgetId from the first result>"} (single use).',
        "",
        "Stop with Ctrl-C.",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


if __name__ == "__main__":  # pragma: no cover
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
