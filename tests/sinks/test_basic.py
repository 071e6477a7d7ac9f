"""The simple sinks behave as their names say, with the live driver."""

from __future__ import annotations

import asyncio
import io

from respflow.flows import live, sse_body
from respflow.sinks import CallbackSink, ChannelSink, CollectSink, NullSink, Sink, StreamSink
from tests._support import fixture_bytes

BODY = fixture_bytes("text-openai-gpt-4o.sse")


def test_every_sink_receives_the_same_bytes() -> None:
    async def go() -> None:
        collected = CollectSink()
        await live([BODY], collected, placement="inline", response_id="resp_x")
        reference = collected.getvalue()
        got: list[bytes] = []

        async def callback(data: bytes) -> None:
            got.append(data)

        await live([BODY], CallbackSink(callback), placement="inline", response_id="resp_x")
        buffer = io.BytesIO()
        await live([BODY], StreamSink(buffer), placement="inline", response_id="resp_x")
        response = await live([BODY], NullSink(), placement="inline", response_id="resp_x")

        def same(a: bytes, b: bytes) -> bool:
            drop = lambda x: [line for line in x.split(b"\n") if b"created_at" not in line]  # noqa: E731
            return drop(a) == drop(b)

        assert same(b"".join(got), reference) and same(buffer.getvalue(), reference)
        assert response.status == "completed"

    asyncio.run(go())


def test_sse_body_streams_through_a_bounded_channel_and_cancels_on_exit() -> None:
    async def go() -> None:
        cancelled = asyncio.Event()

        async def run(sink: Sink) -> None:
            try:
                for i in range(1000):
                    await sink.send(f"chunk {i}\n".encode())
            except asyncio.CancelledError:
                cancelled.set()
                raise

        body = sse_body(run)
        first = await anext(body)
        assert first == b"chunk 0\n"
        await body.aclose()
        assert cancelled.is_set()

        chunks = [c async for c in sse_body(lambda sink: live([BODY], sink, placement="inline"))]
        assert b"".join(chunks).count(b"event: response.completed") == 1

        channel = ChannelSink(1)
        await channel.send(b"x")
        blocked = asyncio.ensure_future(channel.send(b"y"))  # the channel holds one chunk
        await asyncio.sleep(0)
        assert not blocked.done()
        reader = aiter(channel)
        assert await anext(reader) == b"x"
        await blocked
        assert await anext(reader) == b"y"

    asyncio.run(go())
