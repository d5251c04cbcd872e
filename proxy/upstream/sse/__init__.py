"""Server-Sent Events: the parser of the event-stream format (`parse.py`, used by Streamable HTTP
too) and the legacy HTTP+SSE upstream transport (`link.py`).

The transport is re-exported lazily (on first access to `SseLegacyLink` or `SseUpstream`): it
builds on the Streamable HTTP package, whose modules import this package's parser, so loading the
transport whenever the parser is imported would be an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.upstream.sse.parse import SseError, SseEvent, SseParser

if TYPE_CHECKING:
    from proxy.upstream.sse.link import SseLegacyLink, SseUpstream

__all__ = ["SseError", "SseEvent", "SseLegacyLink", "SseParser", "SseUpstream"]


def __getattr__(name: str) -> object:
    if name in ("SseLegacyLink", "SseUpstream"):
        from proxy.upstream.sse import link

        return getattr(link, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
