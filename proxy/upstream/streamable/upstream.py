"""A Streamable HTTP MCP server (either protocol era, or both) as the proxy's `Upstream`.

`HttpUpstream` opens one `HttpLegacyLink` per downstream 2025 session and shares one
`HttpModernLink` among every 2026-07-28 request (a new one once it was closed); `aclose` closes
every link it opened, then the HTTP client. `probe` asks which eras the server speaks
(`probe.py`). Everything about the client, its TLS context and the upstream's health is
`HttpClientOwner`'s.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping

from proxy.upstream.base import Capabilities, Era, LinkBase
from proxy.upstream.h1 import ProxyRoute
from proxy.upstream.streamable.legacy import HttpLegacyLink
from proxy.upstream.streamable.link import HttpLink
from proxy.upstream.streamable.modern import HttpModernLink
from proxy.upstream.streamable.owner import HttpClientOwner
from proxy.upstream.streamable.probe import probe_eras


class HttpUpstream(HttpClientOwner):
    """A Streamable HTTP MCP server (either era, or both)."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 5.0,
        max_connections: int = 100,
        probe_timeout_s: float = 10.0,
        max_event_bytes: int | None = 16 * 1024 * 1024,
        wait_s: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        proxy: ProxyRoute | None = None,
    ) -> None:
        super().__init__(
            url,
            "http",
            headers=headers,
            connect_timeout_s=connect_timeout_s,
            max_connections=max_connections,
            max_event_bytes=max_event_bytes,
            wait_s=wait_s,
            ssl_context=ssl_context,
            proxy=proxy,
        )
        self.probe_timeout_s = probe_timeout_s
        self._modern: HttpModernLink | None = None
        self._links: set[HttpLink] = set()

    async def open(self, era: Era) -> HttpLegacyLink | HttpModernLink:
        if era is Era.MODERN:
            if self._modern is None or self._modern.closed:
                self._modern = HttpModernLink(self)
            return self._modern
        link = HttpLegacyLink(self)
        self._links.add(link)
        return link

    def forget(self, link: LinkBase) -> None:
        if isinstance(link, HttpLink):
            self._links.discard(link)
        if link is self._modern:
            self._modern = None

    async def aclose(self) -> None:
        links: list[HttpLink] = list(self._links)
        if self._modern is not None:
            links.append(self._modern)
        await asyncio.gather(*(link.aclose() for link in links), return_exceptions=True)
        await self._close_client()

    async def probe(self) -> Capabilities:
        """Which eras the upstream speaks (`probe_eras`), each step bounded by `probe_timeout_s`."""
        return await probe_eras(self, self.probe_timeout_s)
