"""What a relay does with the messages its upstream sends besides the answers to its requests.

Contract (`ServerMessages`, one per `Relay`, sharing the relay's `Delivery`, `ServerRequests`,
catalogs and background tasks):
- `related`: a message that came with one of the relay's requests (the link tied it to the
  attempt) goes to that request's stream: progress under the caller's own token (none when the
  caller sent none), a server-to-client request under an id of the proxy's own (on the shared link
  its stream is remembered, so the server's cancellation of it goes there alone).
- `unsolicited` (the link's unsolicited handler): a message tied to no request. A response nobody
  waits for is dropped; a server request is given an id of the proxy's own and delivered, except
  on the shared link, where it reaches no caller and the server is answered at once with an error
  (at most `REFUSALS_IN_FLIGHT` such answers being written; past that, none) rather than left
  waiting; the server's cancellation of one of its requests is delivered under the id the client
  knows (on the shared link, to the request stream that request went out on, when still open);
  progress for no request of the relay's is dropped; `notifications/tools/list_changed` has the
  catalogs listed again. Everything else is placed by `Delivery` (proxy/core/routing.py).
Nothing here blocks: delivery only enqueues, and the refusals are written by background tasks
the relay waits for (bounded) before its link closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from proxy.core.catalog import Catalogs
from proxy.core.outbox import Outbox, ProgressRelay
from proxy.core.routing import Delivery, ServerRequests
from proxy.jsonrpc import INTERNAL_ERROR, Message, error, valid_id
from proxy.telemetry.shed import SHED
from proxy.upstream.base import UpstreamLink

# Refusals of untied server requests (the shared link) being written upstream at once; past it, none.
REFUSALS_IN_FLIGHT = 64


class ServerMessages:
    """One relay's handling of the server messages that are not answers."""

    def __init__(
        self,
        link: UpstreamLink,
        shared: bool,
        delivery: Delivery,
        server_requests: ServerRequests,
        catalogs: Catalogs,
        list_tools_soon: Callable[[], None],
        background: set[asyncio.Task[Any]],
    ) -> None:
        self.link = link
        self.shared = shared
        self.delivery = delivery
        self.server_requests = server_requests
        self.catalogs = catalogs
        self.list_tools_soon = list_tools_soon  # the upstream's own catalog, listed again
        self._background = background  # the relay's: it waits for these before its link closes
        self._refusing = 0  # refusals of untied server requests being written upstream

    def related(self, message: Message, outbox: Outbox, progress: ProgressRelay | None) -> None:
        method = message.get("method")
        if method == "notifications/progress":
            if progress is not None:
                rewritten = progress.rewrite(message)
                if rewritten is not None:
                    outbox.send(rewritten)
            return
        if "id" in message and method is not None:
            mapped = self.server_requests.map(message)
            if mapped is None:
                return
            message = mapped
            if self.shared:
                self.server_requests.streams[mapped["id"]] = outbox
        outbox.send(message)

    def unsolicited(self, message: Message) -> None:
        method = message.get("method")
        if method is None:
            return  # a response nobody waits for (late, or for a cancelled attempt): dropped
        if "id" in message:
            if self.shared:
                self._refuse_untied_request(message)
                return
            mapped = self.server_requests.map(message)
            if mapped is None:
                return
            message = mapped
        elif method == "notifications/cancelled":
            params = message.get("params")
            ours = self.server_requests.cancelled(params.get("requestId")) if isinstance(params, dict) else None
            if ours is not None:
                down, stream = ours
                message = {**message, "params": {**params, "requestId": down}}  # type: ignore[dict-item]
                if self.shared and stream is not None and not stream.closed:
                    stream.send(message)
                    return
        elif method == "notifications/progress":
            return  # progress for no request of ours
        elif method == "notifications/tools/list_changed":
            self.catalogs.changed()
            self.list_tools_soon()  # the upstream's own catalog, listed again now
        self.deliver(message)

    def _refuse_untied_request(self, message: Message) -> None:
        """A server request on the shared link that came with no request of a caller: nobody may
        be asked it, and the server is told so rather than left waiting."""
        SHED.count("dropped_messages", "untied")
        if not valid_id(message["id"]) or self._refusing >= REFUSALS_IN_FLIGHT:
            # Past the bound the server gets no answer: one that floods the link with requests
            # while not reading its own input made a task per refusal, each waiting on the full
            # pipe, without limit.
            return
        answer = error(message["id"], INTERNAL_ERROR, "the proxy cannot tie this request to one client")
        task = asyncio.create_task(self.link.send_response(answer))
        self._refusing += 1
        self._background.add(task)
        task.add_done_callback(self._refused)

    def _refused(self, task: asyncio.Task[Any]) -> None:
        self._refusing -= 1
        self._background.discard(task)

    def deliver(self, message: Message) -> None:
        """A message tied to no request (proxy/core/routing.py)."""
        self.delivery.deliver(message)
