"""Run an upstream command so that nothing it starts can outlive the proxy.

Usage (by `proxy.upstream.stdio`, by its path, never by hand): python -I -S _guard.py PARENT_PID -- COMMAND [ARGS...]

The proxy starts this guard in a new session (so the guard leads its own process group) with the
upstream's stdin/stdout/stderr. The guard:
- asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG), which also covers the
  proxy being killed with SIGKILL, and exits at once if the parent is already gone;
- runs the command as its child in the same process group, so `npx` and shells, which spawn
  grandchildren, stay in the group;
- on SIGTERM/SIGINT/SIGHUP, or when the command exits, signals the whole group (SIGTERM, then
  SIGKILL after a grace period) and exits with the command's status;
- gives the command the proxy's environment without the proxy's own settings (`MCP_RECOVERY_*`,
  among them the shared store's URL and its password): the server's variables pass, the proxy's
  stay with it;
- keeps no copy of the command's stdin and stdout (its own become /dev/null once the command
  runs), so a command that closes its stdout is seen to end it;
- is a child subreaper (PR_SET_CHILD_SUBREAPER): a process that left the group (`setsid`,
  `setpgid`) is still in the guard's tree, and becomes the guard's own child once its parent is
  gone. When the group has been ended, so are those (SIGTERM, then SIGKILL), before the guard
  exits: otherwise a grandchild that called `setsid` while holding the pipes would outlive the
  command, the guard and the proxy's stop, and keep the child's stdout open, so that the proxy
  would never see its end.

Only the standard library is used (it runs with -S for a fast start). Why a guard process and not
just PDEATHSIG on the upstream: PDEATHSIG is per process and is not inherited, so a grandchild of
`npx` would survive a killed proxy; a process group alone is not signalled when its parent dies.
"""

import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping  # (collections is loaded already: ctypes imports it)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 2.0
# What left the group gets less: the proxy's own stop sends SIGKILL to the group (the guard with
# it) 0.5 s after its SIGTERM, and the guard must have ended those by then.
ESCAPED_GRACE_S = 0.3
OWN_PREFIX = "MCP_RECOVERY_"


def child_environment(environ: "Mapping[str, str]") -> dict[str, str]:
    """The command's environment: the proxy's, but for the proxy's own settings (`MCP_RECOVERY_*`:
    the shared store's URL with its password, the admin token file, the auth settings), which are
    none of the server's business."""
    return {name: value for name, value in environ.items() if not name.startswith(OWN_PREFIX)}


def _set_parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: fall back to polling the parent below
        pass


class _Stop(Exception):
    pass


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        _end_group(pgid)
    finally:
        _end_escaped()


def _end_group(pgid: int) -> None:
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
        _reap()
        if _group_is_only_me(pgid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _processes() -> Iterator[tuple[int, list[bytes]]]:
    """Each live process other than the guard, with the fields of its /proc/PID/stat after the
    command name (state, ppid, pgrp, session, ...). Raises OSError when /proc cannot be listed."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it exited meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z":
            yield int(entry), fields


def _my_children() -> list[int]:
    """The live processes whose parent is the guard: once the group is gone, only those that left
    it (an orphan is re-parented to the guard, its subreaper)."""
    me = os.getpid()
    try:
        return [pid for pid, fields in _processes() if int(fields[1]) == me]
    except OSError:
        return []


def _end_escaped() -> None:
    """End what left the group: SIGTERM to each of the guard's children, SIGKILL to what is left
    after the grace period (and to what their ends re-parent to the guard meanwhile), bounded."""
    signalled: set[int] = set()
    deadline = time.monotonic() + ESCAPED_GRACE_S
    while True:
        _reap()
        pids = _my_children()
        if not pids:
            return
        late = time.monotonic() >= deadline
        for pid in pids:
            if late or pid not in signalled:
                signalled.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                except ProcessLookupError:
                    pass
        if late and time.monotonic() >= deadline + GRACE_S:
            return
        time.sleep(0.02)


def _group_is_only_me(pgid: int) -> bool:
    try:
        return not any(int(fields[2]) == pgid for _, fields in _processes())
    except OSError:
        return False


def _let_go_of_the_pipes() -> None:
    """The command has the proxy's stdin and stdout; the guard keeps no copy of its own (they
    become /dev/null). A copy kept here would hold the command's stdout open: a server that
    closed its stdout and kept running would never be seen to end, and its link would wait for
    ever."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in (0, 1):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


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
            child = os.posix_spawnp(command[0], command, child_environment(os.environ))
        except OSError as exc:
            sys.stderr.write(f"cannot start upstream command {command[0]!r}: {exc.strerror}\n")
            return 127
        _let_go_of_the_pipes()
        while True:
            try:
                # any child: orphans re-parented to the guard are reaped as they end
                pid, wstatus = os.waitpid(-1, 0)
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
