"""A shared store's URL, checked when the settings are read, and the error of a store that refuses
the proxy's configuration. Standard library only: the settings import it without the store.

Contract: `check_url(url)` returns (TLS, cluster) of a `--state` URL or raises a `ValueError` that
says what is wrong (never the URL's password): an unknown scheme, a port that is not a number, no
host, any `ssl_*` query parameter (TLS is configured by flags and always verified), a database
other than 0 for a cluster.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit


class StateConfigError(ValueError):
    """The store answered and refused the proxy's configuration (TLS or credentials)."""


SCHEMES = {  # scheme: (TLS, cluster)
    "redis": (False, False),
    "rediss": (True, False),
    "valkey": (False, False),
    "valkeys": (True, False),
    "redis+cluster": (False, True),
    "rediss+cluster": (True, True),
    "valkey+cluster": (False, True),
    "valkeys+cluster": (True, True),
}


def check_url(url: str) -> tuple[bool, bool]:
    """(TLS, cluster) of a store URL; a ValueError says what is wrong with it (never its password)."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError("--state takes 'memory' or a URL: " + ", ".join(f"{s}://" for s in SCHEMES))
    tls, cluster = SCHEMES[scheme]
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018  (a port that is not a number raises here, not at the first call)
    except ValueError:
        raise ValueError(f"--state {scheme}://: the port is not a number") from None
    if not parts.hostname:
        raise ValueError(f"--state {scheme}://: the URL names no host")
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if name.lower().startswith("ssl"):
            raise ValueError(
                f"--state: the URL's {name[:40]!r} parameter is not accepted; TLS is verified always, "
                "with --state-ca, --state-client-cert and --state-client-key (docs/state.md)"
            )
    if cluster and parts.path.strip("/") not in ("", "0"):
        raise ValueError("--state: a Redis Cluster has database 0 only")
    return tls, cluster
