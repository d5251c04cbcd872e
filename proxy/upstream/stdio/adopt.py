"""Adopt the child `early.start` started before the event loop existed, so that it is supervised
exactly as a spawned one.

asyncio cannot wrap a running process in its own subprocess transport, so `adopt` connects the
early child's three pipes through the loop's pipe transports and reads its exit through its pidfd
(reaping it with the `Popen` that started it), then hands a `ChildProtocol` the same calls a
subprocess transport would make. Whatever fails while connecting ends the early child.
"""

from __future__ import annotations

import asyncio
import os

from proxy.upstream.stdio.early import EarlyChild
from proxy.upstream.stdio.process import ChildProtocol


class _AdoptedTransport:
    """What `Child` needs of a `SubprocessTransport`, for the child `early.start` started before the
    event loop existed (asyncio cannot wrap a running process in its own transport): the three pipe
    transports, the pid, and the exit status, read when the process's pidfd becomes readable."""

    def __init__(self, early: EarlyChild) -> None:
        self._early = early
        self.pipes: dict[int, asyncio.BaseTransport] = {}
        self._closed = False

    def get_pid(self) -> int:
        return self._early.popen.pid

    def get_returncode(self) -> int | None:
        return self._early.popen.returncode

    def get_pipe_transport(self, fd: int) -> asyncio.BaseTransport | None:
        return self.pipes.get(fd)

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        for pipe in self.pipes.values():
            pipe.close()


class _PipeProtocol(asyncio.Protocol):
    """One pipe of an adopted child, forwarded to its `ChildProtocol` as a subprocess transport
    would (asyncio's own subprocess pipes do the same)."""

    def __init__(self, child: ChildProtocol, fd: int) -> None:
        self.child = child
        self.fd = fd

    def data_received(self, data: bytes) -> None:
        self.child.pipe_data_received(self.fd, data)

    def eof_received(self) -> None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.child.pipe_connection_lost(self.fd, exc)

    def pause_writing(self) -> None:
        self.child.pause_writing()

    def resume_writing(self) -> None:
        self.child.resume_writing()


async def adopt(early: EarlyChild, protocol: ChildProtocol) -> ChildProtocol:
    """Connect `protocol` to a child `early.start` started: its pipes through the loop's pipe
    transports, its exit through its pidfd (reaped with the `Popen` that started it)."""
    loop = asyncio.get_running_loop()
    transport = _AdoptedTransport(early)
    popen = early.popen
    assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
    pipes = transport.pipes
    try:
        pipes[0], _ = await loop.connect_write_pipe(lambda: _PipeProtocol(protocol, 0), popen.stdin)
        pipes[1], _ = await loop.connect_read_pipe(lambda: _PipeProtocol(protocol, 1), popen.stdout)
        pipes[2], _ = await loop.connect_read_pipe(lambda: _PipeProtocol(protocol, 2), popen.stderr)
    except BaseException:
        transport.close()
        early.kill()
        raise

    def exited() -> None:
        loop.remove_reader(early.pidfd)
        os.close(early.pidfd)
        early.pidfd = -1
        popen.poll()  # readable pidfd: the guard has exited, so this reaps it at once
        protocol.process_exited()

    loop.add_reader(early.pidfd, exited)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol
