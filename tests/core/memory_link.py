"""An in-memory stand-in for an upstream transport, for tests of the relay's and the engine's own
logic (no sockets, no processes). Subclasses decide how `send_request` answers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from proxy.upstream.base import Era, Exchange, OnMessage, PendingTable


class MemoryLink:
    era = Era.LEGACY

    def __init__(self) -> None:
        self.pending = PendingTable()
        self.sent: list[dict[str, Any]] = []
        self.cancelled: list[Any] = []

    def new_id(self) -> Any:
        return self.pending.new_id()

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        pass

    async def send_request(
        self,
        message: dict[str, Any],
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        self.sent.append(message)
        ex = self.pending.add(message, on_message)
        ex.written = True
        if on_write is not None:
            on_write()
        return ex

    def answer(self, ex: Exchange, result: dict[str, Any]) -> None:
        self.pending.resolve({"jsonrpc": "2.0", "id": ex.upstream_id, "result": result})

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        self.cancelled.append(exchange.upstream_id)

    async def send_notification(self, message: dict[str, Any], *, headers: Any = None) -> None:
        pass

    async def send_response(self, message: dict[str, Any]) -> None:
        pass

    async def aclose(self) -> None:
        pass


class RecordingOutbox:
    def __init__(self) -> None:
        self.closed = False
        self.messages: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
