"""``respflow bench --store``: what keeping responses costs.

Two measurements, each on the embedded SQLite file and on PostgreSQL (``--pg URL``, else a
throwaway cluster with PostgreSQL's default, durable commit settings when its server binaries
are installed; else that backend is left out, saying why):

* **the store alone**: the gateway's own state keeping (`State.resolve` then `State.persist`)
  for a chained request — the parent and its history read back, the turn's input and output
  written in one transaction — by 1, 4 and 16 concurrent chains; per-request p50/p99 and
  requests per second. Chains grow to ``chain`` turns (a history of 2 x chain items) and start
  over.
* **what storing adds to a request**: ``respflow serve`` in front of the paced upstream, with
  ``--store none`` and with the store, the same chained non-streaming requests at the same
  concurrencies; the store's added latency is its p50/p99 minus that of ``--store none`` in
  the same run (medians over rounds). ``--store none`` cannot chain: it is sent the same
  requests without ``previous_response_id`` (so the added figure also holds the longer
  upstream input a chained turn sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from respflow.flows._bench_serve import _processes, _spawn, free_port, wait_port
from respflow.flows._loadgen import quantile
from respflow.flows.gateway._state import State, stored_item
from respflow.sinks.store import store_for

CONCURRENCY = (1, 4, 16)


def _response(response_id: str, previous: str | None, turn: int) -> dict[str, Any]:
    """A finished Response of the size a chat turn has (one message, ~400 characters)."""
    text = f"turn {turn}: " + "the quick brown fox jumps over the lazy dog " * 9
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": "m",
        "status": "completed",
        "output": [
            {
                "id": "msg_" + uuid.uuid4().hex,
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 10 * turn, "output_tokens": 90, "total_tokens": 10 * turn + 90},
        "previous_response_id": previous,
        "error": None,
        "incomplete_details": None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


async def _chain(state: State, tenant: str, requests: int, chain: int, latencies: list[float]) -> None:
    previous: str | None = None
    for n in range(requests):
        turn = n % chain
        if turn == 0:
            previous = None
        t0 = time.perf_counter()
        body = {"model": "m", "input": f"question {n}", **({"previous_response_id": previous} if previous else {})}
        resolved = await state.resolve(body, tenant)
        turn_input = [stored_item({"type": "message", "role": "user", "content": f"question {n}"})]
        response_id = "resp_" + uuid.uuid4().hex
        await state.persist(tenant, resolved, _response(response_id, previous, turn), turn_input)
        latencies.append(time.perf_counter() - t0)
        previous = response_id


async def _store_alone(url: str, requests: int, chain: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    store = store_for(url)
    assert store is not None
    await store.open()
    try:
        state = State(store)
        await _chain(state, "warm", 20, chain, [])
        for c in CONCURRENCY:
            latencies: list[float] = []
            per_chain = max(requests // c, chain)
            t0 = time.perf_counter()
            await asyncio.gather(*(_chain(state, f"tenant-{c}-{i}", per_chain, chain, latencies) for i in range(c)))
            wall = time.perf_counter() - t0
            ms = sorted(1000 * x for x in latencies)
            rows.append(
                {
                    "backend": store.backend,
                    "concurrency": c,
                    "requests": len(ms),
                    "p50_ms": round(quantile(ms, 0.5) or 0.0, 2),
                    "p99_ms": round(quantile(ms, 0.99) or 0.0, 2),
                    "requests_per_s": round(len(ms) / wall, 1),
                }
            )
    finally:
        await store.aclose()
    return rows


async def _client_chains(url: str, concurrency: int, requests: int, chain: int, *, chained: bool = True) -> tuple[list[float], int, str | None]:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    first_error: str | None = None

    async def one_chain(session: aiohttp.ClientSession, count: int) -> None:
        nonlocal errors, first_error
        previous: str | None = None
        for n in range(count):
            if n % chain == 0:
                previous = None
            body: dict[str, Any] = {"model": "m", "input": f"q{n}", "metadata": {"rate": "0", "events": "20"}}
            if previous and chained:
                body["previous_response_id"] = previous
            t0 = time.perf_counter()
            async with session.post(url, json=body) as r:
                payload = await r.read()
            latencies.append(time.perf_counter() - t0)
            if r.status != 200:
                errors += 1
                first_error = first_error or f"{r.status}: {payload[:200]!r}"
                previous = None
                continue
            answer = json.loads(payload)
            previous = answer["id"] if answer.get("status") == "completed" else None

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers={"Authorization": "Bearer bench"}) as session:
        per = max(requests // concurrency, chain)
        await asyncio.gather(*(one_chain(session, per) for _ in range(concurrency)))
    return latencies, errors, first_error


def _end_to_end(stores: dict[str, str], requests: int, chain: int, rounds: int, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    up_port = free_port()
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    errors: dict[str, int] = {}
    first: dict[str, str] = {}
    with _processes() as procs:
        upstream = _spawn(["-m", "respflow.flows._loadgen", "upstream", str(up_port)])
        procs.append(upstream)
        wait_port(up_port, upstream)
        gateways: dict[str, str] = {}
        for name, url in {"none": "none", **stores}.items():
            port = free_port()
            proc = _spawn(["-m", "respflow", "serve", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--port", str(port), "--store", url])
            procs.append(proc)
            wait_port(port, proc)
            gateways[name] = f"http://127.0.0.1:{port}/v1/responses"
        for name, url in gateways.items():
            asyncio.run(_client_chains(url, 4, 40, chain, chained=name != "none"))  # warm up
        for c in CONCURRENCY:
            for r in range(rounds):
                for name, url in gateways.items():  # interleaved: the same noise for each
                    progress(f"  end to end, concurrency {c}, round {r + 1}/{rounds}: --store {name}")
                    lat, errs, err = asyncio.run(_client_chains(url, c, requests, chain, chained=name != "none"))
                    ms = sorted(1000 * x for x in lat)
                    runs.setdefault((name, c), []).append((quantile(ms, 0.5) or 0.0, quantile(ms, 0.99) or 0.0))
                    errors[name] = errors.get(name, 0) + errs
                    if err and name not in first:
                        first[name] = err
    rows: list[dict[str, Any]] = []
    for c in CONCURRENCY:
        base = runs[("none", c)]
        for name in gateways:
            mine = runs[(name, c)]
            rows.append(
                {
                    "store": name,
                    "concurrency": c,
                    "p50_ms": round(statistics.median(p50 for p50, _ in mine), 2),
                    "p99_ms": round(statistics.median(p99 for _, p99 in mine), 2),
                    "added_p50_ms": None if name == "none" else round(statistics.median(m[0] - b[0] for m, b in zip(mine, base, strict=True)), 2),
                    "added_p99_ms": None if name == "none" else round(statistics.median(m[1] - b[1] for m, b in zip(mine, base, strict=True)), 2),
                    "errors": errors.get(name, 0),
                    "first_error": first.get(name),
                    "rounds": rounds,
                }
            )
    return rows


@contextlib.contextmanager
def _postgres(pg: str | None, progress: Callable[[str], None]) -> Iterator[tuple[str | None, str]]:
    """The PostgreSQL DSN to measure (None: left out) and what it is."""
    if pg:
        yield pg, "the given server"
        return
    from respflow.flows._pgcluster import ClusterUnavailable, cluster

    try:
        with cluster(durable=True) as dsn:
            progress("started a throwaway PostgreSQL cluster (default, durable commit settings)")
            yield dsn, "a throwaway local cluster, fsync and synchronous_commit on"
    except ClusterUnavailable as exc:
        progress(f"PostgreSQL left out: {exc} (give one with --pg URL)")
        yield None, str(exc)


def run_store_bench(
    *,
    requests: int = 400,
    chain: int = 20,
    rounds: int = 3,
    pg: str | None = None,
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """``{"store": rows, "end_to_end": rows, "postgresql": what it ran on}``."""
    with tempfile.TemporaryDirectory() as tmp, _postgres(pg, progress) as (dsn, where):
        stores = {"sqlite": f"sqlite:///{os.path.join(tmp, 'alone.db')}"}
        if dsn is not None:
            stores["postgresql"] = dsn
        alone: list[dict[str, Any]] = []
        for name, url in stores.items():
            progress(f"  the store alone: {name}")
            alone += asyncio.run(_store_alone(url, requests, chain))
        served = {"sqlite": f"sqlite:///{os.path.join(tmp, 'served.db')}"}
        if dsn is not None:
            served["postgresql"] = dsn
        end_to_end = _end_to_end(served, requests // 2, chain, rounds, progress)
    return {"store": alone, "end_to_end": end_to_end, "postgresql": where}


def format_store(result: dict[str, Any]) -> str:
    lines = [
        "the store alone: resolve (parent + history read) + persist (one transaction) per chained request",
        f"{'backend':<11}{'concurrency':>12}{'requests':>10}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}",
    ]
    for row in result["store"]:
        lines.append(
            f"{row['backend']:<11}{row['concurrency']:>12}{row['requests']:>10}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['requests_per_s']:>9.1f}"
        )
    lines += [
        "",
        "what storing adds to a request (respflow serve, chained non-streaming requests; added = minus --store none, same run)",
        f"{'--store':<11}{'concurrency':>12}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}{'errors':>8}",
    ]
    for row in result["end_to_end"]:
        add50 = "" if row["added_p50_ms"] is None else f"{row['added_p50_ms']:.2f}"
        add99 = "" if row["added_p99_ms"] is None else f"{row['added_p99_ms']:.2f}"
        lines.append(f"{row['store']:<11}{row['concurrency']:>12}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{add50:>9}{add99:>9}{row['errors']:>8}")
    lines.append(f"PostgreSQL: {result['postgresql']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - a manual entry
    print(format_store(run_store_bench()))
