"""The background event log, on both stores: who may write it, leases and claims, retention —
and, for any batching of a stream and any cursor, a reader gets exactly the frames after the
cursor, in order (from memory while the run is local, from the store otherwise)."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from respflow.flows import Gateway
from respflow.flows.gateway._background import Background, LogSink, _Live, _Run
from respflow.sinks import sse_frame
from respflow.sinks.store import Store, StoredResponse, store_for

pytestmark = pytest.mark.timeout(120)


def _record(rid: str) -> StoredResponse:
    return StoredResponse(rid, {"id": rid, "status": "queued"}, [], [], background=True, status="queued", running=True)


def test_only_the_owner_writes_leases_run_out_one_claimer_wins_logs_expire(store_url: str) -> None:
    async def go() -> None:
        store = store_for(store_url)
        assert store is not None
        await store.open()
        try:
            now = time.time()
            await store.start_background("t", _record("resp_1"), [], owner="A", lease_until=now + 0.4)
            assert await store.append_events("t", "resp_1", "A", 0, 2, "abc")
            assert not await store.append_events("t", "resp_1", "B", 3, 3, "d")  # not its run
            assert not await store.append_events("u", "resp_1", "A", 3, 3, "d")  # another tenant's id
            assert await store.append_events("t", "resp_1", "A", 3, 4, "de")
            assert await store.events_after("t", "resp_1", -1) == [(0, 2, "abc"), (3, 4, "de")]
            assert await store.events_after("t", "resp_1", 2) == [(3, 4, "de")]
            assert await store.events_after("t", "resp_1", 3) == [(3, 4, "de")]  # the batch holding 4
            assert await store.events_after("t", "resp_1", 4) == []
            assert await store.renew_leases("A", time.time() + 0.4) == ["resp_1"]
            assert await store.abandoned(time.time()) == []
            await asyncio.sleep(0.5)  # A stops renewing
            assert await store.abandoned(time.time()) == [("t", "resp_1")]
            assert await store.claim("t", "resp_1", "B", time.time(), time.time() + 5)
            assert not await store.claim("t", "resp_1", "C", time.time(), time.time() + 5)  # one claimer wins
            assert await store.renew_leases("A", time.time() + 5) == []  # A learns it lost the run
            assert not await store.append_events("t", "resp_1", "A", 5, 5, "f")
            stored = await store.request_cancel("t", "resp_1")
            assert stored is not None and stored.running
            assert await store.cancel_requests("B") == ["resp_1"]
            assert await store.update_body("t", "resp_1", "B", {"id": "resp_1", "status": "cancelled"})
            await store.finish_background("t", "resp_1", "B", retention=0.3)
            ended = await store.get_response("t", "resp_1")
            assert ended is not None and not ended.running and ended.status == "cancelled"
            assert await store.cancel_requests("B") == []
            await asyncio.sleep(0.4)
            assert await store.purge_expired() == 2  # the two logged batches; the response stays
            assert await store.events_after("t", "resp_1", -1) == []
            assert await store.get_response("t", "resp_1") is not None
        finally:
            await store.aclose()

    asyncio.run(go())


def _stream(n: int) -> list[bytes]:
    frames = [sse_frame({"type": "response.output_text.delta", "delta": f"d{i}\n\n", "sequence_number": i}) for i in range(n - 1)]
    return [*frames, sse_frame({"type": "response.completed", "response": {"id": "r"}, "sequence_number": n - 1})]


async def _read(background: Background, tenant: str, rid: str, after: int) -> bytes:
    out = b""
    async for chunk in background.follow(tenant, rid, after):
        out += chunk
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 30),
    cuts=st.lists(st.integers(1, 29), max_size=10),
    cursor=st.integers(-1, 29),
)
def test_a_reader_gets_exactly_the_frames_after_its_cursor(n: int, cuts: list[int], cursor: int) -> None:
    cursor = min(cursor, n - 1)
    frames = _stream(n)
    points = sorted({c for c in cuts if c < n})
    batches = [b"".join(frames[a:b]) for a, b in zip([0, *points], [*points, n], strict=True)]

    async def go() -> tuple[bytes, bytes]:
        with tempfile.TemporaryDirectory() as d:
            store: Store | None = store_for(f"sqlite:///{d}/s.db")
            assert store is not None
            await store.open()
            gateway = Gateway("http://127.0.0.1:9/v1", store=store)
            background = Background(gateway, store, poll=0.05)
            await store.start_background("t", _record("resp_p"), [], owner=background.owner, lease_until=time.time() + 60)
            live = background.live["resp_p"] = _Live()
            background.runs["resp_p"] = _Run("t")
            sink = LogSink(background.writer, "t", "resp_p", live, background.wakeups)
            for batch in batches:
                await sink.send(batch)
            # (a cursor at the terminal waits until the run ends: read that one from the store)
            from_memory = await _read(background, "t", "resp_p", cursor) if cursor < n - 1 else b""
            del background.live["resp_p"], background.runs["resp_p"]
            await store.finish_background("t", "resp_p", background.owner, 60)
            from_store = await _read(background, "t", "resp_p", cursor)
            await gateway.aclose()
            return from_memory, from_store

    from_memory, from_store = asyncio.run(go())
    expected = b"".join(frames[cursor + 1 :])
    assert from_memory == expected or cursor == n - 1
    assert from_store == expected
    assert [json.loads(f.split(b"data: ", 1)[1])["sequence_number"] for f in expected.split(b"\n\n")[:-1]] == list(range(cursor + 1, n))


def test_a_lost_listen_connection_is_made_again(postgres_dsn: str) -> None:
    """The LISTEN connection dies (the server ended it): the next ``listen`` makes a new one,
    and notifications reach the replica again."""
    import asyncpg

    async def go() -> list[str]:
        store = store_for(postgres_dsn)
        assert store is not None
        await store.open()
        heard: list[str] = []
        try:
            assert await store.listen(heard.append, lambda _id: None)
            other = await asyncpg.connect(postgres_dsn)
            try:
                await other.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
                )
                for _ in range(100):  # the client notices the connection is gone
                    if store._listener is None or store._listener.is_closed():  # type: ignore[attr-defined]
                        break
                    await asyncio.sleep(0.02)
                assert await store.listen(heard.append, lambda _id: None)
                await other.execute("SELECT pg_notify('respflow_events', 'resp_x,resp_y')")
                for _ in range(100):
                    if heard:
                        break
                    await asyncio.sleep(0.02)
            finally:
                await other.close()
        finally:
            await store.aclose()
        return heard

    assert asyncio.run(go()) == ["resp_x,resp_y"]
