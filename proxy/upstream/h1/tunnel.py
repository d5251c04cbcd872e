"""CONNECT tunnels through an HTTP egress proxy, for the HTTP/1.1 client.

Contract: `Tunnel.open` gives a connected, non-blocking socket whose next bytes are the origin's
(TLS, if the origin is https, is made over it by the caller), or raises: `ConnectError` when the
proxy cannot be reached, `ProxyRefused` when it answers CONNECT with something other than 2xx
(nothing reached the origin either way). `Proxy-Authorization` goes on the CONNECT request only
and never into a message. The socket is closed on any failure or cancellation; the caller's
timeout bounds the whole.
"""

from __future__ import annotations

import asyncio
import re
import socket

from proxy.net.egress import ProxyRoute
from proxy.upstream.h1.errors import ConnectError, ProxyRefused, printable
from proxy.upstream.h1.reader import MAX_HEAD_BYTES

__all__ = ["ProxyRoute", "Tunnel"]

_FORBIDDEN = re.compile(r"[\r\n\x00]")
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: ([^\r\n]*))?\r\n")


class Tunnel:
    """Tunnels to one origin (`host`, `port`; `literal_host` is `host` as an authority writes it,
    an IPv6 address in brackets) through one egress proxy. Raises `ValueError` when built for
    proxy credentials with CR, LF or NUL."""

    __slots__ = ("_request", "host", "port", "proxy")

    def __init__(self, proxy: ProxyRoute, literal_host: str, host: str, port: int) -> None:
        self.proxy = proxy
        self.host = host
        self.port = port
        self._request = _connect_head(literal_host, port, proxy)

    async def open(self, loop: asyncio.AbstractEventLoop) -> socket.socket:
        """A connected socket to the origin through the egress proxy: TCP to the proxy, CONNECT,
        its 2xx answer read whole. Raises `ConnectError` (the proxy unreachable) or `ProxyRefused`.
        The caller's timeout bounds it; the socket is closed on any failure or cancellation."""
        proxy = self.proxy
        try:
            infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectError(f"cannot resolve the egress proxy {proxy.shown} ({type(exc).__name__}: {exc})") from exc
        error: OSError | None = None
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
                await loop.sock_sendall(sock, self._request)
                status, reason = await _read_connect_answer(loop, sock)
            except OSError as exc:  # this address of the proxy: try the next
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            if 200 <= status < 300:
                return sock
            sock.close()
            raise ProxyRefused(_refusal_text(proxy, self.host, self.port, status, reason), status=status)
        detail = f"{type(error).__name__}: {error}" if error is not None else "no address"
        raise ConnectError(f"cannot connect to the egress proxy {proxy.shown} ({detail})") from error


def _connect_head(literal_host: str, port: int, proxy: ProxyRoute) -> bytes:
    authority = f"{literal_host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.authorization is not None:
        if _FORBIDDEN.search(proxy.authorization):
            raise ValueError("the egress proxy's credentials contain CR, LF or NUL")
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_connect_answer(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> tuple[int, str]:
    """The status and reason of the proxy's answer to CONNECT, read to the end of its head.

    After a 2xx the next bytes are the origin's, which speaks only once spoken to (TLS, or the
    request): anything beyond the head then is a broken proxy. Bounded by MAX_HEAD_BYTES."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await loop.sock_recv(sock, 4096)
        if not chunk:
            raise ConnectionResetError("the egress proxy closed the connection before answering CONNECT")
        head += chunk
        if len(head) > MAX_HEAD_BYTES:
            raise ConnectionResetError(f"the egress proxy's answer to CONNECT exceeds {MAX_HEAD_BYTES} bytes")
    end = head.index(b"\r\n\r\n") + 4
    match = _STATUS_LINE.match(head)
    if match is None:
        raise ConnectionResetError("the egress proxy answered CONNECT with something other than HTTP/1.x")
    status = int(match.group(1))
    reason = (match.group(2) or b"").decode("latin-1")
    if 200 <= status < 300 and len(head) > end:
        raise ConnectionResetError("the egress proxy sent bytes after its 2xx answer to CONNECT")
    return status, reason


def _refusal_text(proxy: ProxyRoute, host: str, port: int, status: int, reason: str) -> str:
    what = f"the egress proxy {proxy.shown} refused the tunnel to {host}:{port}: {status} {printable(reason)}".rstrip()
    if status == 407:
        given = "were refused" if proxy.authorization is not None else "are missing"
        return f"{what} (its credentials {given}: the proxy URL takes them as http://user:password@host:port)"
    if status == 403:
        return f"{what} (its policy does not allow this destination or port)"
    if status in (502, 503, 504):
        return f"{what} (the proxy could not reach the upstream)"
    return what
