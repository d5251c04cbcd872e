"""What a refused caller is told, and the protected-resource metadata (RFC 9728, RFC 6750).

Contract (pure functions; the HTTP frontend and the admin port use them):
- `metadata_url(resource)`: where the protected-resource metadata of `resource` lives: the
  well-known path inserted between the URL's authority and its path (RFC 9728 §3.1):
  `https://h/mcp` → `https://h/.well-known/oauth-protected-resource/mcp`.
- `metadata_paths(endpoint_path)`: the paths a client probes on the proxy for it: the well-known
  path followed by the endpoint's path, and the bare well-known path (clients try both).
- `challenge(refused, metadata)`: the `WWW-Authenticate` value of the proxy's own refusal:
  `Bearer` with `error`, `error_description`, `scope` (a 403 insufficient_scope) and
  `resource_metadata`, every value quoted (the refusal's text is already fit for a header).
- `rewrite_challenge(upstream_value, metadata)`: an upstream's challenge (passthrough) with every
  `resource_metadata` parameter pointing at the proxy's own metadata URL; everything else as the
  upstream wrote it (a challenge without the parameter stays without: the client then probes
  the well-known paths of the URL it dialled, which the proxy serves).
- `resource_metadata_of(value)`: the metadata URL an upstream's challenge names (passthrough: the
  proxy fetches the document there when it is on the upstream's own origin, whatever its path).
- `challenge_params(value)`: the `error`, `error_description` and `scope` an upstream's challenge
  carries (passthrough: the refusal's JSON body repeats them, as the upstream's did).
- `upstream_refusal(failure)`: an upstream's 401/403 (passthrough) as an `AuthRefused` keeping its
  challenge, error and description; its 404 refusing the caller on a session it did not open
  (`session_refused`) as a 404 `session_owner` refusal, without a challenge (no credential would
  open that session for this caller).
- `rewrite_metadata(document, upstream_url, public_url)`: the upstream's metadata document with
  its `resource` moved from the upstream's URL to the proxy's public URL (clients discard a
  document whose `resource` is not the URL they dialled): the upstream's URL itself becomes the
  public URL, a prefix of it (a resource named by its origin) the same prefix of the public URL.
  A `resource` that names neither is left as it is: a client must still see that mismatch, as
  it would directly. None when the document is not a JSON object.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from proxy.auth.base import AuthRefused
from proxy.errors import FailureKind, UpstreamFailure

WELL_KNOWN = "/.well-known/oauth-protected-resource"
# `resource_metadata=` followed by a quoted string (with RFC 9110 escapes) or a token
_RESOURCE_METADATA = re.compile(r'(?i)(\bresource_metadata\s*=\s*)("(?:[^"\\]|\\.)*"|[^\s,]+)')


def metadata_url(resource: str) -> str:
    parts = urlsplit(resource)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN + path, "", ""))


def metadata_paths(endpoint_path: str) -> frozenset[str]:
    path = endpoint_path.rstrip("/")
    return frozenset({WELL_KNOWN, WELL_KNOWN + path})


def challenge(refused: AuthRefused, metadata: str) -> str:
    params: list[str] = []
    if refused.error is not None:
        params.append(f'error="{refused.error}"')
        params.append(f'error_description="{refused.description}"')
    if refused.scope:
        params.append(f'scope="{" ".join(sorted(refused.scope))}"')
    params.append(f'resource_metadata="{metadata}"')
    return "Bearer " + ", ".join(params)


def resource_metadata_of(value: str | None) -> str | None:
    """The `resource_metadata` URL a challenge names, unquoted (None without one)."""
    match = _RESOURCE_METADATA.search(value or "")
    if match is None:
        return None
    raw = match.group(2)
    return raw[1:-1].replace('\\"', '"') if raw.startswith('"') else raw


def rewrite_challenge(value: str, metadata: str) -> str:
    return _RESOURCE_METADATA.sub(lambda m: f'{m.group(1)}"{metadata}"', value)


_PARAM = re.compile(r'(?i)\b(error|error_description|scope)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]+)')


def challenge_params(value: str | None) -> dict[str, str]:
    """`error`, `error_description` and `scope` of a challenge (the first of each), unquoted."""
    out: dict[str, str] = {}
    for name, raw in _PARAM.findall(value or ""):
        text = raw[1:-1].replace('\\"', '"') if raw.startswith('"') else raw
        out.setdefault(name.lower(), text)
    return out


def upstream_refusal(failure: UpstreamFailure) -> AuthRefused:
    """passthrough: an upstream's HTTP 401/403 as the caller's refusal, its challenge kept."""
    if failure.kind is FailureKind.SESSION_REFUSED:
        return AuthRefused(404, "session_owner", "the upstream refused this credential for the session", error=None)
    status: Literal[401, 403] = 401 if failure.http_status == 401 else 403
    told = challenge_params(failure.challenge)
    return AuthRefused(
        status,
        f"upstream_{status}",
        told.get("error_description", "the upstream refused the request's credentials"),
        error=told.get("error"),
        challenge=failure.challenge or "Bearer",
    )


def rewrite_metadata(document: Any, upstream_url: str, public_url: str) -> dict[str, Any] | None:
    if not isinstance(document, dict):
        return None
    named = document.get("resource")
    if not isinstance(named, str):
        return document
    upstream, public, named_ = upstream_url.rstrip("/"), public_url.rstrip("/"), named.rstrip("/")
    if not (upstream == named_ or upstream.startswith(named_ + "/")):
        return document  # a resource that is not the upstream: the client must see the mismatch
    rest = upstream[len(named_) :]  # the upstream's path below the named resource
    mapped = public[: -len(rest)] if rest and public.endswith(rest) else public
    return {**document, "resource": mapped}
