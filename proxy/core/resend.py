"""Re-sends of a `tools/call` whose answer was lost: one execution, its answer to whoever asks again.

A client whose connection drops while a call runs, or whose read times out, sends the same call
again (a 2026 client must: a broken stream cannot be resumed). For a tool that changes state that
would run the effect twice. The proxy is the one place that knows whether an answer reached its
client, so it keeps the execution of such a call and answers the re-send with it
(docs/recovery.md, "Re-sends").

Contract:
- A `Flight` follows the answer of one call of a state-changing or idempotent tool, from the
  call's start until the answer reaches a client. The outbox carrying the call's answer (its
  holder, `Outbox.hold`) reports what happened to it: the answer itself (`answered`), that it was
  written to an open stream (`delivered`), that the stream closed before it was (`stranded`), or
  that the request ended without an answer (`abandoned`: the caller cancelled it explicitly, its
  session ended, the proxy shut down: none of these is a lost answer).
- A stranded flight is listed in `Resends` under its operation digest (principal, upstream, tool
  and arguments: `proxy.recovery.ledger.operation_digest`): while it runs, and once answered for
  `keep_s`. A call with the same digest that arrives meanwhile is answered by that flight
  (`Engine` attaches it: it never runs the tool) and the answer says so in `_meta` (`RESEND_KEY`).
  Once its answer reaches any client (the original caller's stream or a re-send's), the flight
  leaves the table: an identical call after a delivered answer is a new call.
- One flight per operation: a second stranded flight with a digest already listed is not listed.
- Bounded: an answer above `max_answer_bytes` is not kept (a re-send after it runs anew, as
  without this table); kept answers together hold at most `max_total_bytes` and the table
  `max_entries` flights (the oldest kept answer goes first); each kept answer for `keep_s`.
  Counted in `mcp_recovery_resends_total{event}` (`attached`, `kept`, `expired`, `evicted`,
  `too_large`).
- An explicit key (`_meta["io.mcp-recovery-proxy/idempotencyKey"]`, the caller's) makes the match
  exact: a keyed flight is listed under (principal, upstream, tool, key) from its start, whatever
  the tool's class, and stays listed after its answer was delivered, for `keep_s`: a call with
  the same key is answered by it (running, or kept), and one whose arguments differ is refused
  (`arguments_differ`), not run.
- Shared (`Resends.share`, with `--state redis://…`: proxy/state/resends.py): a listed flight is
  also told to the shared store (`SharedTable.listed`, then `answered`), so a re-send that reaches
  another replica is answered from the store (`Engine` attaches it to a flight of its own marked
  `remote`). A delivery tells the store (`gone`: an identical call after it is a new call on every
  replica; a keyed record stays for its window), as does an abandonment or an answer too large to
  keep. Every call into the shared table returns at once (its writes go in the background), and
  `find` is a lookup in its local view: the call path never waits on the store, except a re-send
  that another replica's call answers, which waits for that answer, bounded.
- No I/O: everything runs on the event loop's thread; the one timer is the loop's (expiry).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from proxy.jsonrpc import META_PREFIX, Message, dumps_out
from proxy.telemetry.shed import SHED

RESEND_KEY = f"{META_PREFIX}resend"
KEEP_S = 300.0
MAX_ANSWER_BYTES = 4 * 1024 * 1024
MAX_TOTAL_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 10_000


class SharedRecord(Protocol):
    """What the shared view knows of another replica's listed call (never its answer)."""

    keyed: bool
    arguments_op: str | None


class SharedTable(Protocol):
    """The re-send records shared by the replicas (proxy/state/resends.py `SharedResends`).

    Every method but `answer` returns at once: the writes go to the store in the background, in
    order, and are dropped while the store is away (each replica then matches its own calls only)."""

    on_gone: Callable[[str], None] | None

    def __bool__(self) -> bool: ...

    def listed(self, op: str, keyed: bool, arguments_op: str | None, run_s: float) -> None: ...

    def answered(self, op: str, data: bytes, keep_s: float, keyed: bool, arguments_op: str | None) -> None: ...

    def gone(self, op: str, own: bool) -> None: ...

    def find(self, op: str) -> SharedRecord | None: ...

    async def claim(self, op: str, arguments_op: str, run_s: float) -> bool | None: ...

    async def answer(self, op: str, bound_s: float) -> Message | None: ...


class Abandoned(Exception):
    """The flight a re-send waited for ended without an answer (its caller cancelled it)."""


class Flight:
    """One call's answer on its way to a client (see the module docstring for the hooks)."""

    __slots__ = (
        "_op",
        "_op_of",
        "_table",
        "_waiters",
        "answer",
        "arguments_op",
        "ended",
        "expires_at",
        "keyed",
        "listed",
        "remote",
        "run_s",
        "shared",
        "size",
    )

    def __init__(
        self,
        table: Resends,
        op_of: Callable[[], str],
        arguments_op: str | None = None,
        run_s: float = 0.0,
        *,
        remote: bool = False,
    ) -> None:
        self._table = table
        self._op_of = op_of
        self._op: str | None = None
        # a keyed flight (the caller's idempotency key): its operation digest without the key,
        # which a call with the same key must match
        self.arguments_op = arguments_op
        self.keyed = arguments_op is not None
        self._waiters: list[asyncio.Future[Message]] = []
        self.answer: Message | None = None
        self.ended = False  # delivered, or abandoned: never listed again
        self.listed = False
        self.expires_at = 0.0
        self.size = 0
        self.run_s = run_s  # how long the call may run at most (its deadline): the store's bound
        # a re-send answered from another replica's record (proxy/state/resends.py): its delivery
        # ends that record, nothing of it is written to the store
        self.remote = remote
        self.shared = remote  # the store holds a record this flight speaks for (ours, or remote)

    @property
    def op(self) -> str:
        """The operation digest, computed when the flight is first listed or compared."""
        if self._op is None:
            self._op = self._op_of()
        return self._op

    # -- what the holder reports --------------------------------------------------------------
    def answered(self, message: Message) -> None:
        """The call's answer (the first one counts: a re-send's copy of it changes nothing)."""
        if self.answer is not None or self.ended:
            return
        self.answer = message
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(message)
        self._waiters.clear()
        if self.listed:
            self._table.keep(self)

    def delivered(self) -> None:
        """The answer was written to an open stream: nothing is kept for a re-send (a keyed
        flight's answer stays, for a later call with the same key)."""
        if not self.ended:
            self.ended = True
            if not self.keyed:
                if self.listed:
                    self._table.unlist(self)
                if self.shared:
                    self._table.unshare(self)

    def arguments_differ(self, arguments_op: str) -> bool:
        """A call with this flight's key but other arguments (keyed flights only)."""
        return self.keyed and self.arguments_op != arguments_op

    def stranded(self) -> None:
        """The stream closed before the answer was written to it: a re-send may take it."""
        if not self.ended and not self.listed:
            self._table.list(self)

    def abandoned(self) -> None:
        """The call's own request ended without an answer (cancelled): re-sends run anew."""
        if self.answer is not None or self.ended:
            return
        self.ended = True
        if self.listed:
            self._table.unlist(self)
        if self.shared and not self.remote:
            self._table.unshare(self)  # the record ends without an answer: a re-send runs anew
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(Abandoned())
        self._waiters.clear()

    # -- what a re-send does ------------------------------------------------------------------
    async def wait(self) -> Message:
        """The answer, once there is one; `Abandoned` if the call ends without one. Cancelling the
        wait leaves the flight alone."""
        if self.answer is not None:
            return self.answer
        if self.ended:
            raise Abandoned()
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)


class Resends:
    """The stranded flights, by operation digest: running, and answered but not yet delivered."""

    def __init__(
        self,
        *,
        keep_s: float = KEEP_S,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        max_total_bytes: int = MAX_TOTAL_BYTES,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
        measure: Callable[[Message], int] = lambda message: len(dumps_out(message)),
    ) -> None:
        self.keep_s = keep_s
        self.max_answer_bytes = max_answer_bytes
        self.max_total_bytes = max_total_bytes
        self.max_entries = max_entries
        self.clock = clock
        self.measure = measure
        self.running: dict[str, Flight] = {}
        self.kept: OrderedDict[str, Flight] = OrderedDict()
        self.kept_bytes = 0
        self.attached = 0  # re-sends answered by an earlier execution, since start
        self._timer: asyncio.TimerHandle | None = None
        self.shared: SharedTable | None = None  # the replicas' records (`share`)

    def __bool__(self) -> bool:
        """Whether any flight is listed, here or (shared) by another replica (the engine
        computes no digest while none is)."""
        return bool(self.running) or bool(self.kept) or (self.shared is not None and bool(self.shared))

    def share(self, shared: SharedTable) -> None:
        """List flights in the replicas' shared store too (module docstring, "Shared")."""
        self.shared = shared
        shared.on_gone = self.forget

    def flight(self, op_of: Callable[[], str], run_s: float = 0.0) -> Flight:
        return Flight(self, op_of, None, run_s)

    def deaf(self) -> Flight:
        """A flight that hears nothing: what a re-send's outbox reports to once the re-send is
        answered otherwise than with the execution it waited for (its own deadline passed), so
        that answer is neither kept for a re-send nor taken as that execution's delivery."""
        flight = Flight(self, lambda: "")
        flight.ended = True
        return flight

    def keyed(self, op: str, arguments_op: str, run_s: float = 0.0, *, claimed: bool = False) -> Flight:
        """A flight for a call with the caller's idempotency key, listed from its start (under
        `op`, the key's digest) when the bounds allow. `claimed`: its record is in the shared
        store already (`SharedTable.claim`)."""
        flight = Flight(self, lambda: op, arguments_op, run_s)
        flight.shared = claimed
        self.list(flight)
        return flight

    def remote(self, op: str) -> SharedRecord | None:
        """Another replica's listed call of operation `op` (the shared view: no round trip)."""
        return self.shared.find(op) if self.shared is not None else None

    def attach_remote(self, op: str, record: SharedRecord) -> Flight:
        """The flight of a re-send answered from another replica's record (`Engine` waits for
        that answer): its delivery ends the record; if its own stream breaks too, it is listed
        here like any flight (a third re-send here takes it), and nothing of it goes to the store."""
        return Flight(self, lambda: op, record.arguments_op, remote=True)

    def forget(self, op: str) -> None:
        """Another replica delivered the answer of `op` (a re-send took it there): the answer
        kept here is delivered too, so an identical call after it is a new call here as well."""
        flight = self.kept.get(op)
        if flight is not None and not flight.keyed:
            flight.ended = True
            flight.shared = False
            self.unlist(flight)

    def find(self, op: str) -> Flight | None:
        """The listed flight of operation `op`, running or kept (an expired one is dropped first)."""
        self.expire()
        return self.running.get(op) or self.kept.get(op)

    def attached_one(self) -> None:
        self.attached += 1
        SHED.count("resends", "attached")

    # -- listing, keeping, dropping -------------------------------------------------------------
    def list(self, flight: Flight) -> None:
        op = flight.op
        if op in self.running or op in self.kept:
            return  # one flight per operation: re-sends attach to the first
        self.expire()
        while len(self.running) + len(self.kept) >= self.max_entries and self.kept:
            self._drop_oldest("evicted")
        if len(self.running) + len(self.kept) >= self.max_entries:
            SHED.count("resends", "evicted")  # every entry still running: this one is not listed
            return
        flight.listed = True
        shared = self.shared
        if shared is not None and not flight.remote:
            if flight.answer is None and not flight.shared:
                # claimed in the store now: a re-send on another replica waits for this call
                shared.listed(op, flight.keyed, flight.arguments_op, flight.run_s or self.keep_s)
            flight.shared = True
        if flight.answer is None:
            self.running[op] = flight
        else:
            self.keep(flight)

    def keep(self, flight: Flight) -> None:
        """A listed flight got its answer: kept for `keep_s`, within the byte bounds."""
        assert flight.answer is not None
        op = flight.op
        self.running.pop(op, None)
        size = self.measure(flight.answer)
        if size > self.max_answer_bytes or size > self.max_total_bytes:
            flight.listed = False
            SHED.count("resends", "too_large")
            if flight.shared and not flight.remote:
                self.unshare(flight)  # not shared either: a re-send elsewhere runs anew
            return
        shared = self.shared
        if shared is not None and flight.shared and not flight.remote:
            shared.answered(op, dumps_out(flight.answer), self.keep_s, flight.keyed, flight.arguments_op)
        flight.size = size
        flight.expires_at = self.clock() + self.keep_s
        self.kept[op] = flight
        self.kept_bytes += size
        SHED.count("resends", "kept")
        while self.kept_bytes > self.max_total_bytes:
            self._drop_oldest("evicted")
        self._arm()

    def unlist(self, flight: Flight) -> None:
        op = flight.op
        flight.listed = False
        if self.running.get(op) is flight:
            del self.running[op]
        elif self.kept.get(op) is flight:
            del self.kept[op]
            self.kept_bytes -= flight.size

    def unshare(self, flight: Flight) -> None:
        """The store's record of `flight` ends (delivered, abandoned, not kept)."""
        flight.shared = False
        if self.shared is not None:
            self.shared.gone(flight.op, not flight.remote)

    def expire(self) -> None:
        """Drop the kept answers whose time is up (oldest first: they were kept in that order)."""
        now = self.clock()
        while self.kept:
            flight = next(iter(self.kept.values()))
            if flight.expires_at > now:
                break
            self._drop_oldest("expired")

    def _drop_oldest(self, event: str) -> None:
        _, flight = self.kept.popitem(last=False)
        flight.listed = False
        self.kept_bytes -= flight.size
        SHED.count("resends", event)

    def _arm(self) -> None:
        """One loop timer for the oldest kept answer's expiry (so an idle proxy frees it too)."""
        if self._timer is not None or not self.kept:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # outside a loop (a unit test of the table): expiry happens on the next lookup
        first = next(iter(self.kept.values()))
        delay = max(0.0, first.expires_at - self.clock())
        self._timer = loop.call_later(delay + 0.001, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.expire()
        self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def status(self) -> dict[str, Any]:
        """For /status.json: what is held now, and re-sends attached since start."""
        self.expire()
        return {
            "running": len(self.running),
            "kept": len(self.kept),
            "keptBytes": self.kept_bytes,
            "attached": self.attached,
            "keepSeconds": self.keep_s,
        }


def as_resent(answer: Message, down_id: Any) -> Message:
    """The answer of an earlier identical call, for the re-send `down_id`: its own id, and (a
    result) `_meta[RESEND_KEY]` saying it was delivered to a re-send. An error goes as it came."""
    result = answer.get("result")
    if isinstance(result, dict):
        meta = result.get("_meta")
        marked = {**(meta if isinstance(meta, dict) else {}), RESEND_KEY: {"attached": True}}
        return {"jsonrpc": "2.0", "id": down_id, "result": {**result, "_meta": marked}}
    out: Message = {"jsonrpc": "2.0", "id": down_id}
    if "error" in answer:
        out["error"] = answer["error"]
    else:
        out["result"] = result
    return out
