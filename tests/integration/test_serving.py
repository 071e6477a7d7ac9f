"""The gateway as a service, with real parts (a scripted upstream and the gateway under uvicorn on
127.0.0.1): admission control, the upstream pool bound, stale kept-alive connections, and
honest endings for upstreams that end without a terminal event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from respflow.flows import Gateway, Upstream, gateway_app
from respflow.operators import UpstreamError
from tests.integration.servers import UpstreamScript, serve, upstream_app, wait_for

pytestmark = pytest.mark.timeout(60)


def ev(data: dict[str, Any]) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


RESP = {"id": "resp_up", "object": "response", "created_at": 1, "status": "in_progress", "model": "m", "output": []}
HEAD = (
    ev({"type": "response.created", "response": RESP})
    + ev({"type": "response.in_progress", "response": RESP})
    + ev({"type": "response.output_item.added", "output_index": 0, "item": {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}})
    + ev({"type": "response.content_part.added", "output_index": 0, "item_id": "msg_1", "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
    + ev({"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "content_index": 0, "delta": "Hel", "logprobs": []})
    + ev({"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "content_index": 0, "delta": "lo", "logprobs": []})
)
COMPLETED = ev({"type": "response.completed", "response": dict(RESP, status="completed")})
NO_TERMINAL = {"code": "server_error", "message": "the upstream ended the stream without a terminal event"}

ENDINGS: dict[str, tuple[bytes, dict[str, str]]] = {
    # the body ends cleanly, mid-item, with no terminal event
    "cut": (HEAD, NO_TERMINAL),
    # bytes that are no SSE event, then the end
    "garbage": (HEAD + b"data: {not json at all\n\n\x00\xff\xfe garbage\n\n", NO_TERMINAL),
    # [DONE] before the terminal: what follows it is never read
    "early_done": (HEAD + b"data: [DONE]\n\n" + COMPLETED, NO_TERMINAL),
    # the upstream says what went wrong, then ends
    "error_then_eof": (
        HEAD + ev({"type": "error", "code": "context_length_exceeded", "message": "the prompt is too long", "param": None}),
        # a code clients do not know as a Response error code: server_error, the code kept in type
        {"code": "server_error", "message": "the prompt is too long", "type": "context_length_exceeded"},
    ),
}


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]


@contextlib.contextmanager
def gateway_on(script: UpstreamScript, **kw: Any) -> Iterator[str]:
    with serve(upstream_app(script)) as up, serve(gateway_app(Gateway(up, **kw))) as gw:
        yield gw


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_an_upstream_that_ends_without_a_terminal_is_reported_failed(ending: str, caplog: pytest.LogCaptureFixture) -> None:
    body, error = ENDINGS[ending]
    script = UpstreamScript()
    script.body = body
    script.chunk = 97  # the events arrive in many reads, cut anywhere
    caplog.set_level(logging.INFO, logger="respflow")
    with gateway_on(script) as gw:
        with httpx.stream("POST", gw + "/responses", json={"model": "m", "input": "hi", "stream": True}, timeout=30) as r:
            assert r.status_code == 200
            raw = b"".join(r.iter_bytes())
        whole = httpx.post(gw + "/responses", json={"model": "m", "input": "hi"}, timeout=30)
    events = sse_events(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.failed"
    assert "response.completed" not in kinds
    terminal = events[-1]["response"]
    assert terminal["status"] == "failed"
    assert terminal["error"] == error
    # what arrived is kept, and the item that never got its done says so
    assert terminal["output"][0]["content"][0]["text"] == "Hello"
    assert terminal["output"][0]["status"] == "incomplete"
    assert isinstance(terminal["created_at"], int)
    if ending == "error_then_eof":
        assert kinds[-2] == "error"  # the upstream's error event is relayed, then the terminal
    # the non-streamed answer carries the same Response
    assert whole.status_code == 200
    body_json = whole.json()
    assert (body_json["status"], body_json["error"]) == ("failed", error)
    assert body_json["output"] == terminal["output"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("POST /v1/responses")]
    assert len(lines) == 2 and all("outcome=failed" in line for line in lines), lines


def test_requests_over_max_streams_get_an_immediate_503_with_retry_after(caplog: pytest.LogCaptureFixture) -> None:
    script = UpstreamScript()
    script.body = HEAD + COMPLETED
    script.chunk = 40
    script.pace = 0.05  # each stream stays open for a while
    caplog.set_level(logging.INFO, logger="respflow")
    with gateway_on(script, max_streams=2) as gw:
        opened: list[Iterator[bytes]] = []
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(httpx.Client(timeout=30))
            for _ in range(2):
                r = stack.enter_context(client.stream("POST", gw + "/responses", json={"model": "m", "input": "hi", "stream": True}))
                assert r.status_code == 200
                chunks = r.iter_bytes()
                next(chunks)  # admitted and streaming
                opened.append(chunks)
            for stream in (True, False):
                refused = httpx.post(gw + "/responses", json={"model": "m", "input": "hi", "stream": stream}, timeout=5)
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["code"] == "too_many_streams"
                assert refused.json()["error"]["type"] == "server_error"
            health = httpx.get(gw.removesuffix("/v1") + "/health").json()
            assert (health["streams"], health["max_streams"]) == (2, 2)
            for chunks in opened:
                assert b"response.completed" in b"".join(chunks)
        # the slots are free again
        again = httpx.post(gw + "/responses", json={"model": "m", "input": "hi"}, timeout=30)
        assert again.status_code == 200 and again.json()["status"] == "completed"
    rejected = [r.getMessage() for r in caplog.records if "outcome=rejected: too_many_streams" in r.getMessage()]
    assert len(rejected) == 2


def test_a_pool_that_stays_busy_is_a_typed_503_not_a_library_timeout() -> None:
    script = UpstreamScript()
    script.body = HEAD + COMPLETED
    script.chunk = 40
    script.pace = 0.05

    async def main(up: str) -> None:
        client = Upstream(max_connections=1, pool_timeout=0.3)
        try:
            first = await client.open(up, {"model": "m", "input": "x", "stream": True})
            with pytest.raises(UpstreamError) as info:
                await client.open(up, {"model": "m", "input": "x", "stream": True})
            assert (info.value.code, info.value.status) == ("upstream_pool_exhausted", 503)
            await first.aclose()  # frees the slot
            second = await client.open(up, {"model": "m", "input": "x", "stream": True})
            while await second.read():
                pass
            await second.aclose()
        finally:
            await client.aclose()

    with serve(upstream_app(script)) as up:
        asyncio.run(main(up))


def test_a_gateway_client_whose_pool_is_below_max_streams_is_refused() -> None:
    with pytest.raises(ValueError, match="below max_streams"):
        Gateway("http://127.0.0.1:9/v1", client=Upstream(max_connections=10), max_streams=100)


def test_two_gateways_sharing_a_busy_pool_answer_503_with_the_pool_code() -> None:
    script = UpstreamScript()
    script.body = HEAD + COMPLETED
    script.chunk = 40
    script.pace = 0.05
    shared = Upstream(max_connections=1, pool_timeout=0.3)
    with serve(upstream_app(script)) as up:
        a, b = Gateway(up, client=shared, max_streams=1), Gateway(up, client=shared, max_streams=1)
        with serve(gateway_app(a)) as gw_a, serve(gateway_app(b)) as gw_b, httpx.stream(
            "POST", gw_a + "/responses", json={"model": "m", "input": "hi", "stream": True}, timeout=30
        ) as held:
            chunks = held.iter_bytes()
            next(chunks)
            refused = httpx.post(gw_b + "/responses", json={"model": "m", "input": "hi"}, timeout=10)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "upstream_pool_exhausted"
            assert b"response.completed" in b"".join(chunks)


class _OneShotServer:
    """An upstream that answers the first request on a connection and closes the connection
    when a second one arrives on it, unanswered — as a server whose idle timeout fires just as
    the client reuses the kept-alive connection."""

    def __init__(self) -> None:
        self.requests = 0
        self.dropped = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        self.requests += 1
        body = HEAD + COMPLETED
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        try:
            await reader.readuntil(b"\r\n\r\n")  # a second request on this connection …
            self.dropped += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()  # … is dropped unanswered

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    def __enter__(self) -> _OneShotServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __str__(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def test_a_stale_kept_alive_upstream_connection_is_retried_once_on_a_new_one() -> None:
    async def main(server: _OneShotServer) -> list[bytes]:
        up = str(server)
        client = Upstream()
        bodies = []
        try:
            for _ in range(3):
                body = await client.open(up, {"model": "m", "input": "x", "stream": True})
                data = b""
                while chunk := await body.read():
                    data += chunk
                await body.aclose()
                bodies.append(data)
        finally:
            await client.aclose()
        return bodies

    with _OneShotServer() as server:
        bodies = asyncio.run(main(server))
        stats = (server.requests, server.dropped)
    assert bodies == [HEAD + COMPLETED] * 3
    # request 2 first went to request 1's stale connection and was retried on a fresh one
    # (which is not kept); request 3 found the pool empty and opened a new connection
    assert stats == (3, 1)


def test_an_unreachable_upstream_is_typed_and_logged_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="respflow")
    with serve(gateway_app(Gateway("http://127.0.0.1:9/v1"))) as gw:
        for stream in (True, False):
            r = httpx.post(gw + "/responses", json={"model": "m", "input": "hi", "stream": stream}, timeout=30)
            assert r.status_code == 502
            assert r.json()["error"]["code"] == "upstream_unreachable"
    wait_for(lambda: sum("outcome=error: upstream_unreachable" in r.getMessage() for r in caplog.records) == 2, 5, "two log lines")
    assert not any(r.exc_info for r in caplog.records)
