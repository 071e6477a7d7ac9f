"""``respflow bench``: throughput of the core against a floor measured in the same run.

The floor is the least any SSE consumer must do: split the same bytes into lines in a plain
loop and ``orjson.loads`` every ``data:`` payload. Every figure is a median over repeats and
is reported as a ratio to that floor, so a noisy machine moves both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from respflow.operators import AgentPipeline, LineSplitter, Validation

READ_SIZE = 16 << 10


def synthetic_stream(items: int = 40, deltas: int = 250) -> bytes:
    """A vLLM-shaped stream: reasoning, message and function-call items with many deltas."""
    out: list[bytes] = []
    seq = 0

    def emit(event: dict[str, Any]) -> None:
        nonlocal seq
        event["sequence_number"] = seq
        seq += 1
        out.append(b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n")

    rid = "resp_bench"
    emit({"type": "response.created", "response": {"id": rid, "status": "in_progress", "output": [], "model": "bench", "object": "response", "created_at": 1}})
    emit({"type": "response.in_progress", "response": {"id": rid, "status": "in_progress"}})
    for i in range(items):
        kind = i % 3
        iid = f"item-{i:04d}-4e5a-8b9c-0d1e2f3a4b5c"
        if kind == 0:
            emit({"type": "response.output_item.added", "output_index": i, "item": {"type": "reasoning", "id": iid, "summary": [], "status": "in_progress"}})
            for d in range(deltas):
                emit({"type": "response.reasoning_text.delta", "output_index": i, "item_id": iid, "content_index": 0, "delta": f" token{d}"})
            emit({"type": "response.output_item.done", "output_index": i, "item": {"type": "reasoning", "id": iid, "summary": [], "content": [{"type": "reasoning_text", "text": "…"}], "status": "completed"}})
        elif kind == 1:
            emit({"type": "response.output_item.added", "output_index": i, "item": {"type": "message", "id": iid, "role": "assistant", "status": "in_progress", "content": []}})
            emit({"type": "response.content_part.added", "output_index": i, "item_id": iid, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
            text = []
            for d in range(deltas):
                text.append(f" word{d}")
                emit({"type": "response.output_text.delta", "output_index": i, "item_id": iid, "content_index": 0, "delta": text[-1], "logprobs": []})
            full = "".join(text)
            emit({"type": "response.output_text.done", "output_index": i, "item_id": iid, "content_index": 0, "text": full, "logprobs": []})
            emit({"type": "response.content_part.done", "output_index": i, "item_id": iid, "content_index": 0, "part": {"type": "output_text", "text": full, "annotations": []}})
            emit({"type": "response.output_item.done", "output_index": i, "item": {"type": "message", "id": iid, "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": full, "annotations": []}]}})
        else:
            emit({"type": "response.output_item.added", "output_index": i, "item": {"type": "function_call", "id": iid, "call_id": f"call_{i}", "name": "lookup", "arguments": "", "status": "in_progress"}})
            args = []
            for d in range(deltas):
                args.append(f'"k{d}": {d}, ')
                emit({"type": "response.function_call_arguments.delta", "output_index": i, "item_id": iid, "delta": args[-1]})
            emit({"type": "response.function_call_arguments.done", "output_index": i, "item_id": iid, "arguments": "".join(args), "name": "lookup"})
            emit({"type": "response.output_item.done", "output_index": i, "item": {"type": "function_call", "id": iid, "call_id": f"call_{i}", "name": "lookup", "arguments": "".join(args), "status": "completed"}})
    emit({"type": "response.completed", "response": {"id": rid, "status": "completed", "usage": {"input_tokens": 1, "output_tokens": items * deltas, "total_tokens": 1 + items * deltas}}})
    return b"".join(out)


def reads(body: bytes, size: int = READ_SIZE) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def floor(chunks: list[bytes]) -> int:
    """Split into lines in a plain loop and parse every data payload: the least possible work."""
    tail = b""
    events = 0
    loads = orjson.loads
    for chunk in chunks:
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        for line in lines:
            if line[:6] == b"data: ":
                loads(line[6:])
                events += 1
    return events


def core(chunks: list[bytes]) -> int:
    """split → normalize → validate → fold (→ translate) and finish(), lenient."""
    splitter = LineSplitter()
    pipeline = AgentPipeline(validation=Validation.LENIENT, response_id="resp_gw")
    events = 0
    for chunk in chunks:
        events += len(pipeline.push_all(splitter.feed(chunk)).frames)
    events += len(pipeline.push_all(splitter.flush()).frames)
    pipeline.finish()
    return events


def relay(chunks: list[bytes]) -> int:
    """The core plus translate and the relay, collecting the client SSE bytes."""
    import asyncio

    from respflow.flows._drivers import live
    from respflow.sinks import CollectSink

    sink = CollectSink()
    asyncio.run(live(chunks, sink, response_id="resp_gw", placement="inline"))
    return sink.getvalue().count(b"\ndata: ")


def run_core_bench(*, quick: bool = False) -> list[dict[str, Any]]:
    """Rows of the core benchmark: name, events, median seconds, events/s, ratio to the floor.

    The workloads run interleaved (floor, core, relay, floor, core, relay, …) so drift on a
    noisy machine hits them alike; each ratio is the median of the per-round ratios.
    """
    body = synthetic_stream(items=12 if quick else 60, deltas=200 if quick else 500)
    chunks = reads(body)
    repeats = 3 if quick else 9
    workloads: list[tuple[str, Callable[[list[bytes]], int]]] = [
        ("floor (split + orjson.loads)", floor),
        ("core (split→normalize→validate→fold)", core),
        ("relay (core + translate + relay → SSE)", relay),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in workloads}
    events: dict[str, int] = {}
    for _ in range(repeats):
        for name, fn in workloads:
            t0 = time.perf_counter()
            events[name] = fn(chunks)
            times[name].append(time.perf_counter() - t0)
    base = times[workloads[0][0]]
    rows: list[dict[str, Any]] = []
    for name, _ in workloads:
        t = statistics.median(times[name])
        ratios = [b / x for b, x in zip(base, times[name], strict=True)]
        rows.append(
            {
                "name": name,
                "bytes": len(body),
                "events": events[name],
                "median_s": round(t, 4),
                "events_per_s": round(events[name] / t),
                "mb_in_per_s": round(len(body) / t / 1e6, 1),
                "ratio_to_floor": round(statistics.median(ratios), 3),
            }
        )
    return rows


# ---- `respflow bench --detail`: the figures the README quotes beside the table ---------------


def _median_ns(samples: list[float], events: int) -> float:
    return round(1e9 * statistics.median(samples) / events, 1)


def stage_costs(chunks: list[bytes], repeats: int) -> dict[str, float]:
    """ns per event of each stage alone: the reads go through the stages one read at a time,
    as in the pipeline (nothing piles up), each stage's call timed on its own; and the
    ``orjson.loads`` inside normalize, timed on the same payloads."""
    from respflow.operators import Folder, Normalizer, ToolRegistry, Translator, Validator

    names = ("split", "normalize", "orjson.loads", "validate", "fold", "translate")
    times: dict[str, list[float]] = {k: [] for k in names}
    clock = time.perf_counter
    loads = orjson.loads
    events = 0
    for _ in range(repeats):
        total = dict.fromkeys(names, 0.0)
        splitter = LineSplitter()
        normalizer = Normalizer()
        validator = Validator(Validation.LENIENT)
        folder = Folder(response_id="resp_gw")
        translator = Translator(ToolRegistry(), folder)
        events = 0
        for chunk in chunks:
            t0 = clock()
            lines = splitter.feed(chunk)
            t1 = clock()
            for payload, _ in lines:
                loads(payload)
            t2 = clock()
            frames = normalizer.feed_all(lines)
            t3 = clock()
            frames = validator.feed_all(frames)
            t4 = clock()
            frames = folder.feed_all(frames)
            t5 = clock()
            translator.feed_all(frames)
            t6 = clock()
            total["split"] += t1 - t0
            total["orjson.loads"] += t2 - t1
            total["normalize"] += t3 - t2
            total["validate"] += t4 - t3
            total["fold"] += t5 - t4
            total["translate"] += t6 - t5
            events += len(lines)
        for name in names:
            times[name].append(total[name])
    return {k: _median_ns(v, events) for k, v in times.items()}


def json_vs_orjson(chunks: list[bytes], repeats: int) -> float:
    """How many times slower the stdlib ``json.loads`` is than ``orjson.loads`` on the payloads."""
    import json

    splitter = LineSplitter()
    payloads = [p for c in chunks for p, _ in splitter.feed(c)]
    ratios = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for p in payloads:
            json.loads(p)
        t1 = time.perf_counter()
        for p in payloads:
            orjson.loads(p)
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    return round(statistics.median(ratios), 2)


def recorded_ratios(repeats: int) -> list[dict[str, Any]]:
    """The core's ratio to the floor on each recording bundled with the package (16 KiB reads;
    a short stream's fixed costs — building the pipeline, the final Response — show here)."""
    from pathlib import Path

    out = []
    for path in sorted((Path(__file__).parent / "data").glob("*.sse")):
        chunks = reads(path.read_bytes())
        ratios = []
        events = 0
        for _ in range(repeats * 5):
            t0 = time.perf_counter()
            floor(chunks)
            t1 = time.perf_counter()
            events = core(chunks)
            t2 = time.perf_counter()
            ratios.append((t1 - t0) / (t2 - t1))
        out.append({"recording": path.name, "events": events, "ratio_to_floor": round(statistics.median(ratios), 3)})
    return out


def gc_freeze_effect(chunks: list[bytes], repeats: int) -> dict[str, float]:
    """µs per relayed event of the relay workload with the startup heap frozen (``gc.freeze``,
    as ``respflow serve`` does) and not, interleaved."""
    import gc

    plain: list[float] = []
    frozen: list[float] = []
    events = 1
    for _ in range(repeats):
        gc.unfreeze()
        gc.collect()
        t0 = time.perf_counter()
        events = relay(chunks)
        plain.append(time.perf_counter() - t0)
        gc.freeze()
        t0 = time.perf_counter()
        relay(chunks)
        frozen.append(time.perf_counter() - t0)
    gc.unfreeze()
    return {
        "unfrozen_us_per_event": round(1e6 * statistics.median(plain) / events, 3),
        "frozen_us_per_event": round(1e6 * statistics.median(frozen) / events, 3),
    }


def trickle_costs(streams: int, events: int = 20_000, repeats: int = 3) -> dict[str, float]:
    """µs per event of the serving path's own work when every read is ONE event (the LLM
    trickle), with ``streams`` streams interleaved read by read as a server sees them: the
    graph (`GraphRun.process`: split → … → translate, through the Rx graph) and the relay
    (`Relay.emit_upstream`: sequence, serialize, into a sink that keeps nothing). No I/O, no
    HTTP, the startup heap frozen as in ``respflow serve``: what the pipeline itself costs per
    event beyond the HTTP stack, with warm caches (medians over repeats)."""
    import asyncio

    from respflow.flows._graph import Graph, GraphRun
    from respflow.sinks import Relay

    class _Drop:
        sent = 0

        async def send(self, data: bytes) -> None:
            _Drop.sent += data.count(b"\ndata: ")

        async def aclose(self) -> None:
            return None

    body = synthetic_stream(items=2, deltas=events // streams + 1)
    parts = [p + b"\n\n" for p in body.split(b"\n\n") if p]
    head = b"".join(parts[:4])  # created, in_progress, the reasoning item and its first delta
    deltas = [p for p in parts[4:] if b"reasoning_text.delta" in p][: events // streams]

    async def once() -> tuple[float, float]:
        runs = []
        for _ in range(streams):
            run = GraphRun(Graph(validation=Validation.LENIENT, response_id="resp_gw", model="bench"))
            relay = Relay(_Drop(), response_id="resp_gw", model="bench")
            await relay.emit_upstream(run.process(head))
            runs.append((run, relay))
        graph = out = 0
        clock = time.perf_counter_ns
        for chunk in deltas:
            for run, relay in runs:
                t0 = clock()
                translation = run.process(chunk)
                t1 = clock()
                await relay.emit_upstream(translation)
                graph += t1 - t0
                out += clock() - t1
        n = len(deltas) * streams
        if _Drop.sent != n + 4 * streams:  # the head's four events, then one per delta
            raise RuntimeError(f"the relay sent {_Drop.sent} events for {n + 4 * streams}")
        _Drop.sent = 0
        return graph / n / 1000, out / n / 1000

    import gc

    gc.collect()
    gc.freeze()  # as `respflow serve` does before serving: the startup heap is not walked again
    try:
        results = [asyncio.run(once()) for _ in range(repeats)]
    finally:
        gc.unfreeze()
    return {
        "graph_us": round(statistics.median(r[0] for r in results), 2),
        "relay_us": round(statistics.median(r[1] for r in results), 2),
    }


def run_detail(*, quick: bool = False) -> dict[str, Any]:
    body = synthetic_stream(items=12 if quick else 60, deltas=200 if quick else 500)
    chunks = reads(body)
    repeats = 3 if quick else 9
    return {
        "stage_ns_per_event": stage_costs(chunks, repeats),
        "json_loads_x_orjson": json_vs_orjson(chunks, repeats),
        "recorded": recorded_ratios(1 if quick else 3),
        "gc_freeze": gc_freeze_effect(chunks, repeats),
        "trickle": {str(n): trickle_costs(n, events=4_000 if quick else 20_000) for n in (1, 200)},
    }


def format_detail(detail: dict[str, Any]) -> str:
    stages = detail["stage_ns_per_event"]
    lines = ["per event, each stage alone (ns, medians):"]
    lines += [f"  {name:13} {ns:>8.1f} ns" for name, ns in stages.items()]
    lines.append(f"json.loads / orjson.loads on the same payloads: {detail['json_loads_x_orjson']:.2f}x")
    lines.append("core / floor on the bundled recordings (16 KiB reads):")
    lines += [f"  {r['recording']:36} {r['events']:>5} events  {r['ratio_to_floor']:.3f}x" for r in detail["recorded"]]
    gc_ = detail["gc_freeze"]
    lines.append(
        f"relay workload: {gc_['unfrozen_us_per_event']:.3f} us/event, {gc_['frozen_us_per_event']:.3f} us/event with gc.freeze()"
    )
    lines.append("one event per read (the LLM trickle), no I/O: graph + relay, us per event:")
    for n, row in detail["trickle"].items():
        lines.append(f"  {n:>4} stream(s) interleaved  graph {row['graph_us']:.2f}  relay {row['relay_us']:.2f}  total {row['graph_us'] + row['relay_us']:.2f}")
    return "\n".join(lines)
