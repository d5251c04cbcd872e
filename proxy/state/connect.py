"""Reaching the shared store: redis-py's clients given the proxy's own TLS context, the URL forms
redis-py takes, and what a refusal or an unreachable store looks like.

Contract:
- `tls_connection(current)` is redis-py's TLS connection class using the one verifying context in
  `current` (read at every connect, so a renewal applies to the connections opened after it);
  `cluster_connections` makes a cluster client's every connection that class, or fails loudly.
- `refusal(exc)` says why a store that answered refused the proxy (TLS verification, handshake,
  credentials), never with a credential; None when it did not answer at all.
- `describe(url)` is the URL without credentials; `url_secrets(url)` what the secret registry removes.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis import __version__ as REDIS_VERSION
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import AuthenticationError, NoPermissionError, RedisClusterException, RedisError, ResponseError

# What a store operation can raise when the store is unreachable, slow or refuses: redis-py's
# cluster client raises RedisClusterException (not a RedisError) when no node answers.
STORE_ERRORS = (RedisError, RedisClusterException, OSError, TimeoutError)


class StoreUnavailable(Exception):
    """A store operation failed or took longer than its bound (the store is now marked down)."""


def client_url(url: str) -> str:
    """The URL redis-py takes: valkey(s):// is redis(s):// (the same protocol), and `+cluster`
    chooses the client class, not the URL."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.removesuffix("+cluster")
    return {"valkey": "redis", "valkeys": "rediss"}.get(scheme, scheme) + "://" + rest


class TlsContext:
    """The one verifying context every connection to the store uses (proxy/net/tls.py), read
    at each connect: a renewal (`TlsWatcher`) replaces it for the connections opened after it."""

    __slots__ = ("context",)

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context

    def replace(self, context: ssl.SSLContext) -> None:
        self.context = context


def tls_connection(current: TlsContext) -> type[aioredis.SSLConnection]:
    """redis-py's TLS connection, given our context instead of its own: its own would be built per
    connection, synchronously on the event loop, loading the system roots (several times the cost
    of a connect and PING with the shared context), and would trust the system roots besides
    --state-ca."""

    class SharedContextConnection(aioredis.SSLConnection):
        def _connection_arguments(self) -> Mapping[str, Any]:
            # At every connect, not once: a pooled connection object reconnects after a failure,
            # and must then use the renewed context. RedisSSLContext.get() returns it as set.
            self.ssl_context.context = current.context
            return super()._connection_arguments()

    return SharedContextConnection


def cluster_connections(client: RedisCluster, connection_class: type[aioredis.Connection]) -> None:
    """Make every connection of a cluster client an instance of `connection_class`. redis-py's
    RedisCluster takes no connection class: it uses its own SSLConnection (a context per connection,
    the system roots trusted besides the CA) when given `ssl=True`. Each node it discovers is made
    from its `connection_kwargs` (shared with its nodes manager), and the startup node already was:
    both are set here. If a redis-py release moves them, the start fails here, loudly, rather than
    connecting with a context we did not build."""
    try:
        client.connection_kwargs["connection_class"] = connection_class
        client.nodes_manager.connection_kwargs["connection_class"] = connection_class
        nodes = list(client.nodes_manager.startup_nodes.values())
        for node in nodes:
            node.connection_class = connection_class
    except (AttributeError, TypeError) as exc:
        raise RuntimeError(
            f"redis {REDIS_VERSION}: cannot give the cluster client our TLS context ({type(exc).__name__})"
        ) from None
    if not nodes:
        raise RuntimeError(f"redis {REDIS_VERSION}: the cluster client has no startup node to give our TLS context")


def refusal(exc: BaseException) -> str | None:
    """Why a store that answered refused us (TLS verification or handshake, credentials), or None
    when it did not answer at all. redis-py wraps the `ssl` error in its ConnectionError: the
    chain is walked. The reason is OpenSSL's or the store's short code, never a credential."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            why = current.verify_message or current.reason or "not trusted"
            return f"the store's TLS certificate does not verify ({why[:120]}): check --state-ca"
        if isinstance(current, ssl.SSLError):
            why = current.reason or current.library or type(current).__name__
            return (
                f"the TLS handshake with the store failed ({why[:120]}): is it a TLS port, and does it "
                "require a client certificate (--state-client-cert)?"
            )
        if isinstance(current, AuthenticationError | NoPermissionError) or (
            isinstance(current, ResponseError) and str(current).startswith(("NOAUTH", "WRONGPASS", "NOPERM"))
        ):
            return "the store refused the credentials of the URL (password or ACL user)"
        current = current.__cause__ or current.__context__
    return None


def describe(url: str) -> str:
    """The store's URL without its credentials (for logs and /readyz)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def url_secrets(url: str) -> list[str]:
    """The password (and user) in a store URL: registered as secrets so no answer carries them."""
    parts = urlsplit(url)
    return [v for v in (parts.password,) if v]
