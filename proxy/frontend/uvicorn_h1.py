"""uvicorn's httptools protocol, writing a response's head and body in one system call.

uvicorn writes the status line and headers when the app sends `http.response.start`, and the body
with `http.response.body`: two `send()` calls per answer, and on loopback each one runs the
receiver's half of TCP in the sender's system call too. In the proxy's relay benchmark these
writes were the largest single share of the frontend's CPU. This protocol gives uvicorn a
transport that holds a response head until the next write (the body, in the same event-loop step
for every JSON answer) and writes both at once. A head with a `content-length` waits for its body
(a client cannot use one without the other); any other head (a stream that starts before its
first event) goes out at the loop's next iteration at the latest. A close flushes what is held;
everything else passes straight through.

Depends on uvicorn's `HttpToolsProtocol` keeping the transport it is given in `connection_made`
(true of every uvicorn release with this protocol); `tests/e2e` and the conformance suite run the
proxy with it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeadHolding:
    """A transport wrapper: a write that starts a response is held until the next write, a close,
    or the next loop iteration, whichever comes first."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + bytes(data))
        elif data[:7] == b"HTTP/1." and not self._transport.is_closing():
            self._held = bytes(data)
            # A head with a length waits for its body (the client cannot use one without the
            # other; uvicorn writes header names in lower case); a streamed one goes out at the
            # next loop step at the latest.
            if b"\r\ncontent-length: " not in data:
                self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    # What uvicorn calls on its transport, passed on directly (a `__getattr__` fallback would raise
    # and catch an AttributeError on every call first).
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def __getattr__(self, name: str) -> Any:  # anything else: the real transport's
        return getattr(self._transport, name)


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` on a `_HeadHolding` transport (see the module docstring)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HeadHolding(transport, self.loop))  # type: ignore[arg-type]
