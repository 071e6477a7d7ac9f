"""Background responses with real parts: two ``respflow serve`` processes on one real PostgreSQL
(a throwaway cluster) — or one gateway on an embedded SQLite file — an upstream on 127.0.0.1
that paces its answer and records when it was closed, the official openai client (strict).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from respflow.flows import Gateway, gateway_app
from respflow.sinks.store import store_for
from tests.integration.servers import UpstreamScript, replica, serve, upstream_app, wait_for
from tests.integration.test_store import client

pytestmark = pytest.mark.timeout(180)

WORDS = [f"w{i} " for i in range(120)]
TEXT = "".join(WORDS)


def paced_answer(words: list[str]) -> bytes:
    """An upstream answer of one message, one delta per word."""
    text = "".join(words)
    resp = {"id": "resp_up", "object": "response", "created_at": 1, "status": "in_progress", "model": "m", "output": []}
    msg = {"id": "msg_up", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": text, "annotations": []}
    done = dict(msg, status="completed", content=[part])
    delta = {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_up", "content_index": 0, "logprobs": []}
    events = [
        {"type": "response.created", "response": resp},
        {"type": "response.in_progress", "response": resp},
        {"type": "response.output_item.added", "output_index": 0, "item": msg},
        {"type": "response.content_part.added", "output_index": 0, "item_id": "msg_up", "content_index": 0, "part": dict(part, text="")},
        *[dict(delta, delta=w) for w in words],
        {"type": "response.output_text.done", "output_index": 0, "item_id": "msg_up", "content_index": 0, "text": text, "logprobs": []},
        {"type": "response.content_part.done", "output_index": 0, "item_id": "msg_up", "content_index": 0, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {"type": "response.completed", "response": dict(resp, status="completed", output=[done])},
    ]
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode()


def paced(script: UpstreamScript, seconds: float) -> UpstreamScript:
    """The answer in ~40 reads, spread over ``seconds``."""
    script.body = paced_answer(WORDS)
    script.chunk = len(script.body) // 40 + 1
    script.pace = seconds / 40
    script.closed_at, script.finished = None, False
    return script


def raw_frames(base: str, rid: str) -> list[dict[str, Any]]:
    """A background response's whole stream, as the frames' JSON (read until it ends)."""
    answer = httpx.get(f"{base}/responses/{rid}", params={"stream": "true"}, headers={"authorization": "Bearer sk-alice"}, timeout=30)
    assert answer.status_code == 200
    return [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]


def deltas(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def seqs(events: list[Any]) -> list[int]:
    return [e.sequence_number for e in events]


@pytest.fixture(scope="module")
def pair(postgres_cluster: str) -> Iterator[tuple[UpstreamScript, str, str]]:
    """An upstream and two replicas (A, B) on one PostgreSQL database."""
    from tests.integration.postgres import fresh_database

    dsn = fresh_database(postgres_cluster)
    script = UpstreamScript()
    with serve(upstream_app(script)) as up, replica(up, dsn) as (a, _), replica(up, dsn) as (b, _):
        yield script, a, b


def test_cut_on_a_resumed_and_polled_on_b(pair: tuple[UpstreamScript, str, str]) -> None:
    script, a, b = pair
    paced(script, 3.0)
    with client(a) as on_a, client(b) as on_b:
        stream = on_a.responses.create(model="m", input="a long story", background=True, stream=True)
        first: list[Any] = []
        for event in stream:
            first.append(event)
            if len(first) == 12:
                break
        stream.close()  # the client goes away: the run goes on
        rid = first[0].response.id
        assert first[0].response.background is True
        polled = on_b.responses.retrieve(rid)
        assert polled.status in ("queued", "in_progress") and polled.background is True
        rest = list(on_b.responses.retrieve(rid, stream=True, starting_after=first[-1].sequence_number))
        whole = first + rest
        assert seqs(whole) == list(range(len(whole)))  # none missing, none twice
        assert whole[-1].type == "response.completed"
        assert deltas(whole) == TEXT
        final = on_b.responses.retrieve(rid)
        assert final.status == "completed" and final.output_text == TEXT
        # a second reader from the start gets the same stream again
        again = list(on_a.responses.retrieve(rid, stream=True))
        assert seqs(again) == seqs(whole) and deltas(again) == TEXT


def test_polling_on_b_until_completed(pair: tuple[UpstreamScript, str, str]) -> None:
    script, a, b = pair
    paced(script, 2.0)
    with client(a) as on_a, client(b) as on_b:
        queued = on_a.responses.create(model="m", input="poll me", background=True)
        assert queued.status == "queued" and queued.background is True and queued.output == []
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            current = on_b.responses.retrieve(queued.id)
            seen.append(current.status)
            if current.status == "completed":
                break
            time.sleep(0.1)
        assert seen[-1] == "completed" and "in_progress" in seen
        assert current.output_text == TEXT


def test_cancel_on_b_stops_the_upstream_on_a(pair: tuple[UpstreamScript, str, str]) -> None:
    script, a, b = pair
    paced(script, 30.0)
    with client(a) as on_a, client(b) as on_b:
        made = on_a.responses.create(model="m", input="never mind", background=True)
        reader = on_b.responses.retrieve(made.id, stream=True)
        events = [next(iter(reader)) for _ in range(6)]  # it runs
        asked = time.monotonic()
        cancelled = on_b.responses.cancel(made.id)
        assert cancelled.status == "cancelled"
        wait_for(lambda: script.closed_at is not None, 5, "the upstream to be closed")
        assert script.closed_at is not None and script.closed_at - asked < 2.5
        assert not script.finished
        events += list(reader)  # the reader on B gets the terminal
        assert events[-1].type == "response.failed" and events[-1].response.status == "cancelled"
        assert seqs(events) == list(range(len(events)))
        again = on_a.responses.cancel(made.id)  # idempotent, from either replica
        assert again.model_dump() == cancelled.model_dump()
        assert on_a.responses.retrieve(made.id).status == "cancelled"


def test_resume_waits_past_the_end_and_bad_input_is_refused(pair: tuple[UpstreamScript, str, str]) -> None:
    script, a, b = pair
    paced(script, 1.0)
    with client(a) as on_a, client(b) as on_b, client(b, key="sk-mallory") as other:
        made = on_a.responses.create(model="m", input="x", background=True)
        # far past the current end: it waits for the run, and only what comes after N arrives
        events = list(on_b.responses.retrieve(made.id, stream=True, starting_after=20))
        assert seqs(events)[0] == 21 and events[-1].type == "response.completed"
        for bad in ("-1", "x", "1.5"):
            answer = httpx.get(f"{b}/responses/{made.id}", params={"stream": "true", "starting_after": bad}, headers={"authorization": "Bearer sk-alice"})
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "starting_after"
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(made.id, stream=True)
        with pytest.raises(openai.NotFoundError):
            other.responses.cancel(made.id)
        plain = on_b.responses.create(model="m", input="not background")
        with pytest.raises(openai.BadRequestError, match="background"):
            on_a.responses.retrieve(plain.id, stream=True)
        with pytest.raises(openai.BadRequestError, match="background"):
            on_a.responses.cancel(plain.id)
        with pytest.raises(openai.BadRequestError, match="store"):
            on_a.responses.create(model="m", input="x", background=True, store=False)
        done = on_b.responses.cancel(made.id)  # cancelling an ended response returns it as it is
        assert done.status == "completed"


def test_a_killed_replica_is_detected_and_its_readers_end(postgres_dsn: str) -> None:
    script = paced(UpstreamScript(), 60.0)
    lease = ("--background-lease", "2")
    with (
        serve(upstream_app(script)) as up,
        replica(up, postgres_dsn, *lease) as (a, proc_a),
        replica(up, postgres_dsn, *lease) as (b, _),
        client(a) as on_a,
        client(b) as on_b,
    ):
        made = on_a.responses.create(model="m", input="die", background=True)
        reader = iter(on_b.responses.retrieve(made.id, stream=True))
        events = [next(reader) for _ in range(5)]
        os.kill(proc_a.pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(openai.APIError, match="stopped"):
            for event in reader:
                events.append(event)
        detected = time.monotonic() - killed
        assert detected < 30
        final = on_b.responses.retrieve(made.id)
        assert final.status == "failed" and final.error is not None
        assert final.error.code == "server_error" and "stopped" in final.error.message
        frames = raw_frames(b, made.id)
        assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
        assert frames[-1]["type"] == "response.failed" and frames[-2]["type"] == "error"


# -- one process, embedded SQLite ---------------------------------------------------------------


@contextlib.contextmanager
def sqlite_gateway(script: UpstreamScript, **kw: Any) -> Iterator[str]:
    with (
        tempfile.TemporaryDirectory() as d,
        serve(upstream_app(script)) as up,
        serve(gateway_app(Gateway(up, store=store_for(f"sqlite:///{d}/s.db"), **kw))) as gw,
    ):
        yield gw


def test_a_disconnect_does_not_cancel_a_background_run_on_sqlite() -> None:
    script = paced(UpstreamScript(), 1.5)
    with sqlite_gateway(script) as gw, client(gw) as c:
        stream = c.responses.create(model="m", input="go on without me", background=True, stream=True)
        first = [next(iter(stream)) for _ in range(4)]
        stream.close()
        rid = first[0].response.id
        wait_for(lambda: script.finished, 20, "the upstream to finish")
        final = c.responses.retrieve(rid)
        assert final.status == "completed" and final.output_text == TEXT
        events = list(c.responses.retrieve(rid, stream=True, starting_after=3))
        assert seqs(events)[0] == 4 and deltas(first + events) == TEXT


def test_a_background_run_that_fails_before_streaming_ends_failed() -> None:
    script = UpstreamScript()
    script.mode = "status500"
    with sqlite_gateway(script) as gw, client(gw) as c:
        made = c.responses.create(model="m", input="x", background=True)
        with pytest.raises(openai.APIError, match=r"exploded|upstream"):
            list(c.responses.retrieve(made.id, stream=True))
        final = c.responses.retrieve(made.id)
        assert final.status == "failed" and final.error is not None
        types = [f["type"] for f in raw_frames(gw, made.id)]
        assert types == ["response.created", "response.in_progress", "error", "response.failed"]


def test_background_needs_a_store() -> None:
    script = paced(UpstreamScript(), 0.1)
    with (
        serve(upstream_app(script)) as up,
        serve(gateway_app(Gateway(up))) as gw,
        client(gw) as c,
        pytest.raises(openai.BadRequestError, match="background"),
    ):
        c.responses.create(model="m", input="x", background=True)


def test_gateway_tools_run_in_background_and_a_cancel_stops_them() -> None:
    """Rounds and gateway tools apply to a background run; a cancel while a tool runs cancels
    the tool and ends the response ``cancelled``."""
    import asyncio

    from respflow.flows import GatewayTool, simulator_app

    state: dict[str, Any] = {"slow": False, "started": False, "cancelled": False}

    async def add(args: dict[str, Any]) -> str:
        if state["slow"]:
            state["started"] = True
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                state["cancelled"] = True
                raise
        return str(sum(args["numbers"]))

    numbers = {"type": "object", "properties": {"numbers": {"type": "array", "items": {"type": "number"}}}, "required": ["numbers"]}
    tool = GatewayTool("add_numbers", add, "Add numbers.", numbers)
    with (
        tempfile.TemporaryDirectory() as d,
        serve(simulator_app(pace=0.0)) as up,
        serve(gateway_app(Gateway(up, tools=[tool], store=store_for(f"sqlite:///{d}/s.db")))) as gw,
        client(gw) as c,
    ):
        made = c.responses.create(model="m", input="add_numbers 2 and 40", background=True)
        events = list(c.responses.retrieve(made.id, stream=True))
        assert events[-1].type == "response.completed"
        final = c.responses.retrieve(made.id)
        assert [i.type for i in final.output] == ["mcp_call", "message"] and "42" in final.output_text
        state["slow"] = True
        slow = c.responses.create(model="m", input="add_numbers 1 and 2", background=True)
        reader = c.responses.retrieve(slow.id, stream=True)
        wait_for(lambda: state["started"], 10, "the tool to run")
        asked = time.monotonic()
        assert c.responses.cancel(slow.id).status == "cancelled"
        assert state["cancelled"] and time.monotonic() - asked < 2
        events = list(reader)
        assert events[-1].type == "response.failed" and events[-1].response.status == "cancelled"
        assert seqs(events) == list(range(len(events)))


def test_a_background_log_is_bounded() -> None:
    """Past ``background_max_log_bytes`` the run ends failed (``log_bytes``), its log holding
    what was logged before and the terminal."""
    script = paced(UpstreamScript(), 0.5)
    with sqlite_gateway(script, background_max_log_bytes=4000) as gw, client(gw) as c:
        made = c.responses.create(model="m", input="too long to keep", background=True)
        with pytest.raises(openai.APIError, match="event log"):
            list(c.responses.retrieve(made.id, stream=True))
        final = c.responses.retrieve(made.id)
        assert final.status == "failed"
        frames = raw_frames(gw, made.id)
        assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
        assert frames[-2]["type"] == "error" and frames[-2]["code"] == "log_bytes"
        assert frames[-1]["type"] == "response.failed"
        logged = sum(len(json.dumps(f)) for f in frames[:-2])
        assert logged <= 4000
