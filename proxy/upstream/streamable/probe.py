"""Which protocol eras a Streamable HTTP upstream speaks, asked the way a client would.

`probe_eras(upstream, timeout_s)` sends `server/discover` (2026-07-28) and reads its
`supportedVersions`; unless that already names a 2025 revision, it sends a legacy `initialize` and,
if the server opened a session for it, deletes that session again. Each step is bounded by
`timeout_s`. A step that times out or is refused only counts as "not spoken" (its reason goes into
`Capabilities.detail`); a connection that cannot be established, or a 401/403 (the proxy's own
credentials refused), is raised as the `UpstreamFailure` it is: the caller decides whether that
means down. Every step goes on a connection of its own, outside the request pool: a pool busy
with a peak of calls says nothing about whether the upstream is up, and must not make it look down.
"""

from __future__ import annotations

import asyncio
import contextlib

from proxy.errors import FailureKind, UpstreamFailure
from proxy.jsonrpc import LEGACY_VERSIONS, MODERN_VERSIONS
from proxy.upstream.base import Capabilities, discover_request, initialize_request
from proxy.upstream.streamable.failures import CLIENT_ERRORS, bounded_detail
from proxy.upstream.streamable.headers import SESSION_HEADER, VERSION_HEADER, modern_headers
from proxy.upstream.streamable.owner import HttpClientOwner
from proxy.upstream.streamable.posts import rpc_once


async def probe_eras(upstream: HttpClientOwner, timeout_s: float) -> Capabilities:
    """Which eras the upstream speaks: `server/discover` first, then a legacy `initialize`."""
    modern = legacy = False
    notes: list[str] = []
    discover = discover_request("probe-discover")
    try:
        async with asyncio.timeout(timeout_s):
            _, answer = await rpc_once(upstream, discover, modern_headers(discover), dedicated=True)
        result = answer.get("result")
        versions = result.get("supportedVersions") if isinstance(result, dict) else None
        if isinstance(versions, list):
            modern = any(v in MODERN_VERSIONS for v in versions)
            legacy = any(v in LEGACY_VERSIONS for v in versions)
            notes.append(f"supportedVersions={[v for v in versions if isinstance(v, str)]}")
        else:
            notes.append("server/discover refused")
    except TimeoutError:
        notes.append("server/discover timed out")
    except UpstreamFailure as f:
        if f.kind is FailureKind.CONNECT_FAILED or f.http_status in (401, 403):
            raise
        notes.append(f"server/discover failed: {f.detail}")
    if not legacy:
        legacy, note = await _probe_legacy(upstream, timeout_s)
        notes.append(note)
    return Capabilities(legacy=legacy, modern=modern, detail=bounded_detail("; ".join(notes)))


async def _probe_legacy(upstream: HttpClientOwner, timeout_s: float) -> tuple[bool, str]:
    init = initialize_request("probe-initialize")
    try:
        async with asyncio.timeout(timeout_s):
            headers, answer = await rpc_once(upstream, init, {}, dedicated=True)
    except TimeoutError:
        return False, "initialize timed out"
    except UpstreamFailure as f:
        if f.kind is FailureKind.CONNECT_FAILED or f.http_status in (401, 403):
            raise
        return False, f"initialize failed: {f.detail}"
    result = answer.get("result")
    if not isinstance(result, dict):
        return False, "initialize refused"
    sid = headers.get(SESSION_HEADER)
    if sid:
        h = {SESSION_HEADER: sid}
        if isinstance(result.get("protocolVersion"), str):
            h[VERSION_HEADER] = result["protocolVersion"]
        with contextlib.suppress(*CLIENT_ERRORS, TimeoutError):
            async with asyncio.timeout(timeout_s):
                async with await upstream.client.request("DELETE", headers=h, dedicated=True):
                    pass
    return True, f"initialize negotiated {result.get('protocolVersion')}"
