"""Reaching the shared store: redis-py's clients given the proxy's own TLS context, the URL forms
redis-py takes, and what a refusal or an unreachable store looks like.

Contract:
- `tls_connection(current)` is redis-py's TLS connection class using the one verifying context in
  `current` (read at every connect, so a renewal applies to the connections opened after it);
  `cluster_connections` makes a cluster client's every connection that class, or fails loudly.
- `refusal(exc)` says why a store that answered refused the proxy (TLS verification, handshake,
  credentials), never with a credential; None when it did not answer at all.
- `describe(url)` is the URL without credentials; `url_secrets(url)` what the secret registry removes.
- `open_client(url, cluster, tls, timeout_s)` is the client: to one server, redis-py's asyncio
  `Redis` over a blocking pool of at most `MAX_CONNECTIONS` (a burst of operations waits for a
  connection inside each operation's bound); to a Redis Cluster, its `RedisCluster`. Every socket
  operation is bounded by `timeout_s` and nothing is retried (the caller bounds each operation and
  falls back to local state); over TLS, every connection uses `tls`'s context.
- `scan(client, call, match)` yields the matching keys in batches, of every primary of a cluster
  (`glob_escape` makes a literal prefix of `match`).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis import __version__ as REDIS_VERSION
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisClusterException, RedisError, ResponseError

# What a store operation can raise when the store is unreachable, slow or refuses: redis-py's
# cluster client raises RedisClusterException (not a RedisError) when no node answers.
STORE_ERRORS = (RedisError, RedisClusterException, OSError, TimeoutError)
SCAN_BATCH = 500
MAX_CONNECTIONS = 8  # to a single-node store, the subscription's included; a cluster client pools per node


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


def open_client(url: str, cluster: bool, tls: TlsContext | None, timeout_s: float) -> aioredis.Redis | RedisCluster:
    """redis-py's client for the store at `url` (its `+cluster` form: `cluster`), every connection
    over `tls` when given, every socket operation bounded by `timeout_s` and never retried (the
    proxy's own bound on each store operation decides)."""
    options: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "health_check_interval": 5,
        "client_name": "mcp-recovery-proxy",
    }
    connection_class: type[aioredis.SSLConnection] | None = None
    if tls is not None:
        connection_class = tls_connection(tls)
    # (a rediss:// URL would make redis-py choose its own TLS connection class)
    target = client_url(url)
    if tls is not None:
        target = "redis://" + target.removeprefix("rediss://")
    client: aioredis.Redis | RedisCluster
    if cluster:
        # No retry of a failed connection, as for one node (the bound is ours); a MOVED or ASK
        # answer is still followed by the client's own redirection loop, inside the bound.
        client = RedisCluster.from_url(target, retry=Retry(NoBackoff(), 0), **options)
        if connection_class is not None:
            cluster_connections(client, connection_class)
    else:
        # A burst of calls (fifty approvals at once) waits for one of a few connections instead
        # of opening one each: a TLS handshake per call would cost more than the calls, and the
        # wait counts inside each operation's bound.
        if connection_class is not None:
            options["connection_class"] = connection_class
        pool = aioredis.BlockingConnectionPool.from_url(
            target,
            max_connections=MAX_CONNECTIONS,
            timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # the bound is ours: one try, then the local state
            retry_on_timeout=False,
            **options,
        )
        client = aioredis.Redis.from_pool(pool)  # closed with the client
    return client


async def scan(
    client: aioredis.Redis | RedisCluster, call: Callable[[str, Awaitable[Any]], Awaitable[Any]], match: str
) -> AsyncIterator[list[bytes]]:
    """The keys matching `match`, a batch per SCAN call (each bounded by `call`, as the operation
    `reconcile`); on a cluster, every primary is scanned in turn (each holds its own slots' keys)."""
    if isinstance(client, RedisCluster):
        for node in client.get_primaries():
            cursor: int = 0
            while True:
                replies = await call(
                    "reconcile", client.scan(cursor=cursor, match=match, count=SCAN_BATCH, target_nodes=node)
                )
                cursors, keys = replies  # a cluster's SCAN answers {node name: cursor}, keys
                yield _as_bytes(keys)
                cursor = int(next(iter(cursors.values()), 0)) if isinstance(cursors, dict) else int(cursors)
                if not cursor:
                    break
        return
    cursor = 0
    while True:
        cursor, keys = await call("reconcile", client.scan(cursor=cursor, match=match, count=SCAN_BATCH))
        yield _as_bytes(keys)
        if not cursor:
            break


def glob_escape(text: str) -> str:
    """A literal text inside a SCAN MATCH pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _as_bytes(keys: list[bytes | str]) -> list[bytes]:
    """SCAN's keys: bytes from this client (no decode_responses), whatever its stubs allow."""
    return [key if isinstance(key, bytes) else key.encode() for key in keys]


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
