"""fold: per-kind folding, terminal metadata, EOF policy, final ordering."""

from __future__ import annotations

from typing import Any

import pytest

from respflow.operators import LimitExceededError, Limits, Validation
from tests._support import (
    added,
    args_delta,
    args_done,
    completed,
    created,
    done,
    fcall,
    in_progress,
    message,
    run,
    terminal,
    text_delta,
)

LENIENT = Validation.LENIENT


def test_done_item_is_authoritative_when_deltas_are_missing() -> None:
    _, response = run(created(), in_progress(), added(message()), done(message(text="4", status="completed")), completed())
    assert response.to_dict()["output"][0]["content"][0]["text"] == "4"


@pytest.mark.parametrize("kind", ["completed", "failed", "incomplete"])
def test_terminal_metadata_is_kept_from_every_terminal_type(kind: str) -> None:
    """RFC bug 3: a non-null error on response.completed used to be lost."""
    meta: dict[str, Any] = {
        "error": {"code": "server_error", "message": "boom"},
        "incomplete_details": {"reason": "max_output_tokens"},
        "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
    }
    for policy in (Validation.STRICT, LENIENT):
        _, response = run(created(), in_progress(), terminal(kind, **meta), validation=policy)
        d = response.to_dict()
        assert d["status"] == kind
        assert d["error"] == meta["error"]
        assert d["incomplete_details"] == meta["incomplete_details"]
        assert {k: d["usage"][k] for k in meta["usage"]} == meta["usage"]
        assert d["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}


def test_lenient_eof_folds_active_items_and_ends_failed() -> None:
    """A stream cut without a terminal event is not reported completed: what arrived is kept,
    the open item is marked incomplete, the Response is failed with a server_error."""
    _, response = run(created(), in_progress(), added(fcall()), args_delta('{"value"'), args_delta(":1}"), validation=LENIENT)
    d = response.to_dict()
    assert d["status"] == "failed"
    assert d["error"] == {"code": "server_error", "message": "the upstream ended the stream without a terminal event"}
    assert d["output"][0]["arguments"] == '{"value":1}'
    assert d["output"][0]["status"] == "incomplete"
    assert isinstance(d["created_at"], int)


def test_lenient_eof_after_an_upstream_error_event_carries_its_message() -> None:
    error = {"type": "error", "code": "context_length_exceeded", "message": "the prompt is too long", "param": None}
    frames, response = run(created(), in_progress(), added(message()), text_delta("Hi"), error, validation=LENIENT)
    d = response.to_dict()
    assert frames[-1]["type"] == "error"  # the upstream's error event is relayed too
    assert d["status"] == "failed"
    assert d["error"] == {"code": "server_error", "message": "the prompt is too long", "type": "context_length_exceeded"}
    assert d["output"][0]["status"] == "incomplete"
    assert d["output"][0]["content"][0]["text"] == "Hi"


def test_lenient_eof_with_only_done_items_keeps_them_completed() -> None:
    item = dict(fcall(), arguments="{}", status="completed")
    _, response = run(created(), in_progress(), added(fcall()), args_delta("{}"), done(item), validation=LENIENT)
    d = response.to_dict()
    assert d["status"] == "failed"
    assert d["output"][0]["status"] == "completed"  # its done arrived: it is whole


def test_a_completed_stream_keeps_completed() -> None:
    _, response = run(created(), in_progress(), added(message()), text_delta("Hi"), validation=LENIENT)
    assert response.status == "failed"
    _, whole = run(created(), in_progress(), added(message()), text_delta("Hi"), completed(), validation=LENIENT)
    assert whole.status == "completed"
    assert whole.to_dict()["output"][0]["status"] == "completed"


def test_lenient_eof_folds_a_half_streamed_message() -> None:
    _, response = run(created(), in_progress(), added(message()), text_delta("Hel"), text_delta("lo"), validation=LENIENT)
    assert response.to_dict()["output"][0]["content"] == [{"type": "output_text", "text": "Hello", "annotations": []}]


def test_unfinished_web_search_is_dropped() -> None:
    ws = {"type": "web_search_call", "id": "ws_1", "status": "in_progress"}
    _, response = run(created(), in_progress(), added(ws), added(message("msg_2"), 1), text_delta("x", "msg_2", 1), validation=LENIENT)
    assert [o.type for o in response.output] == ["message"]


def test_arguments_done_fills_when_deltas_missing() -> None:
    _, response = run(created(), in_progress(), added(fcall()), args_done('{"a":1}'), validation=LENIENT)
    assert response.to_dict()["output"][0]["arguments"] == '{"a":1}'


def test_done_with_empty_fields_falls_back_to_streamed_values() -> None:
    sparse = {"type": "function_call", "id": "", "call_id": "", "name": "", "arguments": "", "status": "completed"}
    _, response = run(created(), in_progress(), added(fcall()), args_delta("{}"), done(sparse), completed(), validation=LENIENT)
    out = response.to_dict()["output"][0]
    assert (out["id"], out["call_id"], out["name"], out["arguments"]) == ("fc_1", "call_1", "get_weather", "{}")


def test_reasoning_text_is_folded_from_deltas_and_done() -> None:
    rs = {"type": "reasoning", "id": "rs_1", "summary": []}
    events = [
        created(), in_progress(), added(rs),
        {"type": "response.reasoning_text.delta", "item_id": "rs_1", "output_index": 0, "content_index": 0, "delta": "think"},
        {"type": "response.reasoning_text.delta", "item_id": "rs_1", "output_index": 0, "content_index": 0, "delta": "ing"},
    ]
    _, response = run(*events, validation=LENIENT)
    assert response.to_dict()["output"][0]["content"] == [{"type": "reasoning_text", "text": "thinking"}]
    done_item = {"type": "reasoning", "id": "rs_1", "summary": []}  # no content key: keep ours
    _, response = run(*events, done(done_item), completed(), validation=LENIENT)
    assert response.to_dict()["output"][0]["content"] == [{"type": "reasoning_text", "text": "thinking"}]


def test_empty_item_id_gets_a_generated_id_used_in_stream_and_response() -> None:
    frames, response = run(created(), in_progress(), added(fcall("", "c1")), args_delta("{}", item_id=""), validation=LENIENT)
    generated = frames[2]["item"]["id"]
    assert generated.startswith("fc_")
    assert frames[3]["item_id"] == generated
    assert response.output[0].id == generated


def test_final_id_and_model_come_from_the_request_when_given() -> None:
    _, response = run(created(model="upstream-model"), in_progress(), completed(), response_id="resp_gw", model="public-model")
    assert (response.id, response.model) == ("resp_gw", "public-model")
    _, response = run(created(model="upstream-model"), in_progress(), completed())
    assert (response.id, response.model) == ("resp_1", "upstream-model")


def test_retained_bytes_are_bounded() -> None:
    with pytest.raises(LimitExceededError) as info:
        run(created(), in_progress(), added(message()), *[text_delta("x" * 100) for _ in range(20)], limits=Limits(max_retained_bytes=1000), validation=LENIENT)
    assert info.value.code == "retained_bytes"


@pytest.mark.parametrize(
    ("events", "where", "index"),
    [
        ([created(model=5), in_progress()], "model", None),
    ],
)
def test_fields_the_response_cannot_hold_are_a_typed_error(events: list[dict[str, Any]], where: str, index: int | None) -> None:
    from respflow.operators import ProtocolError

    with pytest.raises(ProtocolError) as info:
        run(*events, validation=LENIENT)
    assert (info.value.code, info.value.output_index) == ("invalid_response", index)
    assert where in str(info.value)


def test_ids_of_the_wrong_type_are_repaired_not_errors() -> None:
    """An id or call_id a client cannot take: a number becomes its string, anything else a
    made-up id (as for an empty one) — the added event and the Response agree."""
    frames, response = run(created(), in_progress(), added(fcall(call_id=7)), added({"type": "future_kind", "id": [None]}, 1), validation=LENIENT)  # type: ignore[arg-type]
    out = response.to_dict()["output"]
    assert out[0]["call_id"] == "7" == frames[2]["item"]["call_id"]
    assert isinstance(out[1]["id"], str) and out[1]["id"] == frames[3]["item"]["id"]


def test_invalid_response_names_the_output_index_of_the_bad_item() -> None:
    """Items are completed for clients (see test_ids_of_the_wrong_type_are_repaired_not_errors),
    so an item field the Response cannot hold is a last resort: the error names the item's
    output_index, not its position in the output (an item before it may have been dropped)."""
    from pydantic import ValidationError

    from respflow.operators import Response
    from respflow.operators._fold import unstorable

    body = {"id": "r", "created_at": 1, "model": "m", "status": "completed", "output": [dict(message(), content=[]), dict(message("m2"), content=[], role=5)]}
    with pytest.raises(ValidationError) as raised:
        Response.model_validate(body)
    error = unstorable(raised.value, [0, 4])  # output[1] is the item at output_index 4
    assert (error.code, error.output_index) == ("invalid_response", 4)
    assert "output.1" in error.message
