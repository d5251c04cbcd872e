"""`--auth passthrough`: the upstream's protected-resource metadata, fetched once per its max-age.

Every client that meets a 401 asks for the metadata (RFC 9728), unauthenticated; relayed as is,
each of those GETs cost the upstream one or two fetches (100 GETs: 200 fetches). This keeps the
document the proxy serves for as long as the upstream says it may be kept.

Contract:
- `MetadataCache.get(fetch)` returns the cached document while it is fresh; otherwise awaits
  `fetch()` (one fetch at a time: callers arriving meanwhile wait for that one's outcome) and keeps
  its `(document, max_age_s)` for `max_age_s`. `max_age(cache_control)` reads it: `max-age=N`
  (capped at `MAX_AGE_S`), 0 for `no-store` or `no-cache` (not kept, but still one fetch for the
  callers waiting on it), and 0 too when the upstream says nothing: a document without a lifetime
  is not the proxy's to keep (an authorization server migration changes it, and a client must see
  that at once); concurrent GETs still share one fetch. `fetch` says how long its
  outcome may be kept: a document not found (None) for `MISSING_AGE_S`, so a burst of GETs where
  there is none does not reach the upstream either; a failed fetch for 0 (not kept). A fetch that
  raises is not kept: the callers waiting get the exception.
- `MetadataCache.cache_control()` is the `Cache-Control` the proxy answers the document `get`
  returned with: the lifetime the proxy itself keeps it for, so a client keeps it no longer than
  the upstream allowed: `no-store` when it is not kept (the upstream said `no-store`, `no-cache` or
  nothing), else `max-age` of the whole seconds left of it. A fixed `max-age=300` had clients keep a
  document for five minutes that the upstream said not to keep at all.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

DEFAULT_AGE_S = 0.0  # no Cache-Control: only the fetch in flight is shared
MAX_AGE_S = 3600.0
MISSING_AGE_S = 10.0
_MAX_AGE = re.compile(r"(?i)(?:^|[,\s])max-age\s*=\s*\"?(\d{1,10})")

Document = dict[str, Any] | None


def max_age(cache_control: str | None) -> float:
    """How long a document may be kept, from its `Cache-Control` (see the module contract)."""
    if not cache_control:
        return DEFAULT_AGE_S
    lowered = cache_control.lower()
    if "no-store" in lowered or "no-cache" in lowered:
        return 0.0
    found = _MAX_AGE.search(cache_control)
    return min(float(found.group(1)), MAX_AGE_S) if found else DEFAULT_AGE_S


class MetadataCache:
    __slots__ = ("_document", "_fetching", "_until")

    def __init__(self) -> None:
        self._document: Document = None
        self._until = float("-inf")
        self._fetching: asyncio.Future[Document] | None = None

    async def get(self, fetch: Callable[[], Awaitable[tuple[Document, float]]]) -> Document:
        if time.monotonic() < self._until:
            return self._document
        if self._fetching is not None:
            return await asyncio.shield(self._fetching)
        self._fetching = fetching = asyncio.get_running_loop().create_future()
        try:
            document, keep_s = await fetch()
        except asyncio.CancelledError:
            fetching.cancel()
            raise
        except BaseException as exc:
            fetching.set_exception(exc)
            fetching.exception()  # retrieved here: no "never retrieved" warning when nobody waited
            raise
        finally:
            self._fetching = None
        self._document, self._until = document, time.monotonic() + keep_s
        fetching.set_result(document)
        return document

    def cache_control(self) -> bytes:
        """The `Cache-Control` for the document `get` just returned (see the module contract)."""
        left = self._until - time.monotonic()  # -inf before the first fetch
        return b"max-age=%d" % int(left) if left >= 1.0 else b"no-store"
