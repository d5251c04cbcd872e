"""The ledger, approvals and retry budget shared through Redis or Valkey (docs/state.md).

Keys (`P` is `--state-prefix`, default `mcp-recovery:`; the `{…}` part is a Redis Cluster hash
tag, so one operation's key, and one tool's budget buckets, stay on one shard):
- `P ledger:{<operation digest>}`: a hash (`b` budget id, `r` stop reason, `t` recorded at, epoch
  ms, `s` the summary as JSON, `a` "1" once the approval is spent) with a PEXPIRE of the ledger
  window: the store never needs cleaning. The digest is `operation_digest` as the engine computes
  it (principal-scoped when authentication is on), never recomputed here.
- `P budget:…` and `P budget-tools:…`: the fleet's retry budget (proxy/state/budget.py).
- channel `P ledger`: every record, approval and clear, published by the script that makes it,
  so each replica's local view follows the store.

Every write is one Lua script (EVALSHA): record, approve (compare, spend and publish in one step:
two replicas racing on one budget id approve exactly one call) and clear are atomic and one round
trip each; nothing is read and then written from Python.

Bounded: every store operation is awaited at most `timeout_s` (the client's socket timeouts are the
same bound, and redis-py's own retries are off). A failed operation marks the store down: until the
sync task reaches it again, calls skip it entirely (no call waits on a store known to be down), the
ledger is the local view (entries recorded meanwhile are kept for the store), approvals of budgets
the store holds are refused (single use cannot be checked), and the retry budget is this replica's
own. When the store answers again, the proxy reconciles: it writes the live entries it knows
(without overwriting the store's), deletes what it cleared while down, and reads the store's
entries back into its view. A store restarted empty thus gets back every entry a replica still
holds; spent approvals included. A spend is never undone: an approval the view knows spent is
refused without asking the store, and a store entry that lacks a spend the view knows of (the same
budget: lost in a failover, replication being asynchronous) gets it written back.

Clients (`open_client`, proxy/state/connect.py): to one server, redis-py's asyncio `Redis`. To a
Redis Cluster (`…+cluster://`), redis-py's asyncio `RedisCluster`: each script's keys share one
hash slot, the scripts are loaded on every primary at each reconcile, the reconcile SCANs every
primary, and the channel is a classic one (a PUBLISH on any node reaches every node's
subscribers). A cluster is up when every primary answers: the sync task PINGs them all each
interval, so a dead primary marks the store down for every replica (a success on another slot
does not mark it up again) until its replica is promoted, and every replica then reconciles. Over
TLS, every connection, to one server or to any node of a cluster, uses the one verifying context
built from `--state-ca` and the client certificate (proxy/net/tls.py), replaced when those
files are renewed (`TlsWatcher`: new connections use the new one, a bad renewal keeps the last
good one). Any exception the client raises is a store that did not answer (the cluster client
raises more than `RedisError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson
from redis.asyncio.cluster import RedisCluster

from proxy.net.tls import TlsFiles, TlsWatcher
from proxy.recovery.antistorm import AntiStorm
from proxy.recovery.ledger import DEFAULT_MAX_ENTRIES, ExhaustedEntry, InMemoryLedger
from proxy.recovery.reasons import StopReason
from proxy.secret_values import SECRETS
from proxy.state import scripts
from proxy.state.budget import BudgetSync
from proxy.state.config import StateConfigError, check_url
from proxy.state.connect import (
    STORE_ERRORS,
    StoreUnavailable,
    TlsContext,
    describe,
    glob_escape,
    open_client,
    refusal,
    scan,
)
from proxy.state.resends import ANSWERED, GONE, LISTED, SharedResends

log = logging.getLogger("proxy.state")
T = TypeVar("T")

# Closed label sets of the metrics (proxy/state/metrics.py).
OPERATIONS = ("ping", "record", "approve", "clear", "budget", "subscribe", "reconcile", "resend")
FALLBACKS = ("record", "approve", "clear", "budget", "resend")
MAX_PENDING_TASKS = 256  # background clears in flight; past it a clear waits for the reconcile
RESUBSCRIBE_MAX_S = 2.0
LISTEN_POLL_S = 0.25  # how long the listener waits for a message before it checks for a resubscribe
MAX_UNANSWERED = 1024  # approvals whose answer was lost, remembered to be honoured once (see approve)
CHECK_TIMEOUT_S = 2.0  # the bound of the check before serving (a TLS handshake on a loaded machine)


class RedisState:
    """`SharedState` on Redis or Valkey (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "mcp-recovery:",
        timeout_s: float = 0.5,
        sync_interval_s: float = 0.25,
        upstream_name: str = "",
        ca: Path | None = None,
        client_cert: Path | None = None,
        client_key: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self.description = describe(url)
        self.ledger = InMemoryLedger(clock, max_entries=max_entries)
        self.prefix = prefix
        self.channel = f"{prefix}ledger"
        self.timeout_s = timeout_s
        self.sync_interval_s = sync_interval_s
        self.clock = clock
        self.wall = wall
        self._replica = os.urandom(6).hex()  # our own messages come back on the channel: skipped
        tls, self.cluster = check_url(url)
        self.tls: TlsContext | None = None
        self.tls_watcher: TlsWatcher | None = None
        if tls:
            files = TlsFiles(ca=ca, cert=client_cert, key=client_key, flag="--state")
            self.tls = TlsContext(files.build())  # TlsConfigError (a ValueError) names the flag: exit 2
            if files.paths:
                self.tls_watcher = TlsWatcher(files, self.tls.replace, name="shared state")
                self.tls_watcher.on_done = self._changed
        self.client = open_client(url, self.cluster, self.tls, timeout_s)
        self._record = self.client.register_script(scripts.RECORD)
        self._approve = self.client.register_script(scripts.APPROVE)
        self._clear = self.client.register_script(scripts.CLEAR)
        self._up = False
        self._ever_up = False
        self._closed = False
        self.errors: dict[str, int] = dict.fromkeys(OPERATIONS, 0)
        self.fallbacks: dict[str, int] = dict.fromkeys(FALLBACKS, 0)
        self.reconciles = 0
        self.last_error: str | None = "not connected yet"
        self._pending: dict[str, None] = {}  # ops recorded while the store was down (ordered set)
        self._unanswered: dict[tuple[str, str], str] = {}  # (op, budget id): nonce of a lost approval
        self._unsynced_clears: dict[str, None] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._resubscribe = asyncio.Event()
        self._reconcile_lock = asyncio.Lock()
        # The fleet's retry budget, exchanged by the sync task (proxy/state/budget.py).
        self.budget = BudgetSync(
            self.client, self._call, self._failed, prefix=prefix, upstream_name=upstream_name, clock=clock, wall=wall
        )
        # The re-send records of the fleet (proxy/state/resends.py), on the same channel.
        self.resends = SharedResends(
            self.client,
            self._call,
            lambda: self._up,
            self._message,
            self._resend_dropped,
            prefix=prefix,
            channel=self.channel,
            replica=self._replica,
            clock=clock,
        )
        # Called after the view, `up` or a reconcile changed (tests wait on it; None: nobody asks).
        self.on_change: Callable[[], None] | None = None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _resend_dropped(self, n: int) -> None:
        self.fallbacks["resend"] += n

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self._up

    def attach(self, antistorm: AntiStorm) -> None:
        self.budget.antistorm = antistorm

    @property
    def budget_syncs(self) -> int:
        """Completed exchanges of the retry budget's counts."""
        return self.budget.budget_syncs

    def _ping(self) -> Awaitable[Any]:
        """A PING to one node, or to every primary of a cluster (each holds its own slots)."""
        if isinstance(self.client, RedisCluster):
            return self.client.ping(target_nodes=RedisCluster.PRIMARIES)
        return self.client.ping()

    async def check(self) -> None:
        """Before the proxy serves (proxy/state/__init__.py): a store that answers and refuses the
        proxy's TLS or credentials raises `StateConfigError`; one that does not answer is left to
        `start` and the sync task (local state until it does)."""
        try:
            await asyncio.wait_for(self._ping(), max(self.timeout_s, CHECK_TIMEOUT_S))
        except STORE_ERRORS as exc:
            refused = refusal(exc)
            if refused is not None:
                raise StateConfigError(f"--state {self.description}: {refused}") from None
            self._failed("ping", exc)

    async def start(self) -> None:
        """Connect (bounded); a store that does not answer yet leaves the proxy on local state."""
        with contextlib.suppress(StoreUnavailable):
            await self._call("ping", self._ping(), whole=True)
        if not self._up:
            log.warning("shared state %s unreachable at start: local state until it answers", self.description)
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._sync_loop())]
        if self.tls_watcher is not None:
            await self.tls_watcher.start()

    async def aclose(self) -> None:
        """Stop the listener, the sync task and background clears, bounded: on Python 3.11 a
        cancellation that lands as a `wait_for` completes can be lost, so the loops also stop on
        `_closed`, and the wait for them is bounded."""
        self._closed = True
        if self.tls_watcher is not None:
            await self.tls_watcher.aclose()
        await self.resends.aclose()
        tasks = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=4 * self.timeout_s + 1)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.aclose(), self.timeout_s)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"store": self.description, "up": self._up}
        if not self._up:
            out["fallback"] = (
                "local ledger and retry budget; approvals of shared budgets refused; re-sends matched per replica"
            )
            out["error"] = self.last_error
        out["pendingEntries"] = len(self._pending)
        out["entries"] = len(self.ledger)
        out["resendRecords"] = len(self.resends.view)
        watcher = self.tls_watcher
        if watcher is not None and (watcher.reloads_ok or watcher.reloads_error):
            out["tls"] = {"reloads": watcher.reloads_ok, "refused": watcher.reloads_error}
            if watcher.last_error is not None:
                out["tls"]["error"] = watcher.last_error[:300]
        return out

    # -- the bound on every operation -----------------------------------------------------------
    async def _call(self, operation: str, awaitable: Awaitable[T], *, whole: bool = False) -> T:
        """`awaitable` bounded; a failure marks the store down. A success marks it up again, except
        on a cluster, where it must be `whole` (every primary answered): one slot's answer says
        nothing of the slots a dead primary held, and up/down would flap at every sync."""
        try:
            result = await asyncio.wait_for(awaitable, self.timeout_s)
        except Exception as exc:  # translated where it enters: any failure of the
            # client, a cluster client's internal errors included, is a store that did not answer
            self._failed(operation, exc)
            raise StoreUnavailable(operation) from None
        if not self._up and (whole or not self.cluster):
            self._came_back()
        return result

    def _failed(self, operation: str, exc: BaseException) -> None:
        self.errors[operation] = self.errors.get(operation, 0) + 1
        # The class and a scrubbed, cut message: a store error may echo a URL with its password.
        why = type(exc).__name__ + (f": {SECRETS.scrub(str(exc))[:160]}" if str(exc) else "")
        self.last_error = f"{operation}: {why}"
        if self._up:
            log.warning("shared state %s down (%s): local state until it answers", self.description, self.last_error)
        self._up = False
        self.resends.store_changed()  # a re-send waiting on the store stops waiting
        self._changed()

    def _came_back(self) -> None:
        self._up = True
        self.last_error = None
        if self._ever_up:
            log.warning("shared state %s answers again: reconciling", self.description)
        self._ever_up = True
        self._resubscribe.set()  # the listener resubscribes and reconciles (one place does both)
        self._changed()

    # -- the ledger -----------------------------------------------------------------------------
    def _key(self, op: str) -> str:
        return f"{self.prefix}ledger:{{{op}}}"

    def _message(self, kind: str, op: str, **fields: Any) -> bytes:
        return orjson.dumps({"k": kind, "o": op, "from": self._replica, **fields})

    def _record_args(self, entry: ExhaustedEntry, now_s: float, *, only_if_absent: bool) -> list[Any]:
        ttl_ms = max(1, math.ceil(entry.retry_after_s(now_s) * 1000))
        recorded_ms = int((self.wall() - (now_s - entry.recorded_at_s)) * 1000)
        summary = orjson.dumps(dict(entry.summary)).decode()
        approved = "1" if entry.approved else "0"
        message = self._message(
            "r", entry.op, b=entry.budget_id, r=entry.reason.value, t=recorded_ms, s=summary, a=approved, ttl=ttl_ms
        )
        absent = "1" if only_if_absent else "0"
        reason = entry.reason.value
        return [entry.budget_id, reason, recorded_ms, summary, approved, ttl_ms, absent, self.channel, message]

    async def recorded(self, entry: ExhaustedEntry) -> None:
        if not self._up:
            self._keep_local(entry.op)
            return
        try:
            args = self._record_args(entry, self.clock(), only_if_absent=False)
            await self._call("record", self._record(keys=[self._key(entry.op)], args=args))
        except StoreUnavailable:
            self._keep_local(entry.op)
        else:
            self._pending.pop(entry.op, None)

    def _keep_local(self, op: str) -> None:
        self.fallbacks["record"] += 1
        self._pending.pop(op, None)
        self._pending[op] = None
        while len(self._pending) > DEFAULT_MAX_ENTRIES:
            self._pending.pop(next(iter(self._pending)))

    async def approve(self, op: str, budget_id: str, now_s: float) -> bool:
        if op in self._pending:
            # Recorded while the store was unreachable: only this replica holds it, so its
            # single use is decided here.
            return self.ledger.approve(op, budget_id, now_s)
        known = self.ledger.check(op, now_s)
        if (
            known is not None
            and known.approved
            and known.budget_id == budget_id
            and (op, budget_id) not in self._unanswered
        ):
            # The view learnt this spend from the store (our answer, the channel, a read): a spend
            # is never undone, so it is refused here even if the store no longer says so. A
            # failover to a replica that had not received the spend (replication is asynchronous)
            # would otherwise approve the budget a second time (docs/state.md). With a nonce of
            # ours outstanding, the store decides: it may be our own lost spend, honoured once.
            return False
        if not self._up:
            self.fallbacks["approve"] += 1
            return False  # single use cannot be checked: refused (fail closed, docs/state.md)
        message = self._message("a", op, b=budget_id)
        # An attempt that timed out may still run when a stalled store wakes up (its command was
        # sent) and spend the approval though the caller was refused. Each attempt carries a nonce
        # the script stores with the spend; an attempt that went unanswered leaves its nonce here,
        # and the next approval of the same budget through this replica takes it over, so a spend
        # whose answer was lost is honoured once, and single use still holds (a nonce is taken
        # by one attempt at a time).
        nonce = self._unanswered.pop((op, budget_id), None) or os.urandom(8).hex()
        try:
            verdict = await self._call(
                "approve", self._approve(keys=[self._key(op)], args=[budget_id, self.channel, message, nonce])
            )
        except StoreUnavailable:
            self.fallbacks["approve"] += 1
            self._unanswered[(op, budget_id)] = nonce
            while len(self._unanswered) > MAX_UNANSWERED:
                self._unanswered.pop(next(iter(self._unanswered)))
            return False
        if verdict == 1:
            self.ledger.approve(op, budget_id, now_s)
            return True
        return False

    def cleared(self, op: str) -> None:
        self._pending.pop(op, None)
        if not self._up or len(self._background) >= MAX_PENDING_TASKS:
            self.fallbacks["clear"] += 1
            self._unsynced_clears[op] = None
            return
        task = asyncio.get_running_loop().create_task(self._clear_in_store(op))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _clear_in_store(self, op: str) -> None:
        try:
            await self._call("clear", self._clear(keys=[self._key(op)], args=[self.channel, self._message("c", op)]))
        except StoreUnavailable:
            self._unsynced_clears[op] = None

    def _on_message(self, data: bytes) -> None:
        try:
            msg = orjson.loads(data)
            if msg.get("from") == self._replica:
                return
            op, kind = msg["o"], msg["k"]
            now = self.clock()
            if kind == "r":
                if self._keeps_spend(op, msg["b"], msg["a"] == "1", now):
                    self._respend_later(op, msg["b"])  # a replica that never saw the spend wrote it back
                else:
                    self._learn(op, msg["b"], msg["r"], msg["t"], msg["s"], msg["a"] == "1", msg["ttl"] / 1000, now)
            elif kind == "a":
                self.ledger.approve(op, msg["b"], now)
            elif kind == "c":
                self.ledger.clear(op)
            elif kind in (LISTED, ANSWERED, GONE):
                self.resends.on_message(kind, msg)
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignored a malformed message on %s", self.channel)
        self._changed()

    def _keeps_spend(self, op: str, budget_id: str, approved: bool, now_s: float) -> bool:
        """The store (or a replica writing back what it held) shows an unspent entry whose spend
        the view knows of: the same budget, so the spend was lost (a failover to a replica that had
        not received it, a store restarted empty and refilled by a replica that never learnt it).
        A spend is never undone: the view keeps it, and it is written back."""
        entry = self.ledger.check(op, now_s)
        return entry is not None and entry.budget_id == budget_id and entry.approved and not approved

    def _respend_later(self, op: str, budget_id: str) -> None:
        if not self._up or len(self._background) >= MAX_PENDING_TASKS:
            return  # the next reconcile finds it again (its pull compares the same way)
        task = asyncio.get_running_loop().create_task(self._respend([(op, budget_id)]))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _respend(self, spends: list[tuple[str, str]]) -> None:
        """Write spends the store lost back to it (the approve script, a fresh nonce each: it
        publishes them, so every replica's view has them too). One at a time: they are rare, and
        the script object loads itself where a promoted replica does not know it yet."""
        with contextlib.suppress(StoreUnavailable):
            for op, budget in spends:
                args: list[str | bytes] = [budget, self.channel, self._message("a", op, b=budget), os.urandom(8).hex()]
                await self._call("reconcile", self._approve(keys=[self._key(op)], args=args))
            log.warning(
                "shared state %s had lost %d spent approval(s) (a failover?): written back",
                self.description,
                len(spends),
            )

    def _learn(
        self, op: str, budget_id: str, reason: str, recorded_ms: int, summary: str | Mapping[str, Any],
        approved: bool, ttl_s: float, now_s: float,
    ) -> None:  # fmt: skip
        """An entry the store holds, into the local view (its age and time left kept)."""
        age_s = max(0.0, self.wall() - recorded_ms / 1000)
        data = orjson.loads(summary) if isinstance(summary, str | bytes) else dict(summary)
        self.ledger.record_exhausted(op, budget_id, StopReason(reason), age_s + ttl_s, now_s - age_s, data)
        if approved:
            self.ledger.approve(op, budget_id, now_s)

    # -- keeping the view current ---------------------------------------------------------------
    async def _listen(self) -> None:
        """Subscribe, reconcile, then apply every message; start again after any failure."""
        delay_s = 0.05
        while not self._closed:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await self._call("subscribe", pubsub.subscribe(self.channel))
                self._resubscribe.clear()
                await self._reconcile()
                delay_s = 0.05
                while not self._resubscribe.is_set() and not self._closed:
                    # (a short wait: a store that came back is reconciled within it)
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=LISTEN_POLL_S)
                    if message is not None and message.get("type") == "message":
                        self._on_message(message["data"])
            except asyncio.CancelledError:
                raise
            except StoreUnavailable:
                pass
            except Exception as exc:  # redis-py's cluster pub/sub raises KeyError
                # while it knows no node; whatever it is, the listener must live on and retry
                self._failed("subscribe", exc)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), self.timeout_s)
            if not self._resubscribe.is_set():
                with contextlib.suppress(TimeoutError):  # the store seen back ends the backoff
                    await asyncio.wait_for(self._resubscribe.wait(), delay_s)
                delay_s = min(delay_s * 2, RESUBSCRIBE_MAX_S)

    async def _reconcile(self) -> None:
        """After (re)subscribing: write what the store lacks, then read the store into the view."""
        async with self._reconcile_lock:
            try:
                # A new or restarted store (or every primary of a cluster) has none of our scripts
                # (they are not persisted): load them once here, so the pipelines below and the
                # budget sync can name them by their hash.
                for script in scripts.ALL:
                    await self._call("reconcile", self.client.script_load(script))
                now = self.clock()
                pipe = self.client.pipeline(transaction=False)
                pushed = 0
                for op in self.ledger.ops():
                    entry = self.ledger.check(op, now)
                    if entry is not None:
                        args = self._record_args(entry, now, only_if_absent=True)
                        # (by name: redis-py's cluster pipeline blocks its evalsha() method, though
                        # it routes EVALSHA by its first key, as the single-node one does)
                        pipe.execute_command("EVALSHA", self._record.sha, 1, self._key(op), *args)
                        pushed += 1
                for op in self._unsynced_clears:
                    pipe.delete(self._key(op))
                if pushed or self._unsynced_clears:
                    await self._call("reconcile", pipe.execute())
                self._pending.clear()
                self._unsynced_clears.clear()
                await self._pull()
                await self.resends.pull()
            except StoreUnavailable:
                return
            except STORE_ERRORS as exc:
                self._failed("reconcile", exc)
                return
            self.reconciles += 1
            self._changed()

    async def _pull(self) -> None:
        """Every live entry of the store into the local view; local entries the store lacks (it
        expired them, or a replica cleared them) are forgotten. A spend the view knows of and the
        store's entry lacks (the same budget: a write lost in a failover) is kept, and written
        back to the store (a spend is never undone)."""
        found: set[str] = set()
        respend: list[tuple[str, str]] = []
        prefix = f"{self.prefix}ledger:{{"
        async for keys in scan(self.client, self._call, f"{glob_escape(prefix)}*"):
            if keys:
                pipe = self.client.pipeline(transaction=False)
                for key in keys:
                    pipe.hgetall(key)
                    pipe.pttl(key)
                replies = await self._call("reconcile", pipe.execute())
                now = self.clock()
                for key, fields, ttl_ms in zip(keys, replies[::2], replies[1::2], strict=True):
                    op = key.decode()[len(prefix) : -1]
                    if not fields or ttl_ms <= 0 or b"b" not in fields:
                        continue
                    found.add(op)
                    entry = self.ledger.check(op, now)
                    budget, approved = fields[b"b"].decode(), fields.get(b"a") == b"1"
                    if self._keeps_spend(op, budget, approved, now):
                        respend.append((op, budget))
                    elif entry is None or entry.budget_id != budget or entry.approved != approved:
                        self._learn(
                            op, budget, fields[b"r"].decode(), int(fields[b"t"]), fields[b"s"].decode(),
                            approved, ttl_ms / 1000, now,
                        )  # fmt: skip
            if len(found) >= 2 * DEFAULT_MAX_ENTRIES:
                break
        for op in self.ledger.ops():
            if op not in found:
                self.ledger.clear(op)
        if respend:
            await self._respend(respend)

    # -- the fleet's retry budget ---------------------------------------------------------------
    async def _sync_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.sync_interval_s)
            try:
                if self.cluster:
                    # Every primary, every interval: a dead one is seen (and its replica's
                    # promotion reconciled) even by a replica none of whose operations touch it.
                    await self._call("ping", self._ping(), whole=True)
                await self.sync_budget()
            except StoreUnavailable:
                self.fallbacks["budget"] += 1

    async def sync_budget(self) -> None:
        """One exchange of the retry budget's counts with the store (proxy/state/budget.py)."""
        await self.budget.sync()
