"""Where a server's messages go when they answer no request of the caller's own: the ids of
server-to-client requests, and the delivery of messages tied to no request.

Contract:
- `ServerRequests` gives each server-to-client request (sampling, elicitation, roots) an id of the
  proxy's own (`proxy-N`), so requests of several upstream links never collide downstream, and maps
  the client's answer, or the server's later `notifications/cancelled`, back. At most `LIMIT`
  unanswered requests are remembered (the oldest forgotten). On the shared 2026 link it also keeps
  the request stream each server request went out on: its cancellation goes there and nowhere else.
- `Delivery` places a message tied to no request. A 2025 session's own link has one client: the
  newest request stream still open, else the listen stream, else a backlog bounded in count and
  bytes (`BACKLOG_LIMIT`, `BACKLOG_BYTES`; overflow counted as `backlog_full`), flushed when a
  listen stream opens. The shared 2026 link has many callers: such a message reaches none (counted
  as `untied`). A stdio server's log line that names no request reaches a request before it gets
  here when that request is the only one in flight on the link and asked for log messages
  (`PendingTable.route_related`, which sees every request on the link, bridged 2025 ones too).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque

from proxy.core.outbox import Outbox
from proxy.jsonrpc import Message, RequestId, dumps, valid_id
from proxy.telemetry.shed import SHED
from proxy.upstream.base import UPSTREAM_NOTICES

log = logging.getLogger("proxy.relay")

BACKLOG_LIMIT = 256
BACKLOG_BYTES = 4 * 1024 * 1024


class ServerRequests:
    """Downstream ids of one relay's server-to-client requests."""

    LIMIT = 1024

    __slots__ = ("_ids", "down_to_up", "streams", "up_to_down")

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.down_to_up: dict[str, RequestId] = {}  # our downstream id -> the upstream's id
        self.up_to_down: dict[RequestId, str] = {}
        # Shared link: the request stream each server request was delivered on.
        self.streams: dict[str, Outbox] = {}

    def map(self, message: Message) -> Message | None:
        """`message` (a server request) under an id of ours; None when its id is not valid."""
        if not valid_id(message["id"]):
            UPSTREAM_NOTICES.log(log, logging.INFO, "dropped a server request with an invalid id")
            return None
        down = f"proxy-{next(self._ids)}"
        if len(self.down_to_up) >= self.LIMIT:  # unanswered server requests: forget the oldest
            oldest = next(iter(self.down_to_up))
            self.up_to_down.pop(self.down_to_up.pop(oldest), None)
            self.streams.pop(oldest, None)
        self.down_to_up[down] = message["id"]
        self.up_to_down[message["id"]] = down
        return {**message, "id": down}

    def answered(self, down_id: object) -> RequestId | None:
        """The upstream's id of the request the client answered, forgotten; None if unknown."""
        if not isinstance(down_id, str):
            return None
        upstream_id = self.down_to_up.pop(down_id, None)
        if upstream_id is not None:
            self.up_to_down.pop(upstream_id, None)
            self.streams.pop(down_id, None)
        return upstream_id

    def cancelled(self, upstream_id: object) -> tuple[str, Outbox | None] | None:
        """The server cancelled its request `upstream_id`: our id for it and the stream it went out
        on (shared link), forgotten; None if it is not one of ours."""
        if not valid_id(upstream_id) or upstream_id not in self.up_to_down:
            return None
        down = self.up_to_down.pop(upstream_id)
        self.down_to_up.pop(down, None)
        return down, self.streams.pop(down, None)


class Delivery:
    """The open request streams of one relay, its listen stream and its backlog."""

    __slots__ = ("backlog", "backlog_bytes", "listen", "shared", "streams")

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.streams: list[Outbox] = []
        self.listen: Outbox | None = None
        self.backlog: deque[tuple[Message, int]] = deque()
        self.backlog_bytes = 0

    def opened(self, outbox: Outbox) -> None:
        self.streams.append(outbox)

    def closed(self, outbox: Outbox) -> None:
        self.streams.remove(outbox)

    def deliver(self, message: Message) -> None:
        """A message tied to no request (see the module docstring)."""
        if self.shared:
            SHED.count("dropped_messages", "untied")
            return
        for outbox in reversed(self.streams):
            if not outbox.closed:
                outbox.send(message)
                return
        if self.listen is not None and not self.listen.closed:
            self.listen.send(message)
            return
        size = len(dumps(message))
        self.backlog.append((message, size))
        self.backlog_bytes += size
        while len(self.backlog) > BACKLOG_LIMIT or (self.backlog_bytes > BACKLOG_BYTES and len(self.backlog) > 1):
            self.backlog_bytes -= self.backlog.popleft()[1]
            SHED.count("dropped_messages", "backlog_full")

    def attach_listen(self, outbox: Outbox) -> bool:
        """The client's listen stream, given the backlog; False while another one is open."""
        if self.listen is not None and not self.listen.closed:
            return False
        self.listen = outbox
        backlog, self.backlog, self.backlog_bytes = self.backlog, deque(), 0
        for message, _ in backlog:
            outbox.send(message)
        return True

    def detach_listen(self, outbox: Outbox) -> None:
        if self.listen is outbox:
            self.listen = None
