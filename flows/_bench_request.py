"""``respflow bench --request``: what the gateway itself costs per request and per event.

The gateway's ASGI app (`GatewayApp`, the code ``respflow serve`` runs) serves streamed requests
in process on uvloop (as served), ``concurrency`` at a time, against a canned upstream (`CannedUpstream`: the paced
upstream's stream shape, one event per read, a loop turn between reads) into a send that keeps
nothing: no sockets, no HTTP parsing, no other process. Requests with 1 text delta and with
``1 + events`` deltas give the cost per request (its set-up and its head and tail events) and
the cost per further event (the slope).

Process CPU time is noisy on a shared machine; for exact counts run it under callgrind, once
per size, and take the difference::

    valgrind --tool=callgrind respflow bench --request --sizes 1 --requests 100
    valgrind --tool=callgrind respflow bench --request --sizes 101 --requests 100
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import statistics
import time
from collections.abc import Coroutine, Mapping, MutableMapping, Sequence
from typing import Any, TypeVar

import orjson

from respflow.flows._transport import Upstream, UpstreamBody

T = TypeVar("T")

_ITEM = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}


def _event(seq: int, data: dict[str, Any]) -> bytes:
    data["sequence_number"] = seq
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def canned_reads(deltas: int) -> list[bytes]:
    """The reads of one upstream answer: the head in one read, one read per text delta, the
    tail in one read (as `respflow.flows._loadgen`'s paced upstream writes them)."""
    response = {"id": "resp_up", "object": "response", "created_at": 1, "status": "in_progress", "model": "m", "output": []}
    head = (
        _event(0, {"type": "response.created", "response": response})
        + _event(1, {"type": "response.in_progress", "response": response})
        + _event(2, {"type": "response.output_item.added", "output_index": 0, "item": _ITEM})
        + _event(3, {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
    )
    texts = [f"<{i:012d}>" for i in range(deltas)]
    reads = [head]
    for i, text in enumerate(texts):
        delta = {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": text, "logprobs": []}
        reads.append(_event(4 + i, delta))
    text = "".join(texts)
    part = {"type": "output_text", "text": text, "annotations": []}
    done = dict(_ITEM, status="completed", content=[part])
    seq = 4 + deltas
    reads.append(
        _event(seq, {"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "text": text, "logprobs": []})
        + _event(seq + 1, {"type": "response.content_part.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": part})
        + _event(seq + 2, {"type": "response.output_item.done", "output_index": 0, "item": done})
        + _event(seq + 3, {"type": "response.completed", "response": dict(response, status="completed", output=[done])})
    )
    return reads


class _CannedBody:
    def __init__(self, reads: list[bytes]) -> None:
        self._reads = iter(reads)
        self.closed = False

    async def read(self) -> bytes:
        await asyncio.sleep(0)  # one loop turn per read, as a socket read would take
        return next(self._reads, b"")

    async def aclose(self) -> None:
        self.closed = True


class CannedUpstream(Upstream):
    """An `Upstream` that answers every request with the same canned stream."""

    def __init__(self, deltas: int) -> None:
        super().__init__()
        self.reads = canned_reads(deltas)

    async def open(self, base_url: str, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None) -> UpstreamBody:
        return _CannedBody(self.reads)  # type: ignore[return-value]  # the same read()/aclose()


async def _requests(deltas: int, requests: int, concurrency: int) -> tuple[float, int]:
    """CPU seconds for ``requests`` streamed requests, and the events each client got."""
    from respflow.flows.gateway import Gateway
    from respflow.flows.gateway._app import gateway_app

    gateway = Gateway("http://canned/v1", client=CannedUpstream(deltas), placement="inline")
    app = gateway_app(gateway)
    payload = orjson.dumps({"model": "m", "input": "hello", "stream": True})
    scope = {"type": "http", "method": "POST", "path": "/v1/responses", "root_path": "", "headers": [(b"content-type", b"application/json")]}
    received: list[int] = []

    async def one() -> None:
        messages = [{"type": "http.request", "body": payload, "more_body": False}]
        events = 0

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # never disconnects
            raise AssertionError

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal events
            events += bytes(message.get("body", b"")).count(b"\ndata: ")

        await app(scope, receive, send)
        received.append(events)

    await asyncio.gather(*(one() for _ in range(min(concurrency, requests))))  # warm-up
    received.clear()
    gc.collect()
    gc.freeze()  # as respflow serve does
    started = time.process_time()
    for first in range(0, requests, concurrency):
        await asyncio.gather(*(one() for _ in range(min(concurrency, requests - first))))
    spent = time.process_time() - started
    gc.unfreeze()
    if len(set(received)) != 1:
        raise RuntimeError(f"requests got different numbers of events: {sorted(set(received))}")
    return spent, received[0]


def _run(main: Coroutine[Any, Any, T]) -> T:
    """``main`` on the loop ``respflow serve`` runs: uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def run_request_bench(
    *, sizes: Sequence[int] = (1, 101), requests: int = 2000, concurrency: int = 100, rounds: int = 3
) -> list[dict[str, Any]]:
    """One row per size (text deltas per request): CPU µs per request (median of rounds) and
    the events a client got; with two sizes or more, the slope per further event."""
    rows: list[dict[str, Any]] = []
    for deltas in sizes:
        spent = []
        events = 0
        for _ in range(rounds):
            seconds, events = _run(_requests(deltas, requests, concurrency))
            spent.append(seconds)
        rows.append({"deltas": deltas, "events": events, "us_per_request": round(1e6 * statistics.median(spent) / requests, 1)})
    for low, high in itertools.pairwise(rows):
        if high["events"] != low["events"]:
            high["us_per_further_event"] = round(
                (high["us_per_request"] - low["us_per_request"]) / (high["events"] - low["events"]), 2
            )
    return rows


def format_request(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'deltas':>7} {'events':>7} {'CPU us/request':>15} {'us per further event':>21}"]
    for row in rows:
        slope = row.get("us_per_further_event")
        lines.append(f"{row['deltas']:>7} {row['events']:>7} {row['us_per_request']:>15.1f} {slope if slope is not None else '-':>21}")
    return "\n".join(lines)
