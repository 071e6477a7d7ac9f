"""The chosen buffer bounds hold (behaviour, not timing): batches, bytes, reads in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from respflow.flows import BatchQueue, Graph, GraphRun, Strand, batches
from respflow.flows._placement import _stream_reads


def test_batch_queue_is_bounded_in_entries_and_bytes() -> None:
    async def go() -> tuple[int, int]:
        q = BatchQueue(max_entries=3, max_bytes=100)
        await q.put("a", 40)
        await q.put("b", 40)
        blocked = asyncio.create_task(q.put("c", 40))  # 120 bytes would pass the bound
        await asyncio.sleep(0)
        assert not blocked.done() and len(q) == 2
        assert await q.get() == "a"
        await blocked
        await q.put("d", 1)
        entries_blocked = asyncio.create_task(q.put("e", 1))  # a 4th entry
        await asyncio.sleep(0)
        assert not entries_blocked.done()
        await q.get()
        await entries_blocked
        big = BatchQueue(max_entries=2, max_bytes=10)
        await big.put("huge", 1000)  # alone it still goes in: nothing deadlocks
        return q.peak_entries, q.peak_bytes

    entries, size = asyncio.run(go())
    assert entries == 3 and size <= 100


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        BatchQueue(max_entries=0, max_bytes=1)


@pytest.mark.parametrize("placement", ["worker", "inline"])
def test_a_parked_consumer_stops_the_reads(placement: str) -> None:
    """With out_max batches queued and the consumer parked, the pump reads no further."""
    reads_done: list[int] = []
    chunks = _stream_reads(2000, 8, 0)

    async def source() -> AsyncIterator[bytes]:
        for i, chunk in enumerate(chunks):
            reads_done.append(i)
            yield chunk

    async def go() -> None:
        it = batches(source(), GraphRun(Graph()), placement=placement, out_max=4, inline_max_bytes=0)  # type: ignore[arg-type]
        first = await anext(it)
        assert first.frames
        # give the pump and the core thread real time to run as far as they can (an unbounded
        # buffer would have read all 250 reads by then: ~10 ms of work), and wait until the
        # reads stop moving — the pump is parked on the full buffer
        seen = -1
        while seen != len(reads_done):
            seen = len(reads_done)
            await asyncio.sleep(0.15)
        # taken 1 + queued 4 + in flight ≤ 2 + the one being read
        assert len(reads_done) <= 1 + 4 + 2 + 1
        await it.aclose()

    asyncio.run(go())
    assert len(reads_done) < len(chunks)


def test_a_strand_runs_one_streams_reads_in_order_on_a_shared_pool() -> None:
    import concurrent.futures
    import threading

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    order: dict[int, list[int]] = {s: [] for s in range(8)}
    running: dict[int, int] = dict.fromkeys(range(8), 0)
    overlap = []
    lock = threading.Lock()

    def work(arg: tuple[int, int]) -> int:
        stream, n = arg
        with lock:
            running[stream] += 1
            if running[stream] > 1:
                overlap.append(stream)
        order[stream].append(n)
        with lock:
            running[stream] -= 1
        return n

    strands = [Strand(pool) for _ in range(8)]
    futures = [strands[s].submit(work, (s, n)) for n in range(200) for s in range(8)]
    concurrent.futures.wait(futures)
    pool.shutdown()
    assert not overlap
    assert all(order[s] == list(range(200)) for s in range(8))
