"""Simple sinks: collect, callback, null, a binary stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import BinaryIO


class CollectSink:
    """Keeps every chunk it is sent (tests, small tools)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed = False

    async def send(self, data: bytes) -> None:
        self.chunks.append(data)

    async def aclose(self) -> None:
        self.closed = True

    def getvalue(self) -> bytes:
        return b"".join(self.chunks)


class CallbackSink:
    """Hands every chunk to an async callback."""

    def __init__(self, callback: Callable[[bytes], Awaitable[None]]) -> None:
        self._callback = callback

    async def send(self, data: bytes) -> None:
        await self._callback(data)

    async def aclose(self) -> None:
        return None


class NullSink:
    """Drops everything (benchmarks, collect-only drivers)."""

    async def send(self, data: bytes) -> None:
        return None

    async def aclose(self) -> None:
        return None


class StreamSink:
    """Writes to a binary file object and flushes after each write (stdout, a pipe)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    async def send(self, data: bytes) -> None:
        self._stream.write(data)
        self._stream.flush()

    async def aclose(self) -> None:
        self._stream.flush()


class ChannelSink:
    """A bounded channel from a producer task to an async-iterating consumer (an HTTP
    response body). ``send`` waits while ``maxsize`` chunks are unread: the backpressure."""

    def __init__(self, maxsize: int = 1) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize)

    async def send(self, data: bytes) -> None:
        await self._queue.put(data)

    async def aclose(self) -> None:
        await self._queue.put(None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk
