"""The fleet's retry budget, exchanged through the shared store (docs/state.md).

Keys (`P` is `--state-prefix`; the `{…}` part is a Redis Cluster hash tag, so one tool's buckets
stay on one shard):
- `P budget:{<sha256(upstream, tool)[:16]>}:<epoch second>`: a hash (`c` calls, `r` retries)
  that expires after two windows;
- `P budget-tools:{<sha256(upstream)[:16]>}`: the tools any replica counted lately, each with the
  epoch second it was last counted.

Contract (`BudgetSync.sync`, run by the store's sync task every interval, one at a time): one
pipelined round trip adds this replica's new counts (per tool and second of the anti-storm window,
at most `MAX_BUDGET_TOOLS` tools, the busiest first) to the store's buckets with the budget script,
and reads the fleet's totals over the window for every tool any replica counted lately, handing
the other replicas' share to the anti-storm (`AntiStorm.set_others`). A count is sent once: it is
marked sent only when the store has it, so counts made while the store was down go when it
returns. A store that lacks the script (new or restarted) gets it loaded and the exchange is made
again, once. Without an anti-storm attached, a PING keeps the store's `up` current. Every store
operation goes through the state's bound (`call`); a reply that is an error marks the store down
(`failed`) and raises `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from proxy.recovery.antistorm import WINDOW_S, AntiStorm
from proxy.state import scripts
from proxy.state.connect import StoreUnavailable

MAX_BUDGET_TOOLS = 128  # tools whose counts one sync exchanges (the busiest are first in the table)


class BudgetSync:
    """The retry budget's exchange with the store, for one `RedisState`."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        call: Callable[[str, Awaitable[Any]], Awaitable[Any]],
        failed: Callable[[str, BaseException], None],
        *,
        prefix: str,
        upstream_name: str,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.client = client
        self._call = call  # the state's bound on every store operation (a failure marks it down)
        self._failed = failed  # marks the store down
        self.prefix = prefix
        self._upstream_tag = upstream_name
        self.clock = clock
        self.wall = wall
        self._budget_sha = hashlib.sha1(scripts.BUDGET.encode()).hexdigest()  # the name Redis gives the script
        self.budget_syncs = 0  # completed exchanges of the retry budget's counts
        self._flushed: dict[tuple[str, int], tuple[int, int]] = {}
        self.antistorm: AntiStorm | None = None  # attached by the state (`RedisState.attach`)
        self._sync_lock = asyncio.Lock()
        self._budget_keys: dict[str, str] = {}
        self._fleet_tools: list[str] = []  # tools any replica counted within the window (from the store)

    def _budget_key(self, tool: str) -> str:
        tag = self._budget_keys.get(tool)
        if tag is None:
            if len(self._budget_keys) > 4 * MAX_BUDGET_TOOLS:
                self._budget_keys.clear()
            digest = hashlib.sha256(f"{self._upstream_tag}\0{tool}".encode()).hexdigest()[:16]
            tag = self._budget_keys[tool] = f"{self.prefix}budget:{{{digest}}}:"
        return tag

    async def sync(self) -> None:
        """One pipelined round trip: add this replica's new counts to the store's buckets, and read
        the fleet's totals over the window for every tool any replica counted lately (the tools
        are listed in the store, so a replica learns the fleet's count of a tool before its own
        first retry of it). With nothing counted anywhere, a PING keeps `up` current. One at a
        time: two at once would send the same new counts twice."""
        async with self._sync_lock:
            await self._sync_budget()

    async def _sync_budget(self, *, _again: bool = False) -> None:
        antistorm = self.antistorm
        if antistorm is None:
            await self._call("ping", self.client.ping())
            self.budget_syncs += 1
            return
        now = self.clock()
        offset = self.wall() - now  # local (monotonic) seconds to the epoch seconds all replicas share
        now_epoch = math.floor(now + offset)
        oldest = math.floor(now) - WINDOW_S + 1
        counts = dict(antistorm.counts()[:MAX_BUDGET_TOOLS])
        tools = list(counts)
        tools += [t for t in self._fleet_tools if t not in counts][: MAX_BUDGET_TOOLS - len(tools)]
        pipe = self.client.pipeline(transaction=False)
        own: list[tuple[str, int, int]] = []
        updates: dict[tuple[str, int], tuple[int, int]] = {}
        flushed = self._flushed
        for tool in tools:
            deltas: dict[int, tuple[int, int]] = {}
            for second, calls, retries in counts.get(tool, ()):
                if second < oldest:
                    continue
                done = flushed.get((tool, second), (0, 0))
                dc, dr = calls - done[0], retries - done[1]
                if dc > 0 or dr > 0:
                    epoch = math.floor(second + offset)
                    c, r = deltas.get(epoch, (0, 0))
                    deltas[epoch] = (c + dc, r + max(dr, 0))
                    updates[(tool, second)] = (calls, retries)
            base = self._budget_key(tool)
            keys, args = [], []
            for epoch in range(now_epoch - WINDOW_S + 1, now_epoch + 1):
                keys.append(f"{base}{epoch}")
                c, r = deltas.pop(epoch, (0, 0))
                args += [c, r]
            if deltas:  # a count that maps just outside the window (clock rounding): the newest bucket
                args[-2] += sum(c for c, _ in deltas.values())
                args[-1] += sum(r for _, r in deltas.values())
            pipe.execute_command("EVALSHA", self._budget_sha, len(keys), *keys, *args, 2 * WINDOW_S)
            own.append((tool, *antistorm.own_window(tool, now)))
        listed = self.tools_key()
        if counts:
            pipe.hset(listed, mapping=dict.fromkeys(counts, now_epoch))
            pipe.expire(listed, 2 * WINDOW_S)
        pipe.hgetall(listed)
        replies = await self._call("budget", pipe.execute(raise_on_error=False))
        if any(isinstance(reply, NoScriptError) for reply in replies):
            # A store that has not seen the script yet (a new or restarted one: scripts are not
            # persisted): load it and send the same commands again (the increments did not run).
            await self._call("budget", self.client.script_load(scripts.BUDGET))
            if not _again:
                await self._sync_budget(_again=True)  # nothing was counted yet: build it again
            return
        failed = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if failed is not None:
            self._failed("budget", failed)
            raise StoreUnavailable("budget")
        # Counted only once the store has them: counts made while it was down go when it returns.
        flushed.update(updates)
        for key in [k for k in flushed if k[1] < oldest]:
            del flushed[key]
        for (tool, own_calls, own_retries), (calls, retries) in zip(own, replies[: len(own)], strict=True):
            antistorm.set_others(tool, int(calls) - own_calls, int(retries) - own_retries, now)
        seen = replies[-1]
        self._fleet_tools = [
            name.decode(errors="replace") for name, at in seen.items() if int(at) >= now_epoch - WINDOW_S
        ][:MAX_BUDGET_TOOLS]
        self.budget_syncs += 1

    def tools_key(self) -> str:
        digest = hashlib.sha256(self._upstream_tag.encode()).hexdigest()[:16]
        return f"{self.prefix}budget-tools:{{{digest}}}"
