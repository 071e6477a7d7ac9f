"""``respflow bench --placement``: where should the core run, and how big should buffers be?

Every scenario drives the real `live` driver (graph, runner, relay) from in-process sources so
the numbers measure placement, not a network. Each prints: throughput (events/s), added latency
per event (from the read leaving the source to its frames reaching the sink: p50 / p99),
event-loop lag (a 2 ms probe's overshoot: p99 / max), peak traced memory (slow-consumer rows)
and the most threads alive.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import orjson

from respflow.flows._drivers import live
from respflow.flows._runner import Placement


def _event(i: int, item: str) -> bytes:
    data = {
        "type": "response.output_text.delta",
        "sequence_number": i + 4,
        "output_index": 0,
        "item_id": item,
        "content_index": 0,
        "delta": f" token{i}",
        "logprobs": [],
    }
    return b"event: response.output_text.delta\ndata: " + orjson.dumps(data) + b"\n\n"


def _head(item: str) -> bytes:
    events = [
        {"type": "response.created", "response": {"id": "resp_b", "status": "in_progress", "output": [], "model": "bench", "created_at": 1}},
        {"type": "response.in_progress", "response": {"id": "resp_b", "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": item, "role": "assistant", "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", "output_index": 0, "item_id": item, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}},
    ]
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)


def _tail(item: str) -> bytes:
    done = {"type": "response.output_item.done", "output_index": 0, "item": {"type": "message", "id": item, "role": "assistant", "status": "completed", "content": []}}
    end = {"type": "response.completed", "response": {"id": "resp_b", "status": "completed"}}
    return b"data: " + orjson.dumps(done) + b"\n\ndata: " + orjson.dumps(end) + b"\n\n"


class _Timed:
    """A source that stamps each read, and a sink that measures when its frames arrive."""

    def __init__(self, reads: list[bytes], pace: float, consumer_delay: float) -> None:
        self.reads = reads
        self.pace = pace
        self.delay = consumer_delay
        self.stamps: list[float] = []
        self.latencies: list[float] = []
        self.events = 0
        self._sent_events = 0
        self._received = 0

    async def source(self) -> AsyncIterator[bytes]:
        for chunk in self.reads:
            if self.pace:
                await asyncio.sleep(self.pace)
            self.stamps.append(time.perf_counter())
            yield chunk

    async def send(self, data: bytes) -> None:
        now = time.perf_counter()
        n = data.count(b"\ndata: ") + data.startswith(b"data: ")
        self.events += n
        if self.stamps:
            self.latencies.append(now - self.stamps[-1])
        if self.delay:
            await asyncio.sleep(self.delay)

    async def aclose(self) -> None:
        return None


def _stream_reads(events: int, per_read: int, stream_id: int) -> list[bytes]:
    item = f"msg_{stream_id}"
    body = [_head(item)] + [_event(i, item) for i in range(events)] + [_tail(item)]
    reads: list[bytes] = []
    for i in range(0, len(body), per_read):
        reads.append(b"".join(body[i : i + per_read]))
    return reads


async def _probe(lags: list[float], threads: list[int], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t0 = loop.time()
        await asyncio.sleep(0.002)
        lags.append(max(0.0, loop.time() - t0 - 0.002))
        threads.append(threading.active_count())


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _scenario(
    *,
    placement: Placement,
    streams: int,
    events: int,
    per_read: int,
    pace: float,
    consumer_delay: float = 0.0,
    out_max: int = 8,
    memory: bool = False,
) -> dict[str, Any]:
    timed = [_Timed(_stream_reads(events, per_read, s), pace, consumer_delay) for s in range(streams)]
    lags: list[float] = []
    threads: list[int] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(lags, threads, stop))
    if memory:
        tracemalloc.start()
    started = time.perf_counter()
    await asyncio.gather(
        *(
            live(t.source(), t, placement=placement, out_max=out_max, client_stall_timeout=0)
            for t in timed
        )
    )
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if memory else 0
    if memory:
        tracemalloc.stop()
    stop.set()
    await probe
    total = sum(t.events for t in timed)
    latencies = [x for t in timed for x in t.latencies]
    return {
        "events_per_s": round(total / elapsed),
        "latency_p50_ms": round(_pct(latencies, 0.5) * 1000, 3),
        "latency_p99_ms": round(_pct(latencies, 0.99) * 1000, 3),
        "loop_lag_p99_ms": round(_pct(lags, 0.99) * 1000, 2),
        "loop_lag_max_ms": round(max(lags, default=0.0) * 1000, 2),
        "peak_mem_kib": round(peak / 1024) if memory else None,
        "threads_max": max(threads, default=threading.active_count()),
    }


def run_placement_bench(*, quick: bool = False) -> list[dict[str, Any]]:
    """The placement table: every scenario under both placements (medians of repeats)."""
    scale = 0.25 if quick else 1.0
    repeats = 1 if quick else 3
    scenarios: list[tuple[str, dict[str, Any]]] = [
        ("paced 1 stream, 1 event/read every 5 ms", {"streams": 1, "events": int(400 * scale), "per_read": 1, "pace": 0.005}),
        ("paced 16 streams", {"streams": 16, "events": int(400 * scale), "per_read": 1, "pace": 0.005}),
        ("paced 256 streams", {"streams": 256, "events": int(100 * scale), "per_read": 1, "pace": 0.005}),
        ("burst 1 stream, 64 events/read", {"streams": 1, "events": int(40000 * scale), "per_read": 64, "pace": 0.0}),
        ("burst 16 streams", {"streams": 16, "events": int(4000 * scale), "per_read": 64, "pace": 0.0}),
        ("burst 256 streams", {"streams": 256, "events": int(400 * scale), "per_read": 64, "pace": 0.0}),
        ("burst 1 stream, out_max=1", {"streams": 1, "events": int(40000 * scale), "per_read": 64, "pace": 0.0, "out_max": 1}),
        ("burst 1 stream, out_max=64", {"streams": 1, "events": int(40000 * scale), "per_read": 64, "pace": 0.0, "out_max": 64}),
        ("slow consumer (1 ms/send), out_max=8", {"streams": 1, "events": int(8000 * scale), "per_read": 64, "pace": 0.0, "consumer_delay": 0.001, "memory": True}),
        ("slow consumer (1 ms/send), out_max=64", {"streams": 1, "events": int(8000 * scale), "per_read": 64, "pace": 0.0, "consumer_delay": 0.001, "out_max": 64, "memory": True}),
    ]
    rows: list[dict[str, Any]] = []
    for number, (name, kw) in enumerate(scenarios, 1):
        print(f"  [{number}/{len(scenarios)}] {name}", file=sys.stderr, flush=True)
        for placement in ("inline", "worker"):
            results = [asyncio.run(_scenario(placement=placement, **kw)) for _ in range(repeats)]
            row: dict[str, Any] = {"scenario": name, "placement": placement}
            for key in results[0]:
                values = [r[key] for r in results if r[key] is not None]
                row[key] = statistics.median(values) if values else None
            rows.append(row)
    return rows


def format_placement(rows: list[dict[str, Any]]) -> str:
    """The placement rows as a Markdown table (as the README shows it)."""
    head = "| scenario | placement | events/s | latency p50 ms | p99 ms | loop lag p99 ms | max ms | peak KiB | threads |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['placement']} | {r['events_per_s']} | {r['latency_p50_ms']} | "
            f"{r['latency_p99_ms']} | {r['loop_lag_p99_ms']} | {r['loop_lag_max_ms']} | "
            f"{r['peak_mem_kib'] if r['peak_mem_kib'] is not None else '-'} | {r['threads_max']} |"
        )
    return "\n".join(lines)
