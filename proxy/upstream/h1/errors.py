"""The failures the HTTP/1.1 client reports, and the texts of its TLS failures.

Contract: every failure of a request is a `ClientError` (never a bare OSError or parser error),
except `InvalidURL` (a `ValueError`, raised when the client is built). A `ConnectError` means
nothing of the request can have been sent, save a `TlsClosed` (`dispatch_known` is False). No
message carries credentials: the texts built here quote the peer's strings only bounded and
reduced to printable ASCII.
"""

from __future__ import annotations

import ssl
from typing import Final

from proxy.jsonrpc import bounded

__all__ = [
    "BodyTooLarge",
    "ClientClosed",
    "ClientError",
    "ConnectError",
    "ConnectTimeout",
    "ConnectionClosed",
    "InvalidURL",
    "PoolTimeout",
    "ProtocolError",
    "ProxyRefused",
    "TlsClosed",
    "TlsError",
    "printable",
    "tls_failure_text",
]


class ClientError(Exception):
    """Base of every failure this client reports (never a bare OSError or parser error)."""


class InvalidURL(ValueError):
    """The URL given to `HttpClient` is not one origin this client can reach."""


class ClientClosed(ClientError):
    """The client was closed (`aclose`) before or while the request waited for a connection."""


class ConnectError(ClientError):
    """Establishing the connection failed: nothing of the request can have been sent (see
    `TlsClosed` for the one exception). The message names what failed and never carries
    credentials."""

    dispatch_known = True


class ConnectTimeout(ConnectError):
    """No connection within `connect_timeout_s` (TCP connect, CONNECT tunnel, TLS), or no pool slot
    within a request's `wait_s` (`PoolTimeout`)."""


class TlsError(ConnectError):
    """The TLS handshake with the origin failed, or the origin refused it with an alert."""


class TlsClosed(TlsError):
    """A new TLS connection was closed before any byte of its first answer: in TLS 1.3, how an
    upstream that refuses the client's certificate without sending an alert looks. Unlike other
    `ConnectError`s the request was written, so whether it was processed is not known for sure."""

    dispatch_known = False


class ProxyRefused(ConnectError):
    """The egress proxy answered the CONNECT request with something other than 2xx (`status`)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class PoolTimeout(ConnectTimeout):
    """Every pooled connection stayed busy for the `wait_s` a request gave: the upstream is slow or
    the pool too small, which is not the same as an upstream nobody can reach."""


class ProtocolError(ClientError):
    """The peer answered something that is not a valid HTTP/1.1 response."""


class BodyTooLarge(ProtocolError):
    """The answer's body (decoded, if it came compressed) grew past its `Response.max_body`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the upstream's answer body exceeds {limit} bytes")
        self.limit = limit


class ConnectionClosed(ClientError):
    """The peer closed or reset the connection before the response was complete.

    `response_started` tells whether the status line had been received; `reused` whether the
    connection had already served an earlier request (a keep-alive connection the peer was closing
    while this request went out fails this way)."""

    def __init__(self, message: str, *, response_started: bool, reused: bool) -> None:
        super().__init__(message)
        self.response_started = response_started
        self.reused = reused


def printable(text: str, limit: int = 80) -> str:
    """`text` for a message: at most `limit` characters, anything but printable ASCII as `?`."""
    return bounded("".join(c if " " <= c <= "~" else "?" for c in text[: limit + 1]), limit)


# OpenSSL verification codes that mean "the issuer is not trusted" (a private CA not given).
_UNTRUSTED_CODES: Final = frozenset({2, 18, 19, 20, 21})


def tls_failure_text(exc: ssl.SSLError, host: str, port: int) -> str:
    """What failed in a TLS handshake with the upstream, from OpenSSL's codes (never secrets)."""
    where = f"TLS with the upstream {host}:{port} failed"
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        message = printable(str(exc.verify_message or exc.reason or "verification failed"), 160)
        if code in _UNTRUSTED_CODES:
            hint = "its issuer is not trusted: give the CA that issued it with --upstream-ca"
        elif code in (62, 64):  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
            hint = f"the certificate does not name {host}: the upstream URL must use a name it lists"
        elif code == 10:
            hint = "the certificate has expired"
        else:
            hint = "the certificate was not accepted"
        return f"{where}: the upstream's certificate was rejected ({message}); {hint}"
    reason = (exc.reason or type(exc).__name__).upper()
    text = printable(reason.lower().replace("_", " "), 120)
    if "ALERT" in reason and any(k in reason for k in ("CERTIFICATE", "UNKNOWN_CA", "HANDSHAKE_FAILURE", "ACCESS")):
        return (
            f"{where}: the upstream refused the handshake ({text}): it requires a client certificate "
            "(--upstream-client-cert and --upstream-client-key) or does not accept the one given"
        )
    return f"{where} ({text})"
