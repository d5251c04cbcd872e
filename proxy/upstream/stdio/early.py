"""Start the stdio upstream of `serve --listen stdio` before the proxy's own imports.

Contract:
- `start(argv)` is the first thing `proxy.cli.main` does. When `argv` plainly asks for
  `serve --listen stdio` with a command (after `--`, else `MCP_RECOVERY_UPSTREAM_COMMAND`), it
  starts that command under `_guard.py` exactly as `StdioUpstream.spawn` would (its own session
  and process group, stdin/stdout/stderr piped, other descriptors closed, the guard told the
  proxy's pid), so the child boots while the proxy imports pydantic, uvicorn, OpenTelemetry and
  sets itself up. Anything unusual (help, an abbreviated or unknown way to say `--listen`,
  `--upstream` as well, an unparsable command) starts nothing: the normal path then spawns the
  child itself, so this is only ever an earlier start, never a different one.
- `take(command)` hands the early child, once, to the `StdioUpstream` whose command is exactly the
  one started; a later child (a respawn) is spawned the normal way.
- `discard()` ends an early child nobody took (the settings were invalid, the proxy stopped before
  the upstream was built). A proxy that dies without calling it still takes the child with it:
  the guard's parent-death signal does that.

Only the standard library, and only cheap modules of it, are imported here (and by the package's
`__init__`, which runs first): whatever this module costs is added to the client's wait before
the child even starts.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

GUARD = str(Path(__file__).with_name("_guard.py"))


class EarlyChild:
    """A started guard process: the `Popen` (kept so the stdlib never reaps it behind our back;
    its exit is read through `pidfd`) and the command it runs."""

    __slots__ = ("command", "pidfd", "popen")

    def __init__(self, command: list[str], popen: subprocess.Popen[bytes], pidfd: int) -> None:
        self.command = command
        self.popen = popen
        self.pidfd = pidfd

    def kill(self, grace_s: float = 2.0) -> None:
        """End the guard's whole group now: SIGTERM (the guard then ends the command's group), and
        SIGKILL to the group if it is still there after `grace_s`, as `Child.terminate` does for
        a spawned child. The guard escalates by itself when it can act; a guard that cannot (not
        yet past its start, stopped, or stuck) must not leave a command that ignores SIGTERM
        running with the proxy's pipes."""
        import signal

        pid = self.popen.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.popen.poll() is not None:
                break
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        # The guard is gone; anything of its group it left behind goes too (no one else can have
        # this group id while a member of it lives).
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for f in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if f is not None:
                f.close()
        try:
            os.close(self.pidfd)
        except OSError:
            pass


_early: EarlyChild | None = None


def command_from_argv(argv: list[str], environ: Mapping[str, str]) -> list[str] | None:
    """The command `serve --listen stdio` will run, when `argv` says so plainly; else None."""
    if not argv or argv[0] != "serve":
        return None
    opts, command = argv[1:], []
    if "--" in opts:
        i = opts.index("--")
        opts, command = opts[:i], opts[i + 1 :]
    listen = environ.get("MCP_RECOVERY_LISTEN")
    i = 0
    while i < len(opts):
        token = opts[i]
        if token in ("-h", "--help") or token == "--upstream" or token.startswith("--upstream="):
            return None
        if token == "--listen":
            if i + 1 >= len(opts):
                return None
            listen = opts[i + 1]
            i += 2
            continue
        if token.startswith("--listen="):
            listen = token.partition("=")[2]
        elif token.startswith("--l") and "--listen".startswith(token.partition("=")[0]):
            return None  # an abbreviation argparse would accept: leave it to the normal path
        i += 1
    if listen != "stdio" or environ.get("MCP_RECOVERY_UPSTREAM"):
        return None
    if not command:
        try:
            command = shlex.split(environ.get("MCP_RECOVERY_UPSTREAM_COMMAND") or "")
        except ValueError:
            return None
    return command or None


def start(argv: list[str]) -> None:
    """Start the upstream now if `argv` is `serve --listen stdio -- CMD` (see the module doc)."""
    global _early
    if _early is not None or not hasattr(os, "pidfd_open"):
        return
    command = command_from_argv(argv, os.environ)
    if command is None:
        return
    guard_argv = [sys.executable, "-I", "-S", GUARD, str(os.getpid()), "--", *command]
    try:
        popen = subprocess.Popen(
            guard_argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
        )
    except OSError:
        return  # the normal path tries again and reports it
    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError:  # a kernel without pidfd: no early start
        _early = None
        EarlyChild(command, popen, -1).kill()
        return
    _early = EarlyChild(command, popen, pidfd)


def take(command: list[str]) -> EarlyChild | None:
    """The early child if it runs exactly `command` (once); None otherwise."""
    global _early
    early = _early
    if early is None:
        return None
    _early = None
    if early.command != list(command):
        early.kill()
        return None
    return early


def discard() -> None:
    """End an early child that no upstream took."""
    global _early
    early, _early = _early, None
    if early is not None:
        early.kill()
