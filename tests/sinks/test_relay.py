"""relay: delivery rules (upstream-behaviour.md §6, §8.1 delivery tests)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from respflow.flows import decode, live
from respflow.operators import LimitExceededError, Limits, Translation, Validation
from respflow.sinks import CollectSink, Relay, defer_order, keepalive, sse_frame
from tests._support import sse
from tests.property.strategies import valid_streams


class FlakySink(CollectSink):
    """Fails (or is cancelled) on chosen sends."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next: BaseException | None = None

    async def send(self, data: bytes) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        await super().send(data)


def evs(sink: CollectSink) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(rb"^data: (.*)$", sink.getvalue(), flags=re.M)]


def ev(kind: str, index: int | None = None, **extra: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"type": kind, **extra}
    if index is not None:
        e["output_index"] = index
    return e


def delta(index: int | None, text: str = "x") -> dict[str, Any]:
    return ev("response.output_text.delta", index, item_id=f"m{index}", content_index=0, delta=text, logprobs=[])


CREATED = ev("response.created", response={"id": "up_1", "status": "in_progress", "output": [], "model": "m", "created_at": 1})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def seeded(relay: Relay, indexes: range = range(16)) -> Relay:
    """As if the relay had sent a message item with one text part at each index (its client
    ledger), so a unit test can send the deltas it is about without their lifecycle."""
    for i in indexes:
        relay._items[i] = "message"
        relay._parts[i] = [True]
    return relay


async def started(sink: CollectSink | None = None, **kw: Any) -> tuple[Relay, CollectSink]:
    sink = sink or CollectSink()
    relay = seeded(Relay(sink, response_id="resp_gw", **kw))
    await relay.emit_upstream(Translation([], None))
    await relay.emit_upstream([CREATED])
    return relay, sink


def test_sse_frame_format_and_keepalive() -> None:
    assert sse_frame({"type": "a.b", "x": 1}) == b'event: a.b\ndata: {"type":"a.b","x":1}\n\n'
    assert sse_frame({"x": 1}) == b'data: {"x":1}\n\n'
    assert keepalive() == b": keep-alive\n\n"
    assert defer_order(None) > defer_order(10**9) > defer_order(0)


def test_created_once_with_the_gateway_id_and_upstream_terminals_withheld() -> None:
    async def go() -> list[dict[str, Any]]:
        relay, sink = await started()
        await relay.emit_upstream([CREATED, ev("response.in_progress", response={"id": "up_1"}), delta(0), ev("response.completed", response={"id": "up_1"})])
        return evs(sink)

    out = run(go())
    assert [e["type"] for e in out] == ["response.created", "response.in_progress", "response.output_text.delta"]
    assert [e["sequence_number"] for e in out] == [0, 1, 2]
    assert all(e["response"]["id"] == "resp_gw" for e in out[:2])
    assert out[1]["response"]["model"] == "m"  # in_progress completed from the created snapshot


def test_a_missing_created_is_made_before_the_first_frame() -> None:
    async def go() -> list[dict[str, Any]]:
        sink = CollectSink()
        relay = seeded(Relay(sink, response_id="resp_gw", model="pub"))
        await relay.emit_upstream([delta(0)])
        return evs(sink)

    out = run(go())
    assert [e["type"] for e in out] == ["response.created", "response.in_progress", "response.output_text.delta"]
    assert out[0]["response"]["model"] == "pub"
    for key in ("id", "object", "created_at", "model", "output", "parallel_tool_calls", "tool_choice", "tools"):
        assert key in out[0]["response"]


def test_released_frames_are_emitted_in_output_index_order() -> None:
    async def go() -> list[dict[str, Any]]:
        relay, sink = await started()
        await relay.emit_upstream(Translation([], 2))
        await relay.emit_upstream([delta(3), delta(2)])
        assert len(relay.deferred) == 2
        await relay.emit_upstream(Translation([], None))
        return evs(sink)

    assert [e.get("output_index") for e in run(go())][-2:] == [2, 3]


def test_frames_released_with_a_reads_own_frames_keep_each_items_order() -> None:
    """The read that releases the window also carries newer frames of a waiting item: the
    waiting ones go first (each item in its own order), the item that held the window before."""

    async def go() -> list[tuple[int | None, str]]:
        from respflow.operators import Frame

        relay, sink = await started()
        await relay.emit_upstream(Translation([Frame.new("x", delta(1, "a"))], 0))  # 1 waits behind 0
        assert [e["type"] for e in evs(sink)] == ["response.created"]
        read = [Frame.new("x", d) for d in (delta(0, "zero"), delta(1, "b"))]
        await relay.emit_upstream(Translation(read, None))  # 0 done: the window opens
        return [(e.get("output_index"), e.get("delta")) for e in evs(sink)[1:]]

    assert run(go()) == [(0, "zero"), (1, "a"), (1, "b")]


def test_indexless_frames_wait_for_the_defer_window_and_emit_last() -> None:
    async def go() -> list[dict[str, Any]]:
        relay, sink = await started()
        await relay.emit_upstream(Translation([], 1))
        await relay.emit_upstream([ev("response.future_event"), delta(0), delta(1)])
        first = [e.get("output_index") for e in evs(sink)[1:]]
        assert first == [0]
        await relay.emit_upstream(Translation([], None))
        return evs(sink)

    out = run(go())
    assert [(e["type"], e.get("output_index")) for e in out[2:]] == [
        ("response.output_text.delta", 1),
        ("response.future_event", None),
    ]


def test_final_deferred_delivery_emits_indexless_frames_last() -> None:
    async def go() -> list[dict[str, Any]]:
        relay, sink = await started()
        await relay.emit_upstream(Translation([], 0))
        await relay.emit_upstream([ev("response.future_event"), delta(3), delta(1)])
        await relay.drain()
        return evs(sink)[1:]

    out = run(go())
    assert [e.get("output_index") for e in out] == [1, 3, None]
    assert [e["sequence_number"] for e in out] == [1, 2, 3]


def test_drain_puts_each_indexs_tool_events_before_its_deferred_frames() -> None:
    async def go() -> list[dict[str, Any]]:
        relay, sink = await started()
        del relay._items[6], relay._parts[6]  # the tool's item is added by the drain
        relay.start_round(5)
        await relay.emit_upstream(Translation([], 1))
        await relay.emit_upstream([delta(2), delta(1)])
        tool = [ev("response.output_item.added", 6, item={"type": "web_search_call", "id": "ws_1", "status": "in_progress"})]
        await relay.drain({6: tool})
        return evs(sink)[1:]

    out = run(go())
    assert [(e["type"], e["output_index"]) for e in out] == [
        ("response.output_item.added", 6),
        ("response.output_text.delta", 6),
        ("response.output_text.delta", 7),
    ]


def test_deferred_frames_have_an_entry_limit_and_state_is_unchanged() -> None:
    async def go() -> None:
        relay, _ = await started(limits=Limits(max_deferred_entries=4))
        await relay.emit_upstream(Translation([], 0))
        await relay.emit_upstream([delta(1) for _ in range(4)])
        with pytest.raises(LimitExceededError) as info:
            await relay.emit_upstream([delta(1)])
        assert info.value.code == "deferred_entries"
        assert len(relay.deferred) == 4

    run(go())


def test_deferred_frames_have_a_shared_byte_limit() -> None:
    async def go() -> None:
        relay, _ = await started(limits=Limits(max_deferred_bytes=400))
        await relay.emit_upstream(Translation([], 0))
        await relay.emit_upstream([delta(1, "a" * 100)])
        used = relay.deferred_bytes
        with pytest.raises(LimitExceededError) as info:
            await relay.emit_upstream([delta(2, "b" * 300)])
        assert info.value.code == "deferred_bytes"
        assert relay.deferred_bytes == used

    run(go())


@pytest.mark.parametrize("failure", [asyncio.CancelledError(), ConnectionResetError("gone")])
def test_a_failed_or_cancelled_send_consumes_no_sequence_or_lifecycle(failure: BaseException) -> None:
    async def go() -> list[dict[str, Any]]:
        sink = FlakySink()
        relay = seeded(Relay(sink, response_id="resp_gw"))
        sink.fail_next = failure
        with pytest.raises(type(failure)):
            await relay.emit_upstream([CREATED])
        assert relay.sequence == 0
        await relay.emit_upstream([CREATED, delta(0)])
        return evs(sink)

    out = run(go())
    assert [(e["type"], e["sequence_number"]) for e in out] == [("response.created", 0), ("response.output_text.delta", 1)]


def test_cancelling_a_flush_keeps_the_unsent_frames_and_their_bytes() -> None:
    async def go() -> None:
        sink = FlakySink()
        relay, _ = await started(sink)
        await relay.emit_upstream(Translation([], 0))
        await relay.emit_upstream([delta(1), delta(2)])
        held, used = len(relay.deferred), relay.deferred_bytes
        sink.fail_next = asyncio.CancelledError()
        with pytest.raises(asyncio.CancelledError):
            await relay.emit_upstream(Translation([], None))
        assert (len(relay.deferred), relay.deferred_bytes) == (held, used)
        await relay.emit_upstream(Translation([], None))
        assert relay.deferred == [] and relay.deferred_bytes == 0
        assert [e.get("output_index") for e in evs(sink)][-2:] == [1, 2]

    run(go())


def test_local_and_upstream_events_share_numbering_but_not_rewriting() -> None:
    async def go() -> list[dict[str, Any]]:
        sink = CollectSink()
        relay = seeded(Relay(sink, response_id="resp_test"))
        await relay.emit_local([ev("response.created", response={"id": "local", "status": "in_progress"})])
        relay.start_round(7)
        await relay.emit_upstream([ev("response.in_progress", response={"id": "up"}), delta(1)])
        await relay.emit_local([delta(7)])
        return evs(sink)

    out = run(go())
    assert out[0]["response"]["id"] == "local"
    assert out[1]["response"]["id"] == "resp_test"
    assert [e.get("output_index") for e in out[2:]] == [8, 7]
    assert [e["sequence_number"] for e in out] == [0, 1, 2, 3]


def test_rounds_share_lifecycle_and_numbering_while_items_start_fresh() -> None:
    async def go() -> list[dict[str, Any]]:
        sink = CollectSink()
        relay = seeded(Relay(sink, response_id="resp_gw"))
        for offset in (0, 1):
            relay.start_round(offset)
            await relay.emit_upstream([CREATED, ev("response.in_progress", response={"id": "up"}), ev("response.output_item.done", 0, item={"type": "message", "id": f"m{offset}", "role": "assistant", "status": "completed", "content": []}), ev("response.completed", response={"id": "up"})])
            await relay.drain()
        return evs(sink)

    out = run(go())
    assert [(e["type"], e.get("output_index"), e["sequence_number"]) for e in out] == [
        ("response.created", None, 0),
        ("response.in_progress", None, 1),
        ("response.output_item.done", 0, 2),
        ("response.output_item.done", 1, 3),
    ]


def test_an_oversized_event_fails_before_it_is_sent() -> None:
    async def go() -> None:
        relay, sink = await started(limits=Limits(max_event_bytes=1000))
        before = len(sink.getvalue())
        with pytest.raises(LimitExceededError) as info:
            await relay.emit_upstream([delta(0, "z" * 1000)])
        assert info.value.code == "event_bytes"
        assert len(sink.getvalue()) == before
        assert relay.sequence == 1

    run(go())


def test_error_frame_after_the_frames_before_it() -> None:
    from respflow.operators import ProtocolError

    added = ev("response.output_item.added", 0, item={"type": "message", "id": "m0", "role": "assistant", "status": "in_progress", "content": []})
    body = sse(CREATED, {"type": "response.in_progress", "response": {"id": "up_1", "status": "in_progress"}}, added, delta(0), "{", delta(0))
    sink = CollectSink()
    with pytest.raises(ProtocolError) as info:
        asyncio.run(live([body], sink, placement="inline", validation=Validation.STRICT))
    out = evs(sink)
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",  # the delta's part, opened for the client (none was sent)
        "response.output_text.delta",
        "error",
        "response.failed",
    ]
    error, failed = out[-2], out[-1]
    assert error["code"] == info.value.code == "malformed_frame"
    assert error["error"]["message"] == error["message"]
    # the terminal carries the same error, and what the response held so far
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": error["message"], "type": "malformed_frame"}
    assert failed["response"]["output"][0]["content"][0]["text"] == "x"
    assert [e["sequence_number"] for e in out] == list(range(7))


@settings(max_examples=60, deadline=None)
@given(stream=valid_streams())
def test_relaying_then_folding_gives_the_same_response(stream: list[dict[str, Any]]) -> None:
    body = sse(*stream)
    original = decode(body, validation=Validation.LENIENT, response_id="resp_gw").to_dict()
    sink = CollectSink()
    asyncio.run(live([body], sink, placement="inline", response_id="resp_gw"))
    refolded = decode(sink.getvalue(), validation=Validation.STRICT, response_id="resp_gw").to_dict()
    assert refolded["output"] == original["output"]
    assert refolded["status"] == original["status"]


@settings(max_examples=60, deadline=None)
@given(stream=valid_streams(call_name="raw_echo", custom=True))
def test_relaying_custom_tool_calls_then_folding_gives_the_same_response(stream: list[dict[str, Any]]) -> None:
    from respflow.operators import ToolRegistry

    tools = [{"type": "custom", "name": "raw_echo"}]
    body = sse(*stream)
    original = decode(body, validation=Validation.LENIENT, response_id="resp_gw", tools=ToolRegistry(tools)).to_dict()
    sink = CollectSink()
    asyncio.run(live([body], sink, placement="inline", response_id="resp_gw", tools=ToolRegistry(tools)))
    refolded = decode(sink.getvalue(), validation=Validation.STRICT, response_id="resp_gw").to_dict()
    assert refolded["output"] == original["output"]
    assert all(item["type"] in ("message", "custom_tool_call") for item in refolded["output"])


def test_the_client_ledger_repairs_or_drops_what_a_strict_client_could_not_take() -> None:
    msg = {"type": "message", "id": "m0", "role": "assistant", "status": "in_progress", "content": []}

    async def go() -> tuple[list[dict[str, Any]], int]:
        sink = CollectSink()
        relay = Relay(sink, response_id="resp_gw")
        await relay.emit_upstream([CREATED])
        await relay.emit_upstream(
            [
                ev("response.output_item.added", 0, item=msg),
                ev("response.output_item.added", 0, item=msg),  # a repeat: dropped
                delta(0, "a"),  # part 0 was never added: opened for the client first
                ev("response.content_part.added", 0, item_id="m0", content_index=0, part={"type": "output_text", "text": ""}),  # dropped: opened
                ev("response.content_part.added", 0, item_id="m0", content_index=1, part={"type": "refusal", "refusal": ""}),
                ev("response.output_text.delta", 0, item_id="m0", content_index=1, delta="b", logprobs=[]),  # not a text part: dropped
                ev("response.function_call_arguments.delta", 0, item_id="m0", delta="{"),  # not a call: dropped
                delta(3, "c"),  # no item at 3: dropped
            ]
        )
        return evs(sink)[1:], relay.dropped_contract

    out, dropped = run(go())
    assert [(e["type"], e.get("content_index")) for e in out] == [
        ("response.output_item.added", None),
        ("response.content_part.added", 0),
        ("response.output_text.delta", 0),
        ("response.content_part.added", 1),
    ]
    assert out[1]["part"]["type"] == "output_text"
    assert dropped == 5
    TypeAdapter(ResponseStreamEvent).validate_python(out[1])


@pytest.mark.parametrize("policy", ["forward", "drop"])
def test_unknown_event_types_are_forwarded_or_dropped_and_malformed_names_always_dropped(policy: str) -> None:
    async def go() -> tuple[list[str], Relay]:
        sink = CollectSink()
        relay = seeded(Relay(sink, response_id="resp_gw", unknown_events=policy))
        await relay.emit_upstream([CREATED])
        await relay.emit_upstream([ev("response.something_new", 0, x=1), ev("Not A Type!", 0), delta(0)])
        return [e["type"] for e in evs(sink)], relay

    kinds, relay = run(go())
    if policy == "forward":
        assert kinds[1:] == ["response.something_new", "response.output_text.delta"]
        assert relay.dropped_unknown == 0
    else:
        assert kinds[1:] == ["response.output_text.delta"]
        assert relay.dropped_unknown == 1
    assert relay.dropped_malformed == 1
