"""Stored responses and conversations with real parts: the gateway under uvicorn on an embedded
SQLite file and on a real PostgreSQL (a throwaway cluster), a recording upstream on 127.0.0.1,
the official openai client (strict) as the consumer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import sqlite3
import tempfile
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from respflow.flows import Gateway, gateway_app
from respflow.sinks.store import store_for
from tests.integration.servers import UpstreamScript, replica, serve, upstream_app

pytestmark = pytest.mark.timeout(120)


def answer(text: str) -> bytes:
    """A complete upstream answer: one message with ``text``."""
    resp = {"id": "resp_up", "object": "response", "created_at": 1, "status": "in_progress", "model": "m", "output": []}
    msg = {"id": "msg_up", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": text, "annotations": []}
    done = dict(msg, status="completed", content=[part])
    events = [
        {"type": "response.created", "response": resp},
        {"type": "response.in_progress", "response": resp},
        {"type": "response.output_item.added", "output_index": 0, "item": msg},
        {"type": "response.content_part.added", "output_index": 0, "item_id": "msg_up", "content_index": 0, "part": dict(part, text="")},
        {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_up", "content_index": 0, "delta": text, "logprobs": []},
        {"type": "response.output_text.done", "output_index": 0, "item_id": "msg_up", "content_index": 0, "text": text, "logprobs": []},
        {"type": "response.content_part.done", "output_index": 0, "item_id": "msg_up", "content_index": 0, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {"type": "response.completed", "response": dict(resp, status="completed", output=[done])},
    ]
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode()


@contextlib.contextmanager
def stack(store_url: str, **kw: Any) -> Iterator[tuple[UpstreamScript, str]]:
    script = UpstreamScript()
    script.body = answer("the answer")
    with serve(upstream_app(script)) as up, serve(gateway_app(Gateway(up, store=store_for(store_url), **kw))) as gw:
        yield script, gw


def client(gw: str, key: str = "sk-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw, api_key=key, max_retries=0, _strict_response_validation=True)


def texts(items: list[Any]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        content = item.get("content")
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])
        out.append((item.get("role", item.get("type")), text))
    return out


def test_retrieve_chain_and_delete(store_url: str) -> None:
    with stack(store_url) as (script, gw), client(gw) as c:
        first = c.responses.create(model="m", input="hello")
        assert c.responses.retrieve(first.id).model_dump() == first.model_dump()
        listed = c.responses.input_items.list(first.id)
        assert [(i.type, i.role, i.content[0].text) for i in listed.data] == [("message", "user", "hello")]  # type: ignore[union-attr]

        second = c.responses.create(model="m", input="more", previous_response_id=first.id)
        with c.responses.stream(model="m", input="again", previous_response_id=second.id) as stream:
            third = stream.get_final_response()
        assert second.previous_response_id == first.id and third.previous_response_id == second.id
        # the upstream got the whole history each time, and never the gateway's ids
        sent = script.requests
        assert texts(sent[1]["input"]) == [("user", "hello"), ("assistant", "the answer"), ("user", "more")]
        assert texts(sent[2]["input"]) == [("user", "hello"), ("assistant", "the answer"), ("user", "more"), ("assistant", "the answer"), ("user", "again")]
        assert all("previous_response_id" not in r and "conversation" not in r and r["store"] is False for r in sent)

        c.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(first.id)
        # a deleted parent's turns live on in its children's context
        fourth = c.responses.create(model="m", input="still", previous_response_id=third.id)
        assert len(script.requests[-1]["input"]) == 7
        assert c.responses.retrieve(fourth.id).status == "completed"


def test_another_credential_sees_nothing(store_url: str) -> None:
    with stack(store_url) as (_script, gw), client(gw) as alice, client(gw, "sk-bob") as bob:
        mine = alice.responses.create(model="m", input="private")
        conversation = alice.conversations.create(metadata={"k": "v"})
        for call in (
            lambda: bob.responses.retrieve(mine.id),
            lambda: bob.responses.delete(mine.id),
            lambda: bob.responses.input_items.list(mine.id),
            lambda: bob.responses.create(model="m", input="x", previous_response_id=mine.id),
            lambda: bob.conversations.retrieve(conversation.id),
            lambda: bob.conversations.items.list(conversation.id),
            lambda: bob.responses.create(model="m", input="x", conversation=conversation.id),
        ):
            with pytest.raises(openai.NotFoundError) as info:
                call()
            assert info.value.status_code == 404
        assert alice.responses.retrieve(mine.id).id == mine.id  # still there for its owner
        # and an id that does not exist answers exactly the same
        with pytest.raises(openai.NotFoundError) as missing:
            alice.responses.retrieve("resp_doesnotexist")
        assert missing.value.body == {"message": "Response with id 'resp_doesnotexist' not found", "type": "invalid_request_error", "param": "response_id", "code": "not_found"}


def test_bad_state_input_is_a_clear_4xx_never_a_5xx(store_url: str) -> None:
    with stack(store_url, max_history_items=3) as (script, gw), client(gw) as c:
        first = c.responses.create(model="m", input="one")
        conversation = c.conversations.create()
        cases: list[tuple[dict[str, Any], int, str | None]] = [
            ({"previous_response_id": first.id, "conversation": conversation.id}, 400, "previous_response_id"),
            ({"previous_response_id": "resp_nope"}, 404, "previous_response_id"),
            ({"previous_response_id": "../../etc/passwd"}, 400, "previous_response_id"),
            ({"conversation": {"id": "conv with spaces"}}, 400, "conversation"),
            ({"conversation": 5}, 400, "conversation"),
            ({"store": "yes"}, 400, "store"),
        ]
        for extra, status, param in cases:
            r = httpx.post(gw + "/responses", json={"model": "m", "input": "x", **extra}, headers={"authorization": "Bearer sk-alice"}, timeout=30)
            assert (r.status_code, r.json()["error"]["param"]) == (status, param), (extra, r.text)
        # a history over the limit (3 items): one turn is 2 (input, output)
        second = c.responses.create(model="m", input="two", previous_response_id=first.id)
        with pytest.raises(openai.BadRequestError) as info:
            c.responses.create(model="m", input="three", previous_response_id=second.id)
        assert info.value.code == "history_too_large"
        for path in ("/responses/bad%20id", "/responses/bad%20id/input_items", "/conversations/bad%20id"):
            assert httpx.get(gw + path, headers={"authorization": "Bearer sk-alice"}).status_code == 400
        assert httpx.get(gw + f"/responses/{first.id}/input_items?limit=0", headers={"authorization": "Bearer sk-alice"}).status_code == 400
        assert len(script.requests) == 2  # none of the refused requests reached the upstream


def test_store_false_keeps_nothing(store_url: str) -> None:
    with stack(store_url) as (_, gw), client(gw) as c:
        kept = c.responses.create(model="m", input="a", store=True)
        gone = c.responses.create(model="m", input="b", store=False)
        assert (kept.store, gone.store) == (True, False)
        assert c.responses.retrieve(kept.id).id == kept.id
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(gone.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.create(model="m", input="c", previous_response_id=gone.id)


def test_input_items_page_with_the_cursor(store_url: str) -> None:
    with stack(store_url) as (_, gw), client(gw) as c:
        many = [{"type": "message", "role": "user", "content": f"m{i}"} for i in range(7)]
        r = c.responses.create(model="m", input=many)  # type: ignore[arg-type]
        first = c.responses.input_items.list(r.id, limit=3, order="asc")
        assert [i.content[0].text for i in first.data] == ["m0", "m1", "m2"]  # type: ignore[union-attr]
        assert first.has_more is True
        every = [i.content[0].text for i in c.responses.input_items.list(r.id, limit=3, order="asc")]  # type: ignore[union-attr]
        assert every == [f"m{i}" for i in range(7)]  # the client followed the cursor
        desc = c.responses.input_items.list(r.id, limit=2)
        assert [i.content[0].text for i in desc.data] == ["m6", "m5"]  # type: ignore[union-attr]


def test_conversations_api_and_turns(store_url: str) -> None:
    with stack(store_url) as (script, gw), client(gw) as c:
        conv = c.conversations.create(metadata={"topic": "plants"}, items=[{"type": "message", "role": "user", "content": "I like ferns"}])
        assert c.conversations.retrieve(conv.id).metadata == {"topic": "plants"}
        assert c.conversations.update(conv.id, metadata={"topic": "trees"}).metadata == {"topic": "trees"}
        added = c.conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": "and moss"}])
        assert [i.type for i in added.data] == ["message"]
        turn = c.responses.create(model="m", input="what do I like?", conversation=conv.id)
        assert turn.conversation is not None and turn.conversation.id == conv.id
        assert texts(script.requests[-1]["input"]) == [("user", "I like ferns"), ("user", "and moss"), ("user", "what do I like?")]
        items = c.conversations.items.list(conv.id, order="asc").data
        assert [(i.type, getattr(i, "role", None)) for i in items] == [("message", "user")] * 3 + [("message", "assistant")]
        last = items[-1]
        assert c.conversations.items.retrieve(last.id, conversation_id=conv.id).id == last.id
        after = c.conversations.items.delete(last.id, conversation_id=conv.id)
        assert after.id == conv.id
        assert len(c.conversations.items.list(conv.id).data) == 3
        with pytest.raises(openai.NotFoundError):
            c.conversations.items.retrieve(last.id, conversation_id=conv.id)
        assert c.conversations.delete(conv.id).deleted is True
        with pytest.raises(openai.NotFoundError):
            c.conversations.retrieve(conv.id)


def test_concurrent_turns_on_one_conversation_append_in_order(store_url: str) -> None:
    with stack(store_url) as (_, gw), client(gw) as c:
        conv = c.conversations.create()
        prompts = [f"turn {i}" for i in range(6)]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda p: c.responses.create(model="m", input=p, conversation=conv.id), prompts))
        items = list(c.conversations.items.list(conv.id, order="asc", limit=100))
    assert len(items) == 12
    # each turn's input is followed at once by its own answer: turns never interleave
    roles = [i.role for i in items]  # type: ignore[union-attr]
    assert roles == ["user", "assistant"] * 6
    users = [i.content[0].text for i in items[::2]]  # type: ignore[union-attr]
    assert sorted(users) == sorted(prompts)


def test_a_turn_that_cannot_be_stored_is_not_reported_completed() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/store.db"
        with stack(f"sqlite:///{path}") as (_, gw), client(gw) as c:
            c.responses.create(model="m", input="fine")
            broken = sqlite3.connect(path)
            broken.execute("DROP TABLE responses")  # the store fails from now on
            broken.commit()
            broken.close()
            with httpx.stream("POST", gw + "/responses", json={"model": "m", "input": "x", "stream": True}, timeout=30) as r:
                raw = b"".join(r.iter_bytes())
            whole = httpx.post(gw + "/responses", json={"model": "m", "input": "x"}, timeout=30)
    events = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    kinds = [e["type"] for e in events]
    assert "response.completed" not in kinds
    assert kinds[-2:] == ["error", "response.failed"]
    assert events[-2]["code"] == "store_unavailable"
    assert whole.status_code == 503 and whole.json()["error"]["code"] == "store_unavailable"


def test_two_replicas_share_one_postgresql(postgres_dsn: str) -> None:
    script = UpstreamScript()
    script.body = answer("shared")
    with serve(upstream_app(script)) as up, replica(up, postgres_dsn) as (a, _), replica(up, postgres_dsn) as (b, _), client(a) as on_a, client(b) as on_b:
        made = on_a.responses.create(model="m", input="made on a")
        assert on_b.responses.retrieve(made.id).output_text == "shared"
        follow = on_b.responses.create(model="m", input="continued on b", previous_response_id=made.id)
        assert texts(script.requests[-1]["input"]) == [("user", "made on a"), ("assistant", "shared"), ("user", "continued on b")]
        conv = on_b.conversations.create()
        on_a.responses.create(model="m", input="turn on a", conversation=conv.id)
        assert len(on_b.conversations.items.list(conv.id).data) == 2
        on_b.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            on_a.responses.retrieve(made.id)
        assert on_a.responses.retrieve(follow.id).previous_response_id == made.id


def test_the_store_keeps_rows_for_its_ttl_only(store_url: str) -> None:
    async def go() -> tuple[bool, bool, int, bool, bool]:
        from respflow.sinks.store import Conversation, StoredResponse

        store = store_for(store_url)
        assert store is not None
        await store.open()
        await store.save_response("t", StoredResponse("resp_a", {"id": "resp_a"}, [], ["i"]), [{"id": "i"}], ttl=0.3)
        await store.save_response("t", StoredResponse("resp_b", {"id": "resp_b"}, [], []), [], ttl=None)
        await store.create_conversation("t", Conversation("conv_a", {}, 1), [], ttl=0.3)
        live = await store.get_response("t", "resp_a") is not None
        await asyncio.sleep(0.5)
        expired = await store.get_response("t", "resp_a") is None and await store.get_conversation("t", "conv_a") is None
        removed = await store.purge_expired()
        gone = await store.get_response("t", "resp_a") is None
        kept = await store.get_response("t", "resp_b") is not None
        await store.aclose()
        return live, expired, removed, gone, kept

    live, expired, removed, gone, kept = asyncio.run(go())
    assert live  # within its ttl
    assert expired  # past it: never returned, even before the purge
    assert removed == 3  # the response, its item, the conversation
    assert gone and kept


def test_gateway_tool_rounds_are_stored_as_seen_and_continue_upstream_as_calls() -> None:
    """A turn in which the gateway ran a tool is kept with its ``mcp_call`` item; its
    continuation sends that call upstream as the function call and output the model knows.
    ``instructions`` are not inherited."""
    from respflow.flows import GatewayTool, simulator_app

    seen: list[dict[str, Any]] = []
    simulator = simulator_app(pace=0.0)

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await simulator(scope, receive, send)
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        seen.append(json.loads(b"".join(chunks)))
        replayed = iter([{"type": "http.request", "body": b"".join(chunks), "more_body": False}])

        async def again() -> Any:
            return next(replayed, {"type": "http.disconnect"})

        return await simulator(scope, again, send)

    numbers = {"type": "object", "properties": {"numbers": {"type": "array", "items": {"type": "number"}}}, "required": ["numbers"]}
    tool = GatewayTool("add_numbers", lambda args: str(sum(args["numbers"])), "Add numbers.", numbers)
    with tempfile.TemporaryDirectory() as d, serve(recording) as up:
        gateway = Gateway(up, tools=[tool], store=store_for(f"sqlite:///{d}/s.db"))
        with serve(gateway_app(gateway)) as gw, client(gw) as c:
            first = c.responses.create(model="m", input="add_numbers 2 and 40", instructions="be brief")
            assert [i.type for i in first.output] == ["mcp_call", "message"]
            assert c.responses.retrieve(first.id).output[0].model_dump() == first.output[0].model_dump()
            assert seen[0]["instructions"] == "be brief"
            rounds_before = len(seen)
            c.responses.create(model="m", input="thanks", previous_response_id=first.id)
    upstream = seen[rounds_before]
    assert "instructions" not in upstream
    kinds = [(i.get("type"), i.get("role")) for i in upstream["input"]]
    assert kinds == [("message", "user"), ("function_call", None), ("function_call_output", None), ("message", "assistant"), ("message", "user")]
    call, output = upstream["input"][1], upstream["input"][2]
    assert call["name"] == "add_numbers" and json.loads(call["arguments"]) == {"numbers": [2, 40]}
    assert output["call_id"] == call["call_id"] and output["output"] == "42"
