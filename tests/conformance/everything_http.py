"""Run the SDK's everything-server over Streamable HTTP on 127.0.0.1 with uvicorn's h11 parser.

Same app as ``mcp-everything-server --port P`` (event store for SSE resumability, 100 ms retry),
except that the HTTP implementation is pinned. ``mcp-everything-server`` lets uvicorn choose, and
uvicorn takes httptools whenever it is installed (this project depends on ``uvicorn[standard]``).
Behind httptools the server keeps the surrounding whitespace of a header value, so it fails the
2026-07-28 check ``sep-2243-server-accepts-whitespace-header-value``
(``Mcp-Name: "  test_simple_text  "`` gets 400/-32020). Behind h11, which strips that whitespace
as RFC 9110 §5.5 says, it scores 40/40. The reference must not depend on which optional packages
happen to be installed.

Usage: python everything_http.py PORT
"""

import logging
import sys

import uvicorn
from mcp_everything_server.server import event_store, mcp

if __name__ == "__main__":
    port = int(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = mcp.streamable_http_app(event_store=event_store, retry_interval=100, host="127.0.0.1")
    uvicorn.run(app, host="127.0.0.1", port=port, http="h11", log_level="warning")
