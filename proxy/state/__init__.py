"""Where the ledger, the approvals and the retry budget live (docs/recovery.md, "Ledger"; docs/state.md).

`--state memory` (the default) keeps them in the process: the engine's `InMemoryLedger` and its
`AntiStorm` are the whole truth, and `build_state` returns None (nothing else runs, nothing on the
call path changes). `--state redis://…` (rediss://, valkey://, valkeys://) shares them through a
Redis or Valkey server, and `redis+cluster://…` (rediss+cluster://, valkey+cluster://,
valkeys+cluster://) through a Redis Cluster: `proxy.state.shared.RedisState`.

The URL is checked when the settings are read (`check_url`): a known scheme, db 0 for a cluster,
and no `ssl_*` query parameter (redis-py would take `ssl_cert_reqs=none` from the URL and turn
verification off; TLS is configured with `--state-ca`, `--state-client-cert`, `--state-client-key`,
which apply to a TLS scheme only and whose files are checked at start, a `ValueError` naming the
flag, and reloaded when they change, a bad renewal keeping the last good context). Verification of
the store's certificate is always on, against `--state-ca` alone when it is given, for one server
and for every node of a cluster.

The contract the engine relies on (`SharedState`):
- `ledger` is a local, synchronous view of the shared ledger (an `InMemoryLedger`): the engine's
  per-call "is this operation exhausted?" check reads it without a round trip. The store keeps it
  current (records, approvals and clears of every replica arrive on a pub/sub channel), so its
  staleness is the channel's delivery time while subscribed (docs/state.md gives the bound).
- `approve` is the single-use approval, decided atomically by the store (one round trip): two
  replicas racing on one budget id approve exactly one call. It never waits past the store
  timeout; an unreachable store refuses approvals of budgets it holds (fail closed).
- `recorded` writes an exhaustion the engine just recorded in `ledger` (one round trip, bounded);
  while the store is unreachable the entry stays local and is written when it returns.
- `cleared` forgets an operation everywhere (in the background: nothing waits for it).
- `attach(antistorm)` lets the store's sync task exchange the retry budget's counts; the
  circuit breaker stays per replica (docs/state.md says why).
- `resends` is the fleet's re-send records (proxy/state/resends.py): the engine's re-send table
  lists its calls there too, and a re-send of another replica's call is answered from it.
- `check()` runs once before the proxy serves: a store that answers but refuses the proxy
  (its certificate does not verify against `--state-ca`, the handshake fails, the password or
  ACL user is wrong) raises `StateConfigError` (a `ValueError`: the command prints it and exits 2)
  rather than leaving every later call to fail against it; a store that does not answer at all
  only logs a warning (the proxy serves on local state until it does).
- `status()` is the `/readyz` detail; `up` is `mcp_recovery_state_store_up`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from proxy.state.config import SCHEMES, StateConfigError, check_url

__all__ = ["SCHEMES", "SharedState", "StateConfigError", "build_state", "check_url"]

if TYPE_CHECKING:
    from proxy.recovery.antistorm import AntiStorm
    from proxy.recovery.ledger import ExhaustedEntry, InMemoryLedger
    from proxy.settings import Settings
    from proxy.state.resends import SharedResends


class SharedState(Protocol):
    ledger: InMemoryLedger
    description: str
    resends: SharedResends

    @property
    def up(self) -> bool: ...

    def attach(self, antistorm: AntiStorm) -> None: ...

    async def check(self) -> None: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def approve(self, op: str, budget_id: str, now_s: float) -> bool: ...

    async def recorded(self, entry: ExhaustedEntry) -> None: ...

    def cleared(self, op: str) -> None: ...

    def status(self) -> dict[str, Any]: ...


def build_state(settings: Settings, *, upstream_name: str) -> SharedState | None:
    """The shared store the settings name, or None for `memory` (redis is imported only then)."""
    tls_flags = {
        "--state-ca": settings.state_ca,
        "--state-client-cert": settings.state_client_cert,
        "--state-client-key": settings.state_client_key,
    }
    given = [flag for flag, value in tls_flags.items() if value is not None]
    if settings.state == "memory":
        if given:
            raise ValueError(f"{', '.join(given)}: only for a TLS store (rediss://, valkeys://), not --state memory")
        return None
    tls, _ = check_url(settings.state)
    if given and not tls:
        raise ValueError(f"{', '.join(given)}: only for a TLS store (rediss://, valkeys://), not a plain one")
    from proxy.state.shared import RedisState

    return RedisState(
        settings.state,
        prefix=settings.state_prefix,
        timeout_s=settings.state_timeout_s,
        sync_interval_s=settings.state_sync_interval_s,
        upstream_name=upstream_name,
        ca=settings.state_ca,
        client_cert=settings.state_client_cert,
        client_key=settings.state_client_key,
    )
