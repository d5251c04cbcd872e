"""Run an upstream command so that nothing it starts can outlive the proxy.

Usage (by `proxy.upstream.stdio`, never by hand): python -I -S _guard.py PARENT_PID -- COMMAND [ARGS...]

The proxy starts this guard in a new session (so the guard leads its own process group) with the
upstream's stdin/stdout/stderr. The guard:
- asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG), which also covers the
  proxy being killed with SIGKILL, and exits at once if the parent is already gone;
- runs the command as its child in the same process group, so `npx` and shells, which spawn
  grandchildren, stay in the group;
- on SIGTERM/SIGINT/SIGHUP, or when the command exits, signals the whole group (SIGTERM, then
  SIGKILL after a grace period) and exits with the command's status.

Only the standard library is used (it runs with -S for a fast start). Why a guard process and not
just PDEATHSIG on the upstream: PDEATHSIG is per process and is not inherited, so a grandchild of
`npx` would survive a killed proxy; a process group alone is not signalled when its parent dies.
"""

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
GRACE_S = 2.0


def _set_parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: fall back to polling the parent below
        pass


class _Stop(Exception):
    pass


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        # Only the guard itself may be left in the group; reap children meanwhile.
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if _group_is_only_me(pgid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _group_is_only_me(pgid: int) -> bool:
    me = os.getpid()
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
                return False
    except OSError:
        return False
    return True


def main() -> int:
    argv = sys.argv[1:]
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: _guard.py PARENT_PID -- COMMAND [ARGS...]\n")
        return 2
    parent = int(argv[0])
    command = argv[2:]
    _set_parent_death_signal()
    if os.getppid() != parent:  # the proxy died before the death signal was armed
        return 1
    pgid = os.getpgrp()

    def on_signal(signum: int, _frame: object) -> None:
        raise _Stop

    status = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, on_signal)
        try:
            child = os.posix_spawnp(command[0], command, os.environ)
        except OSError as exc:
            sys.stderr.write(f"cannot start upstream command {command[0]!r}: {exc.strerror}\n")
            return 127
        while True:
            try:
                pid, wstatus = os.waitpid(child, 0)
            except ChildProcessError:
                break
            if pid == child:
                status = os.waitstatus_to_exitcode(wstatus)
                break
    except _Stop:
        _kill_group(pgid)
        return 143
    _kill_group(pgid)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
