"""A stdio MCP upstream that writes back whatever its caller tells it to: the fuzz tests' way to
put arbitrary upstream output in front of the proxy's relay.

    python tests/fuzz/mirror_upstream.py

It answers `initialize`, `server/discover`, `tools/list` (one tool, `mirror`) and `ping` as a
server of both eras would. A `tools/call` of `mirror` with `arguments.emit` (a list of base64
strings) writes each decoded string as one stdout line, with every `@ID@` replaced by the call's
JSON id, and then always a valid final result (`{"content": [], "isError": false}`) so that no
call waits for an answer that never comes. Any other request gets `{}`; notifications nothing.
Only the standard library: it starts in a few milliseconds.
"""

from __future__ import annotations

import base64
import json
import sys

TOOL = {
    "name": "mirror",
    "description": "writes back what it is told",
    "inputSchema": {"type": "object"},
    "annotations": {"readOnlyHint": True},
}
INFO = {"name": "mirror-upstream", "version": "0"}
CAPS = {"tools": {"listChanged": False}}


def _write(raw: bytes) -> None:
    sys.stdout.buffer.write(raw + b"\n")
    sys.stdout.buffer.flush()


def _answer(id_: object, result: object) -> None:
    _write(json.dumps({"jsonrpc": "2.0", "id": id_, "result": result}).encode())


def main() -> None:
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or "id" not in message or "method" not in message:
            continue
        id_, method = message["id"], message["method"]
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        if method == "initialize":
            version = params.get("protocolVersion", "2025-11-25")
            _answer(id_, {"protocolVersion": version, "capabilities": CAPS, "serverInfo": INFO})
        elif method == "server/discover":
            _answer(
                id_,
                {
                    "supportedVersions": ["2026-07-28"],
                    "capabilities": CAPS,
                    "serverInfo": INFO,
                    "resultType": "complete",
                },
            )
        elif method == "tools/list":
            _answer(id_, {"tools": [TOOL]})
        elif method == "tools/call":
            emit = (params.get("arguments") or {}).get("emit") or []
            for item in emit:
                raw = base64.b64decode(item)
                _write(raw.replace(b"@ID@", json.dumps(id_).encode()))
            _answer(id_, {"content": [], "isError": False})
        else:
            _answer(id_, {})


if __name__ == "__main__":
    main()
