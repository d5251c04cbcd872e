"""A small HTTP/1.1 client for one upstream origin, on `httptools` and an `asyncio.Protocol`.

Why it exists: relaying a call to an HTTP upstream spent most of its CPU in the general-purpose
client (aiohttp's session, connector, request/response objects, timers and tasks). The proxy talks
to one origin per upstream, sends small JSON bodies, owns every retry and every attempt timeout,
and needs to know exactly when a request may have reached the peer. A client built for that shape
can skip most of the work: no task per request, no timer unless one is armed, one write per
request, and a response whose body usually arrived in the same `data_received` as its head.

What it deliberately does not do: redirects (a 3xx is returned as is), reading proxy settings
from the environment (`proxy/net/egress.py` does, and hands it a `ProxyRoute`), retries of
any kind (a failed request is reported, never repeated), read timeouts (the caller bounds each
attempt), pipelining, HTTP/2, `Expect: 100-continue`.

Egress proxy: with a `ProxyRoute`, every connection is a CONNECT tunnel through the proxy (for
`http://` origins too), with `Proxy-Authorization` on the CONNECT request only and TLS to the
origin inside the tunnel (`loop.create_connection(sock=...)` on the tunnelled socket). Tunnels are
pooled exactly like direct connections. A proxy that refuses the tunnel (407, 403, 502...) is a
`ProxyRefused`, a `ConnectError`: nothing reached the origin. Requests themselves are unchanged
(origin-form targets, the origin's Host), so the direct path pays nothing for this.

TLS: a handshake the client rejects (unknown CA, host name mismatch) or the server rejects with an
alert is a `TlsError`, a `ConnectError` whose message says what failed. In TLS 1.3 a server checks
the client's certificate after the client has finished its handshake, so a missing or refused
client certificate shows only when the first request's answer should come: an alert then (OpenSSL,
Go, Envoy servers) is a `TlsError` too, nothing having been processed; a bare close (asyncio
servers such as uvicorn send no alert) of a new TLS connection before any byte of its first answer
is a `TlsClosed`, also a `ConnectError` but with `dispatch_known=False`: the upstream most likely
refused the handshake, but a server that died at that moment looks the same.

The modules, each with one job:
- `errors`: the exception types and the texts of TLS failures;
- `headers`: response headers, the origin's cookies, the bytes of a request head;
- `reader`: a sans-I/O response reader (bytes in, head/body/end events out);
- `response`: a response as its caller reads it (body buffer, decoding, bound, back-pressure) and
  the `Sink` that may take it instead;
- `connection`: the `asyncio.Protocol` that writes a request and feeds the reader;
- `tunnel`: CONNECT through an egress proxy;
- `pool`: `HttpClient`, the keep-alive pool to the origin and its `request`/`send_now`.
"""

from proxy.net.egress import ProxyRoute
from proxy.upstream.h1.connection import Connection
from proxy.upstream.h1.errors import (
    BodyTooLarge,
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectionClosed,
    ConnectTimeout,
    InvalidURL,
    PoolTimeout,
    ProtocolError,
    ProxyRefused,
    TlsClosed,
    TlsError,
)
from proxy.upstream.h1.headers import Headers
from proxy.upstream.h1.pool import HttpClient
from proxy.upstream.h1.response import Response, Sink

__all__ = [
    "BodyTooLarge",
    "ClientClosed",
    "ClientError",
    "ConnectError",
    "ConnectTimeout",
    "Connection",
    "ConnectionClosed",
    "Headers",
    "HttpClient",
    "InvalidURL",
    "PoolTimeout",
    "ProtocolError",
    "ProxyRefused",
    "ProxyRoute",
    "Response",
    "Sink",
    "TlsClosed",
    "TlsError",
]
