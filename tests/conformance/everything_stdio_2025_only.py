"""The SDK's everything-server over stdio, restricted to the 2025 handshake revisions: a thin wrapper
that refuses the 2026-07-28 revision exactly as a server of the 2025 era does (the TypeScript SDK
1.x servers answer `server/discover`, which they do not know, with -32601 "Method not found").

It starts everything_stdio.py (or the Python script and arguments given), relays every line both
ways unchanged, and answers itself the one
2026 request a 2025 server could be sent first: `server/discover`; any other request carrying the
2026 `_meta` protocol version gets the -32022 refusal naming the versions it supports. Used to run
the conformance suite's 2026-07-28 leg through the proxy's era bridge (test_conformance.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from one_era import relay  # run as a script: this folder is on sys.path

HERE = Path(__file__).resolve().parent
MODERN_META = "io.modelcontextprotocol/protocolVersion"
SUPPORTED = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]


def refusal(message: dict) -> dict | None:
    """The answer a 2025-only server gives to `message` itself, or None to pass it on."""
    if "id" not in message or "method" not in message:
        return None
    if message["method"] == "server/discover":
        return {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "Method not found"}}
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and MODERN_META in meta:
        data = {"supported": SUPPORTED, "requested": meta[MODERN_META]}
        error = {"code": -32022, "message": "Unsupported protocol version", "data": data}
        return {"jsonrpc": "2.0", "id": message["id"], "error": error}
    return None


def main() -> int:
    return relay(refusal, sys.argv[1:] or [str(HERE / "everything_stdio.py")])


if __name__ == "__main__":
    sys.exit(main())
