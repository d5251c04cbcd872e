"""The SDK's everything-server over stdio, restricted to the 2026-07-28 revision: a thin wrapper
that refuses the 2025 handshake exactly as a server of 2026-07-28 alone does (the mirror of
everything_stdio_2025_only.py).

It starts everything_stdio.py (or the Python script and arguments given), relays every line both
ways unchanged, and answers itself what a
2026-only server refuses: `initialize` gets the -32022 "Unsupported protocol version" error naming
the versions it supports (the 2026 error for a revision the server does not speak), and any other
request without the 2026 `_meta` protocol version gets -32602 (the 2026 answer to a request that
lacks the required `_meta`); notifications without it (`notifications/initialized`) are dropped.
Used to run the conformance suite's 2025-11-25 leg through the proxy's era bridge
(test_conformance.py) and by tests/e2e/test_era_bridge_legacy.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from one_era import relay  # run as a script: this folder is on sys.path

HERE = Path(__file__).resolve().parent
MODERN_META = "io.modelcontextprotocol/protocolVersion"
SUPPORTED = ["2026-07-28"]


def refusal(message: dict) -> dict | None:
    """The answer a 2026-only server gives to `message` itself, or None to pass it on. A
    notification it would drop is answered with {} (nothing is written)."""
    if "method" not in message:
        return None
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    modern = isinstance(meta, dict) and MODERN_META in meta
    if "id" not in message:
        return None if modern or message["method"] == "notifications/cancelled" else {}
    if message["method"] == "initialize":
        requested = params.get("protocolVersion") if isinstance(params, dict) else None
        data = {"supported": SUPPORTED, "requested": requested}
        error = {"code": -32022, "message": "Unsupported protocol version", "data": data}
        return {"jsonrpc": "2.0", "id": message["id"], "error": error}
    if not modern:
        error = {"code": -32602, "message": f"Missing required _meta field: {MODERN_META}"}
        return {"jsonrpc": "2.0", "id": message["id"], "error": error}
    return None


def main() -> int:
    return relay(refusal, sys.argv[1:] or [str(HERE / "everything_stdio.py")])


if __name__ == "__main__":
    sys.exit(main())
