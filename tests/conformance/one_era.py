"""What the one-era wrappers of the everything-server share (everything_stdio_2025_only.py,
everything_stdio_2026_only.py): run a stdio server as a child, relay every line both ways
unchanged, except the requests the wrapper answers itself as a server of one era would.

`relay(refusal, server)`: `refusal(message)` is the wrapper's own answer to a client message, None
to pass it on, or {} to drop it (a notification that server would ignore); `server` is the Python
script and arguments of the child. Returns the child's exit status once stdin closed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

Refusal = Callable[[dict], "dict | None"]


def relay(refusal: Refusal, server: Sequence[str]) -> int:
    child = subprocess.Popen([sys.executable, *server], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    out_lock = threading.Lock()

    def write_out(line: bytes) -> None:
        with out_lock:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    def pump_child() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            write_out(line)

    threading.Thread(target=pump_child, daemon=True).start()
    try:
        for line in sys.stdin.buffer:
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            answer = refusal(message) if isinstance(message, dict) else None
            if answer is not None:
                if answer:
                    write_out(json.dumps(answer).encode() + b"\n")
                continue
            child.stdin.write(line)
            child.stdin.flush()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    child.stdin.close()
    try:
        return child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()
