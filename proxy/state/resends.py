"""The re-send records shared by the replicas (docs/recovery.md, "Re-sends"; proxy/core/resend.py).

A client whose stream broke re-sends its call, and behind one address the re-send may reach
another replica. With a shared store, each replica's re-send table (`Resends`) tells the store of
the calls it lists, so the replica the re-send reaches answers it with the first call's execution
instead of running the tool again.

Keys (`P` is `--state-prefix`; the `{…}` part is a Redis Cluster hash tag: one record, one slot):
- `P resend:{<operation digest>}`: a hash: `s` (`r` running, `a` answered), `o` the replica that
  listed it, `k` "1" for a call with the caller's idempotency key (its digest is the key's),
  `g` that call's arguments digest, and `a` the answer as the client would have got it (JSON,
  secrets removed). Running, its TTL is the call's deadline (a replica that dies with the call
  leaves nothing behind past it); answered, the re-send window. Digests only: no key, argument or
  principal is stored in the clear.
- channel `P ledger` (the ledger's): `rs-l` (listed), `rs-a` (answered), `rs-g` (gone), each with
  the operation digest, so every replica keeps a local view of the records (`find`: no round trip
  on the call path).

Contract (`SharedResends`, one per `RedisState`):
- `listed`, `answered`, `gone` are what the local table reports; they return at once and are
  written in the background in order (one script each, atomic: `RESEND_CLAIM` lists a running call
  only if no replica listed it (SET NX: one record per operation), `RESEND_ANSWER` stores the
  answer unless another replica holds the record, `RESEND_GONE` deletes it (`own`: only if ours)).
  While the store is down, or past `MAX_PENDING_WRITES`, a write is dropped (counted as the
  fallback `resend`): each replica then matches the re-sends that reach it only, as with
  `--state memory`.
- `find(op)` is the local view of the records: the channel's messages and, at each reconcile, a
  read of every record. Its staleness is the channel's delivery time: a re-send that reaches a
  replica before the listing's message does runs as a new call there.
- `answer(op, bound_s)` is a re-send's wait: the kept answer (one GET), or, while the record says
  running, until its `rs-a` message (then one GET), at most `bound_s` and the record's own TTL; it
  also ends when the record goes or the store goes down. None when there is no answer to give: the
  re-send then runs as a call of its own, and the record leaves this replica's view.
- Bounded: the view holds at most `MAX_VIEW` records (the oldest go first) and forgets a record at
  its TTL; an answer is stored only within the local table's per-answer bound (the table does not
  share a larger one); every store operation is bounded by the state's `call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from proxy.jsonrpc import Message
from proxy.state import scripts
from proxy.state.connect import StoreUnavailable, glob_escape, scan

log = logging.getLogger("proxy.state")

MAX_PENDING_WRITES = 1024  # writes waiting for the store; past it a write is dropped (per-process matching)
MAX_VIEW = 20_000  # records of the fleet a replica's view holds (twice a table's entries)
RUN_GRACE_S = 5.0  # a running record outlives its call's deadline by this (the answer's way to the store)
LISTED, ANSWERED, GONE = "rs-l", "rs-a", "rs-g"


class Record:
    """One listed call of the fleet, as this replica's view knows it."""

    __slots__ = ("answered", "arguments_op", "expires_at", "keyed")

    def __init__(self, answered: bool, keyed: bool, arguments_op: str | None, expires_at: float) -> None:
        self.answered = answered
        self.keyed = keyed
        self.arguments_op = arguments_op if keyed else None
        self.expires_at = expires_at


class SharedResends:
    """The `SharedTable` of proxy/core/resend.py on Redis or Valkey (module docstring)."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        call: Callable[[str, Awaitable[Any]], Awaitable[Any]],
        up: Callable[[], bool],
        message: Callable[..., bytes],
        dropped: Callable[[int], None],
        *,
        prefix: str,
        channel: str,
        replica: str,
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self._call = call  # the state's bound on every store operation (a failure marks it down)
        self._up = up
        self._message = message  # the state's channel message (its replica id included)
        self._dropped = dropped  # counts writes not made (the state's fallback `resend`)
        self.prefix = prefix
        self.channel = channel
        self.replica = replica
        self.clock = clock
        self._claim = client.register_script(scripts.RESEND_CLAIM)
        self._answer = client.register_script(scripts.RESEND_ANSWER)
        self._gone = client.register_script(scripts.RESEND_GONE)
        self.view: OrderedDict[str, Record] = OrderedDict()
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._writes: deque[tuple[str, str, list[Any]]] = deque()
        self._writer: asyncio.Task[None] | None = None
        self.on_gone: Callable[[str], None] | None = None  # the local table's `forget`

    def __bool__(self) -> bool:
        return bool(self.view)

    def key(self, op: str) -> str:
        return f"{self.prefix}resend:{{{op}}}"

    # -- what the local table reports (at once; written in the background) ----------------------
    def listed(self, op: str, keyed: bool, arguments_op: str | None, run_s: float) -> None:
        ttl_ms = max(1, int((run_s + RUN_GRACE_S) * 1000))
        args = ["1" if keyed else "0", arguments_op or ""]
        message = self._message(LISTED, op, y=args[0], g=args[1], ttl=ttl_ms)
        self._write(LISTED, op, [self.replica, ttl_ms, *args, self.channel, message])

    def answered(self, op: str, data: bytes, keep_s: float, keyed: bool, arguments_op: str | None) -> None:
        ttl_ms = max(1, int(keep_s * 1000))
        args = ["1" if keyed else "0", arguments_op or ""]
        message = self._message(ANSWERED, op, y=args[0], g=args[1], ttl=ttl_ms)
        self._write(ANSWERED, op, [self.replica, data, ttl_ms, *args, self.channel, message])

    def gone(self, op: str, own: bool) -> None:
        self._forget(op)  # at once: an identical call after the delivery is a new call here too
        self._write(GONE, op, [self.channel, self._message(GONE, op), "1" if own else "0", self.replica])

    async def claim(self, op: str, arguments_op: str, run_s: float) -> bool | None:
        """A keyed call's record, claimed before the call runs (one bounded round trip): True,
        ours; False, another replica's (its record is in the view now); None, the store did not
        answer (the call runs, matched on this replica only)."""
        if not self._up():
            self._dropped(1)
            return None
        ttl_ms = max(1, int((run_s + RUN_GRACE_S) * 1000))
        message = self._message(LISTED, op, y="1", g=arguments_op, ttl=ttl_ms)
        args: list[str | bytes | int] = [self.replica, ttl_ms, "1", arguments_op, self.channel, message]
        try:
            reply = await self._call("resend", self._claim(keys=[self.key(op)], args=args))
        except StoreUnavailable:
            self._dropped(1)
            return None
        if reply == 1:
            self._learn(op, False, True, arguments_op, ttl_ms / 1000)
            return True
        state, keyed, other, ttl = reply[1:] if isinstance(reply, list) and len(reply) == 5 else (None,) * 4
        if state is None or not ttl or int(ttl) <= 0:
            return None  # gone meanwhile: run, as if the store had not answered
        self._learn(op, state == b"a", keyed == b"1", (other or b"").decode(), int(ttl) / 1000)
        return False

    def _write(self, kind: str, op: str, args: list[Any]) -> None:
        if not self._up() or len(self._writes) >= MAX_PENDING_WRITES:
            self._dropped(1)
            return
        self._writes.append((kind, op, args))
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """The writes, in the order they were made (a call's listing before its answer)."""
        try:
            while self._writes:
                kind, op, args = self._writes.popleft()
                script = {LISTED: self._claim, ANSWERED: self._answer, GONE: self._gone}[kind]
                try:
                    done = await self._call("resend", script(keys=[self.key(op)], args=args))
                except StoreUnavailable:
                    self._dropped(1 + len(self._writes))
                    self._writes.clear()
                    return
                if done != 1:  # (a claim another replica holds answers its record: not ours)
                    continue  # another replica's record: its own messages keep the view
                if kind == GONE:
                    self._forget(op)
                elif not any(k == GONE and o == op for k, o, _ in self._writes):
                    # ours in the store: our view has it too (our messages are skipped), unless
                    # its end is on its way (`gone` took it out of the view already)
                    ttl_ms = args[1] if kind == LISTED else args[2]
                    keyed, arguments_op = (args[2], args[3]) if kind == LISTED else (args[3], args[4])
                    self._learn(op, kind == ANSWERED, keyed == "1", arguments_op, ttl_ms / 1000)
        finally:
            self._writer = None

    # -- the view ---------------------------------------------------------------------------------
    def find(self, op: str) -> Record | None:
        record = self.view.get(op)
        if record is not None and record.expires_at <= self.clock():
            self._forget(op)
            return None
        return record

    def _learn(self, op: str, answered: bool, keyed: bool, arguments_op: str | None, ttl_s: float) -> None:
        self.view.pop(op, None)
        self.view[op] = Record(answered, keyed, arguments_op, self.clock() + ttl_s)
        while len(self.view) > MAX_VIEW:
            self.view.popitem(last=False)
        if answered:
            self._wake(op)

    def _forget(self, op: str) -> None:
        self.view.pop(op, None)
        self._wake(op)

    def on_message(self, kind: str, msg: dict[str, Any]) -> None:
        """A record listed, answered or gone on another replica (the state's listener)."""
        op = msg["o"]
        if not isinstance(op, str):
            raise ValueError("op")
        if kind == GONE:
            self._forget(op)
            if self.on_gone is not None:
                self.on_gone(op)  # delivered there: what this replica kept of it is delivered too
            return
        self._learn(op, kind == ANSWERED, msg["y"] == "1", str(msg["g"]), int(msg["ttl"]) / 1000)

    async def pull(self) -> None:
        """Every record of the store into the view, replacing it (at each reconcile)."""
        found: OrderedDict[str, Record] = OrderedDict()
        prefix = f"{self.prefix}resend:{{"
        now = self.clock()
        async for keys in scan(self.client, self._call, glob_escape(prefix) + "*"):
            if keys:
                pipe = self.client.pipeline(transaction=False)
                for key in keys:
                    pipe.hmget(key, ["s", "k", "g"])
                    pipe.pttl(key)
                replies = await self._call("reconcile", pipe.execute())
                for key, (state, keyed, arguments_op), ttl_ms in zip(keys, replies[::2], replies[1::2], strict=True):
                    if state is None or ttl_ms <= 0:
                        continue
                    op = key.decode()[len(prefix) : -1]
                    found[op] = Record(
                        state == b"a", keyed == b"1", (arguments_op or b"").decode(), now + ttl_ms / 1000
                    )
            if len(found) >= MAX_VIEW:
                break
        self.view = found
        self.store_changed()

    def store_changed(self) -> None:
        """The store went down or was read again: every waiting re-send looks again."""
        for op in list(self._waiters):
            self._wake(op)

    # -- a re-send's wait -------------------------------------------------------------------------
    async def answer(self, op: str, bound_s: float) -> Message | None:
        until = self.clock() + bound_s
        while True:
            record = self.find(op)
            if record is None or record.answered or not self._up():
                break
            left = min(until, record.expires_at) - self.clock()
            if left <= 0:
                break
            await self._wait(op, left)
        # answered, gone, expired, or the wait is over: the store says (one bounded GET)
        answer: Message | None = None
        with contextlib.suppress(StoreUnavailable):
            if self._up():
                state, data = await self._call("resend", self.client.hmget(self.key(op), ["s", "a"]))
                if state == b"a" and data:
                    try:
                        loaded = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        log.warning("ignored a malformed re-send record in the shared store")
                    else:
                        answer = loaded if isinstance(loaded, dict) else None
        if answer is None:
            self.view.pop(op, None)  # not to be had: the re-send runs as a call of its own
        return answer

    async def _wait(self, op: str, timeout_s: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(op, []).append(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, timeout_s)
        finally:
            waiters = self._waiters.get(op)
            if waiters is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove(waiter)
                if not waiters:
                    del self._waiters[op]

    def _wake(self, op: str) -> None:
        for waiter in self._waiters.get(op, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def flushed(self) -> None:
        """Until the writes made so far reached the store (or were dropped)."""
        writer = self._writer
        if writer is not None:
            await asyncio.wait({writer})

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._writer, 1.0)
