"""The upstream's tool definitions, known before a call's first attempt.

A tool's definition decides how its calls are recovered: its annotations give the side-effect
class (a read-only tool is retried, a state-changing one is not), its output schema decides where
an unresolved report may travel. So the definition must not depend on the call that needs it.

Contract:
- `ToolCatalog` holds the tools one upstream listed, by name (bounded: `LIMIT`). One serves every
  session and caller of an upstream; with `--auth passthrough`, where each caller's credential may
  list other tools, `Catalogs` keeps one per principal (bounded, least recently used forgotten),
  each also feeding the upstream's own (the union, read by labels and the status page).
- A catalog is listed by a task of its own (`refresh`): every page of `tools/list`, bounded by
  `LIST_TIMEOUT_S`, single flight. The proxy starts it as soon as the upstream is first reached
  (a 2025 session's `notifications/initialized`, the 2026 link's creation) and again when the
  upstream sends `notifications/tools/list_changed` (`changed`); until then the old tools stay
  known.
- A call whose tool the catalog lacks waits for that listing (`ready`), bounded by its own wait,
  which never cuts the listing short: the listing goes on for the calls after it, whatever the
  deadline of the one that started it (else a short caller deadline would skip the listing, and a
  read-only tool would be treated as state-changing).
- A client's own complete listing (`observe`) counts as one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from proxy.core.outbox import NullOutbox, Outbox
from proxy.jsonrpc import Message
from proxy.upstream.base import discover_request

log = logging.getLogger("proxy.catalog")

LIST_TIMEOUT_S = 10.0  # one listing of every page, at most (it serves every call after it)
Lister = Callable[[], Awaitable[None]]  # lists every page through a relay, observing each into the catalog


class ToolCatalog:
    """The tools the upstream listed, by name. Bounded."""

    LIMIT = 2000

    def __init__(self, parent: ToolCatalog | None = None) -> None:
        self.tools: dict[str, dict[str, Any]] = {}
        self.listed = asyncio.Event()  # a complete listing arrived (and no list_changed since)
        self._param_headers: dict[str, bool] = {}
        self._parent = parent
        self._task: asyncio.Task[None] | None = None
        self._changed = False  # a list_changed arrived while a listing ran: it lists again

    def observe(self, result: Any, *, complete: bool | None = None) -> None:
        """One page of a `tools/list` result. `complete`: whether the listing is whole with this
        page (None: when the page names no next cursor)."""
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return
        self._param_headers.clear()
        for tool in result["tools"]:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                if tool["name"] in self.tools or len(self.tools) < self.LIMIT:
                    self.tools[tool["name"]] = tool
        if self._parent is not None:
            self._parent.observe(result, complete=False)
        if complete if complete is not None else not isinstance(result.get("nextCursor"), str):
            self.listed.set()

    def changed(self) -> None:
        """The upstream said its tools changed: the next `ready` (or `refresh`) lists again."""
        self.listed.clear()
        self._param_headers.clear()
        self._changed = True

    def refresh(self, lister: Lister) -> asyncio.Task[None]:
        """The listing in flight, or a new one made with `lister` (never cancelled by a waiter)."""
        task = self._task
        if task is None or task.done():
            task = self._task = asyncio.get_running_loop().create_task(self._list(lister))
        return task

    async def _list(self, lister: Lister) -> None:
        try:
            async with asyncio.timeout(LIST_TIMEOUT_S):
                for _ in range(3):  # a change announced during a listing may not be in it
                    self._changed = False
                    await lister()
                    if not self._changed:
                        break
                    self.listed.clear()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an upstream failure or timeout: the next call lists again
            log.info("listing the upstream's tools failed: %s", str(exc)[:200] or type(exc).__name__)

    async def ready(self, lister: Lister, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for a complete listing, starting one with `lister` when none
        is in flight. A listing that another relay started and that failed (its session ended) is
        followed by one of this caller's own."""
        if self.listed.is_set() or timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        for _ in range(2):
            own = self._task is None or self._task.done()
            task = self.refresh(lister)
            try:
                await asyncio.wait_for(asyncio.shield(task), max(0.0, end - loop.time()))
            except TimeoutError:
                return
            if self.listed.is_set() or own:
                return

    def declares_param_headers(self, name: str) -> bool:
        """Whether the tool's input schema marks any argument `x-mcp-header` (cached per listing)."""
        known = self._param_headers.get(name)
        if known is None:
            from proxy.sdk import inbound

            tool = self.tools.get(name)
            known = bool(tool and inbound.x_mcp_header_map(tool.get("inputSchema")))
            self._param_headers[name] = known
        return known

    def annotations(self, name: str) -> dict[str, Any] | None:
        tool = self.tools.get(name)
        ann = tool.get("annotations") if tool else None
        return ann if isinstance(ann, dict) else None


class Catalogs:
    """The catalogs of one upstream: its own, and with `per_principal` (`--auth passthrough`) one
    per principal, since the upstream may list other tools to another credential. Bounded."""

    LIMIT = 256

    def __init__(self, per_principal: bool = False) -> None:
        self.upstream = ToolCatalog()
        self.per_principal = per_principal
        self._of: OrderedDict[str, ToolCatalog] = OrderedDict()

    def of(self, principal_id: str | None) -> ToolCatalog:
        if not self.per_principal or principal_id is None:
            return self.upstream
        catalog = self._of.get(principal_id)
        if catalog is None:
            catalog = self._of[principal_id] = ToolCatalog(parent=self.upstream)
            if len(self._of) > self.LIMIT:
                self._of.popitem(last=False)
        else:
            self._of.move_to_end(principal_id)
        return catalog

    def changed(self) -> None:
        self.upstream.changed()
        for catalog in self._of.values():
            catalog.changed()


# How a listing reaches the upstream: a relay's `forward` (request, outbox, headers) -> response.
Forward = Callable[[Message, Outbox, Mapping[str, str] | None], Awaitable[Message]]
MAX_PAGES = 20  # pages of tools/list read per listing, at most


def tool_lister(
    forward: Forward,
    catalog: ToolCatalog,
    request: Message | None,
    headers: Mapping[str, str] | None,
    *,
    modern: bool,
) -> Callable[[], Awaitable[None]]:
    """A listing of every page of the upstream's tools into `catalog`, sent with `forward`. The
    envelope of `request` (a 2026 call's `_meta`) is reused so the listing is a valid request of the
    same revision; with `headers`, only its `Authorization` goes along (passthrough)."""
    if request is not None:
        params = request.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        envelope = {k: v for k, v in (meta or {}).items() if k.startswith("io.modelcontextprotocol/")}
    else:
        envelope = {}
    if not envelope and modern:
        envelope = discover_request(0)["params"]["_meta"]
    credential = headers.get("authorization") if headers is not None else None
    credentials = {"authorization": credential} if credential is not None else None

    async def list_all() -> None:
        cursor: Any = None
        sink = NullOutbox()
        for _ in range(MAX_PAGES):
            list_params: dict[str, Any] = {"_meta": envelope} if envelope else {}
            if cursor is not None:
                list_params["cursor"] = cursor
            listing = {"jsonrpc": "2.0", "id": 0, "method": "tools/list", "params": list_params}
            response = await forward(listing, sink, credentials)
            result = response.get("result")
            cursor = result.get("nextCursor") if isinstance(result, dict) else None
            last = not isinstance(cursor, str)
            catalog.observe(result, complete=last)
            if last:
                return
        catalog.observe({"tools": []}, complete=True)  # MAX_PAGES pages: as much as the proxy reads

    return list_all
