"""The drivers against a real HTTP upstream on 127.0.0.1: backpressure, disconnect, faults."""

from __future__ import annotations

import asyncio
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import pytest

from respflow.flows import CorePool, collect, live
from respflow.flows._transport import body_bytes, default_client, open_stream
from respflow.operators import Limits, ProtocolError, UpstreamError
from respflow.sinks import CollectSink
from tests._support import fixture_bytes
from tests.integration.servers import UpstreamScript, serve, upstream_app, wait_for

pytestmark = pytest.mark.timeout(60)

SOCKET_BUF = 64 * 1024
BACKPRESSURE_BOUND = 4 * 1024 * 1024
"""Bytes the upstream may get ahead of the consumer: our queue (1 MiB) + two reads in the core
+ the HTTP client's buffers + the kernel socket buffers of both ends (set to 64 KiB here)."""


@pytest.fixture
def upstream() -> Iterator[tuple[UpstreamScript, str]]:
    script = UpstreamScript()
    with serve(upstream_app(script), sndbuf=SOCKET_BUF) as url:
        yield script, url


async def source(url: str, **body: object) -> AsyncIterator[bytes]:
    client = default_client(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUF)])
    try:
        response = await open_stream(client, url, {"model": "m", "input": "hi", "stream": True, **body})
        async for chunk in body_bytes(response):
            yield chunk
    finally:
        await client.aclose()


class GatedSink(CollectSink):
    """Takes ``allow`` bytes, then blocks until the gate opens: a consumer that stopped reading."""

    def __init__(self, allow: int) -> None:
        super().__init__()
        self.allow = allow
        self.taken = 0
        self.gate = asyncio.Event()
        self.blocked = asyncio.Event()

    async def send(self, data: bytes) -> None:
        if self.taken >= self.allow:
            self.blocked.set()
            await self.gate.wait()
        self.taken += len(data)
        await super().send(data)


def stable(read: object, seconds: float = 0.5, timeout: float = 20) -> int:
    """Wait until the counter ``read()`` has not moved for ``seconds``; return its value."""
    last, since, start = read(), time.monotonic(), time.monotonic()  # type: ignore[operator]
    while time.monotonic() - since < seconds:
        assert time.monotonic() - start < timeout, "the upstream never stopped sending"
        time.sleep(0.02)
        now = read()  # type: ignore[operator]
        if now != last:
            last, since = now, time.monotonic()
    return int(last)


@pytest.mark.parametrize("placement", ["worker", "inline"])
def test_a_slow_consumer_stops_the_upstream_within_a_bound(upstream: tuple[UpstreamScript, str], placement: str) -> None:
    script, url = upstream
    script.mode = "flood"  # 100 MB, as fast as the connection takes it

    async def scenario() -> tuple[int, int, int]:
        sink = GatedSink(allow=256 * 1024)
        tracemalloc.start()
        task = asyncio.create_task(live(source(url), sink, placement=placement, client_stall_timeout=0))  # type: ignore[arg-type]
        await sink.blocked.wait()
        sent = await asyncio.to_thread(stable, lambda: script.sent_bytes)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sent, sink.taken, peak

    sent, taken, peak = asyncio.run(scenario())
    print(f"\nbackpressure[{placement}]: upstream sent {sent} B, consumer took {taken} B, ahead {sent - taken} B, peak traced {peak} B")
    assert taken < sent < script.flood_bytes
    assert sent - taken < BACKPRESSURE_BOUND, f"upstream got {sent - taken} bytes ahead"
    assert peak < 16 * 1024 * 1024, f"peak traced memory {peak}"


def test_a_consumer_that_stops_closes_the_upstream_and_frees_the_core(upstream: tuple[UpstreamScript, str]) -> None:
    script, url = upstream
    script.mode = "flood"

    async def scenario() -> None:
        sink = GatedSink(allow=64 * 1024)
        task = asyncio.create_task(live(source(url), sink, placement="worker", inline_max_bytes=0, client_stall_timeout=0))
        await sink.blocked.wait()
        assert CorePool.threads(), "the core ran on the pool"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    # the behaviour, not a time: the upstream saw the connection closed (a generous bound on a
    # loaded machine), and no core thread is left
    wait_for(lambda: script.closed_at is not None, 30, "the upstream to see the connection closed")
    wait_for(lambda: not CorePool.threads(), 30, "the core threads to exit")


def test_a_stalled_client_aborts_the_stream(upstream: tuple[UpstreamScript, str]) -> None:
    from respflow.operators import RelayError

    script, url = upstream
    script.mode = "flood"
    sink = GatedSink(allow=64 * 1024)
    with pytest.raises(RelayError) as info:
        asyncio.run(live(source(url), sink, client_stall_timeout=0.3))
    assert info.value.code == "client_stalled"
    wait_for(lambda: script.closed_at is not None, 5, "the upstream to be closed")


@pytest.mark.parametrize("placement", ["worker", "inline"])
def test_upstream_cut_mid_item_gives_an_error_event(upstream: tuple[UpstreamScript, str], placement: str) -> None:
    script, url = upstream
    script.mode, script.body, script.chunk = "cut", fixture_bytes("reasoning-vllm-qwen3-30b.sse"), 2048
    sink = CollectSink()
    with pytest.raises(UpstreamError) as info:
        asyncio.run(live(source(url), sink, placement=placement, inline_max_bytes=0))  # type: ignore[arg-type]
    assert info.value.code == "upstream_disconnected"
    out = sink.getvalue()
    assert out.count(b"event: error\n") == 1 and out.rstrip().endswith(b"}")
    assert out.index(b"response.reasoning_text.delta") < out.index(b"event: error")
    with pytest.raises(UpstreamError) as info2:
        asyncio.run(collect(source(url), placement=placement))  # type: ignore[arg-type]
    assert info2.value.code == "upstream_disconnected"


def test_upstream_500_is_a_typed_error_with_a_bounded_excerpt(upstream: tuple[UpstreamScript, str]) -> None:
    script, url = upstream
    script.mode = "status500"
    sink = CollectSink()
    with pytest.raises(UpstreamError) as info:
        asyncio.run(live(source(url), sink))
    assert (info.value.code, info.value.status) == ("upstream_status", 500)
    assert info.value.body_excerpt is not None and "model exploded" in info.value.body_excerpt
    assert b'"code":"upstream_status"' in sink.getvalue()


def test_an_idle_upstream_times_out_but_backpressure_does_not(upstream: tuple[UpstreamScript, str]) -> None:
    script, url = upstream
    script.mode, script.body = "stall", fixture_bytes("text-openai-gpt-4o.sse")[:1500]
    sink = CollectSink()
    with pytest.raises(UpstreamError) as info:  # the upstream stalls for an hour: only the timeout ends this
        asyncio.run(live(source(url), sink, limits=Limits(read_timeout=0.5)))
    assert info.value.code == "upstream_timeout"
    assert b"event: error" in sink.getvalue()

    # a client that pauses longer than the read timeout is not an idle upstream
    script.mode, script.body, script.finished = "replay", fixture_bytes("reasoning-vllm-qwen3-30b.sse"), False

    class PausingSink(CollectSink):
        async def send(self, data: bytes) -> None:
            if len(self.chunks) == 3:
                await asyncio.sleep(1.0)  # the consumer is busy; upstream reads are parked
            await super().send(data)

    slow = PausingSink()
    response = asyncio.run(live(source(url), slow, limits=Limits(read_timeout=0.5), out_max=1))
    assert response.status == "completed"


def test_malformed_bytes_give_the_typed_error_and_an_error_event(upstream: tuple[UpstreamScript, str]) -> None:
    script, url = upstream
    script.body = fixture_bytes("text-openai-gpt-4o.sse").replace(b'"output_index":0', b'"output_index":-1', 1)
    sink = CollectSink()
    with pytest.raises(ProtocolError) as info:
        asyncio.run(live(source(url), sink))
    assert info.value.code == "invalid_output_index"
    assert b'"code":"invalid_output_index"' in sink.getvalue()


def test_unreachable_upstream_is_a_502_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UpstreamError) as info:
        asyncio.run(collect(source(f"http://127.0.0.1:{port}/v1")))
    assert (info.value.code, info.value.status) == ("upstream_unreachable", 502)


def test_an_upstream_that_ignores_stream_and_sends_json_is_not_lost() -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from respflow.flows import decode
    from respflow.operators import Validation
    from tests._support import fixture_bytes

    final = decode(fixture_bytes("function-call-vllm-gemma4.sse"), validation=Validation.LENIENT).to_dict()

    async def responses(request: object) -> JSONResponse:
        return JSONResponse(final)

    app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])
    with serve(app) as url:
        sink = CollectSink()
        response = asyncio.run(live(source(url), sink, response_id="resp_gw"))
    assert response.to_dict()["output"] == final["output"]
    assert b"response.output_item.done" in sink.getvalue()
