"""`--auth passthrough`: whether a caller may act on a 2025 session where the upstream cannot judge it.

Contract (`vouch`, what `Relay.vouch` runs): the frontend serves some acts on a session itself
(its listen stream, a resumed answer, DELETE, a cancellation, an answer to the server's request),
or sends them with the session's credential; the proxy does not judge credentials in this mode,
the upstream does. A credential the upstream accepted on the session (the link's
`caller_authorization`) passes at once; any other is put to the upstream in a `ping` on the
session carrying it, within the relay's request timeout (`VOUCH_TIMEOUT_S` without one). The
upstream's refusal of the caller raises `AuthRefused` (proxy/auth/challenge.py), as a relayed
request's refusal does; an upstream that could not be asked raises `UpstreamFailure` or a
`TimeoutError`. With the session's `VouchGate` and the caller's principal id, the pings are bounded
(proxy/auth/vouch.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.auth.challenge import upstream_refusal
from proxy.core.outbox import NullOutbox
from proxy.errors import UpstreamFailure, refuses_the_caller

if TYPE_CHECKING:
    from proxy.core.relay import Relay

# How long `vouch` waits for the upstream's answer when the relay has no request timeout.
VOUCH_TIMEOUT_S = 10.0


async def vouch(
    relay: Relay, headers: Mapping[str, str] | None, key: str | None, loop: asyncio.AbstractEventLoop
) -> None:
    """--auth passthrough: whether the caller whose forwarded `headers` these are may act on
    `relay`'s legacy session where the upstream cannot judge it (the frontend serves the session's
    listen stream, a resumed answer, its DELETE, a cancellation, an answer to the server's
    request itself, or sends them with the session's credential). The proxy does not judge
    credentials in this mode: the upstream does, and binds its session to a principal. A
    credential the upstream accepted on the session (the link's `caller_authorization`) may;
    any other (another user's, none, a token refreshed but not yet used) is put to the
    upstream in a `ping` on the session, which it answers as it would that caller's request:
    2xx, and the link holds that credential from now on; 404 (another principal's session),
    401 or 403 raise `AuthRefused` with that status, as a relayed request's refusal does.
    Raises UpstreamFailure (or a TimeoutError) when the upstream could not be asked.

    With the relay's `vouch_gate` (passthrough) and the caller's principal id as `key`, the pings
    are bounded (`VouchGate.ask`)."""
    credential = headers.get("authorization") if headers is not None else None
    if credential is not None and credential == getattr(relay.link, "caller_authorization", None):
        return
    gate = relay.vouch_gate
    if gate is None or key is None:
        await _vouch_ping(relay, credential)
        return
    await gate.ask(key, functools.partial(_vouch_ping, relay, credential), loop)


async def _vouch_ping(relay: Relay, credential: str | None) -> None:
    ping = {"jsonrpc": "2.0", "id": "vouch", "method": "ping"}
    timeout_s = relay.request_timeout_s if relay.request_timeout_s is not None else VOUCH_TIMEOUT_S
    try:
        await relay.forward(
            ping, NullOutbox(), {"authorization": credential} if credential is not None else None, timeout_s
        )
    except UpstreamFailure as failure:
        if refuses_the_caller(failure.kind, failure.http_status):
            raise upstream_refusal(failure) from None
        raise
