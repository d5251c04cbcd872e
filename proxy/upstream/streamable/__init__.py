"""Streamable HTTP upstream, both protocol eras, at the JSON-RPC message level.

One module per job:
- `owner.py`: an upstream reached over HTTP (URL, headers, the HTTP client, TLS reload, health,
  the translation of the client's exceptions); shared with the legacy SSE transport.
- `upstream.py`: `HttpUpstream`, which opens the links; `probe.py`: which eras it speaks.
- `link.py`: what both eras' links share (the POST of a request, its fast path, reading and
  routing its answer); `modern.py`: the 2026-07-28 link; `legacy.py`: the 2025 link and its
  session (re-establishment, the standalone stream, resumption, passthrough credentials).
- `posts.py`: the POSTs that are not exchanges (probe and replay requests, notifications).
- `failures.py`: exceptions and HTTP answers as `UpstreamFailure`; `messages.py`: a JSON or
  event-stream body as JSON-RPC messages; `headers.py`: the MCP headers and their encoding.

The names below are what the rest of the proxy and its tests use.
"""

from proxy.upstream.streamable.failures import forgot_session, translate_exception
from proxy.upstream.streamable.headers import encode_header_value
from proxy.upstream.streamable.legacy import HttpLegacyLink
from proxy.upstream.streamable.modern import HttpModernLink
from proxy.upstream.streamable.owner import HttpClientOwner
from proxy.upstream.streamable.upstream import HttpUpstream

__all__ = [
    "HttpClientOwner",
    "HttpLegacyLink",
    "HttpModernLink",
    "HttpUpstream",
    "encode_header_value",
    "forgot_session",
    "translate_exception",
]
