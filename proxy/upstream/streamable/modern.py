"""The 2026-07-28 Streamable HTTP link: stateless, shared by every 2026 request.

Each request is one POST with the 2026 routing headers (`modern_headers`: the protocol version
from the request's `_meta`, `Mcp-Method`, `Mcp-Name`), answered on its own response (JSON or an
event stream); there is no session, no standalone stream and nothing to re-establish. Cancelling a
request closes its response stream (`HttpLink.cancel`), which is how the 2026 transport cancels.
A notification is POSTed too (the transport defines none from a client; servers answer 202), and
a non-2xx answer to it is raised as the `UpstreamFailure` it is.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.jsonrpc import Message
from proxy.upstream.base import Era
from proxy.upstream.streamable.headers import modern_headers
from proxy.upstream.streamable.link import HttpLink
from proxy.upstream.streamable.owner import HttpClientOwner


class HttpModernLink(HttpLink):
    """The shared 2026-07-28 link: stateless POSTs, cancel = close the response stream."""

    era = Era.MODERN

    def __init__(self, upstream: HttpClientOwner) -> None:
        super().__init__(upstream, prefix="m")

    def _request_headers(self, message: Message) -> dict[str, str]:
        return modern_headers(message)

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        """POST it (the 2026 HTTP transport defines no client notifications; servers answer 202)."""
        h = {**(headers or {}), **modern_headers(message)}
        response = await self._post_small(message, h, "notification")
        if not 200 <= response.status_code < 300:
            raise response.failure()
