"""validate: the strict rule table and the lenient recoveries (upstream-behaviour.md §3, §8)."""

from __future__ import annotations

from typing import Any

import pytest

from respflow.operators import ProtocolError, Validation
from tests._support import (
    added,
    args_delta,
    args_done,
    completed,
    created,
    done,
    fcall,
    function_stream,
    in_progress,
    message,
    run,
    terminal,
    text_delta,
    text_stream,
)

STRICT = Validation.STRICT
LENIENT = Validation.LENIENT


def strict_error(*events: dict[str, Any] | str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        run(*events, validation=STRICT)
    return info.value


# ---- a_turn_that_cannot_be_stored_is_refused: the 13 strict cases -----------------------------

FN_ADDED = added(fcall())
STRICT_TABLE: list[tuple[str, list[dict[str, Any] | str], str]] = [
    ("bare delta with no lifecycle", [text_delta("x")], "lifecycle_order"),
    ("not-json then completed", ["not-json", completed()], "malformed_frame"),
    ("completed without a response", [{"type": "response.completed"}], "missing_field"),
    ("completed without created/in_progress", [completed()], "lifecycle_order"),
    ("created twice", [created(), created()], "lifecycle_order"),
    ("terminal with a different id", [created(), in_progress(), completed("resp_other")], "response_id_changed"),
    ("delta with no added", [created(), in_progress(), text_delta("x"), completed()], "no_active_item"),
    ("terminal lists an item never streamed", [created(), in_progress(), completed(output=[message(status="completed")])], "terminal_output_mismatch"),
    ("text delta missing delta", [created(), in_progress(), added(message()), {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0}], "missing_field"),
    ("function delta missing item_id", [created(), in_progress(), FN_ADDED, {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{"}], "missing_field"),
    ("function delta aimed at a message", [created(), in_progress(), added(message()), args_delta("{", item_id="msg_1")], "identity_mismatch"),
    ("re-adding index 0 after its done", [created(), in_progress(), added(message()), done(message(status="completed")), added(message("msg_2"))], "repeated_item"),
    ("unsupported item type", [created(), in_progress(), added({"type": "future_tool_call", "id": "ftc_1"})], "unknown_item_type"),
    # created but never in_progress: item events and every terminal are out of order
    ("an item added after created, before in_progress", [created(), added(message())], "lifecycle_order"),
    ("an item done after created, before in_progress", [created(), done(message(status="completed"))], "lifecycle_order"),
    ("completed after created, before in_progress", [created(), completed()], "lifecycle_order"),
    ("failed after created, before in_progress", [created(), {"type": "response.failed", "response": {"id": "resp_1", "status": "failed", "error": {"code": "server_error", "message": "x"}}}], "lifecycle_order"),
    ("incomplete after created, before in_progress", [created(), {"type": "response.incomplete", "response": {"id": "resp_1", "status": "incomplete"}}], "lifecycle_order"),
]


@pytest.mark.parametrize(("case", "events", "code"), STRICT_TABLE, ids=[c[0] for c in STRICT_TABLE])
def test_strict_refuses_a_turn_that_cannot_be_stored(case: str, events: list[Any], code: str) -> None:
    error = strict_error(*events)
    assert error.code == code
    assert error.stage in ("validate", "normalize")
    assert error.line is not None and error.line >= 1


def test_strict_error_reports_the_line_of_the_offending_event() -> None:
    error = strict_error(created(), in_progress(), text_delta("x"), completed())
    assert error.line == 5  # each event is "data: …" + blank line


def test_strict_accepts_canonical_streams() -> None:
    frames, response = run(*text_stream())
    assert len(frames) == 10
    assert response.status == "completed"
    frames, response = run(*function_stream())
    assert response.to_dict()["output"][0]["arguments"] == '{"city":"Paris"}'


# ---- identity rules (both policies) ---------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 1.5, 1.0, "0", True, None, 2**32])
@pytest.mark.parametrize("policy", [STRICT, LENIENT])
def test_invalid_output_indexes_are_rejected_under_both_policies(bad: Any, policy: Validation) -> None:
    event = {"type": "response.output_item.added", "item": message(), "output_index": bad}
    with pytest.raises(ProtocolError) as info:
        run(created(), in_progress(), event, validation=policy)
    assert info.value.code == "invalid_output_index"


@pytest.mark.parametrize("policy", [STRICT, LENIENT])
def test_a_bound_id_cannot_change_even_when_the_index_matches(policy: Validation) -> None:
    with pytest.raises(ProtocolError) as info:
        run(created(), in_progress(), added(message()), text_delta("x", item_id="msg_other"), validation=policy)
    assert info.value.code == "identity_mismatch"


@pytest.mark.parametrize("policy", [STRICT, LENIENT])
def test_an_id_bound_to_another_index_is_a_mismatch(policy: Validation) -> None:
    with pytest.raises(ProtocolError) as info:
        run(created(), in_progress(), added(message()), added(message("msg_2"), 1), text_delta("x", item_id="msg_2", index=0), validation=policy)
    assert info.value.code == "identity_mismatch"


def test_strict_items_require_both_index_and_id() -> None:
    assert strict_error(created(), in_progress(), added(message(), index=None)).code == "identity_required"
    assert strict_error(created(), in_progress(), added({"type": "message", "role": "assistant", "content": []})).code == "identity_required"


@pytest.mark.parametrize("policy", [STRICT, LENIENT])
def test_active_and_completed_indexes_cannot_be_reused(policy: Validation) -> None:
    for events in (
        [added(message()), added(message("msg_2"))],
        [added(message()), done(message(status="completed")), added(message("msg_2"))],
    ):
        with pytest.raises(ProtocolError) as info:
            run(created(), in_progress(), *events, validation=policy)
        assert info.value.code == "repeated_item"


def test_late_bound_id_recovers_subsequent_missing_indexes() -> None:
    anon = {"type": "message", "id": "", "role": "assistant", "status": "in_progress", "content": []}
    frames, response = run(
        created(), in_progress(), added(anon), text_delta("a", item_id="msg_late"), text_delta("b", item_id="msg_late", index=None), completed(),
        validation=LENIENT,
    )
    assert frames[-2]["output_index"] == 0  # recovered, written into the frame
    assert response.to_dict()["output"][0]["content"][0]["text"] == "ab"


def test_recovered_indexes_skip_occupied_indexes() -> None:
    frames, response = run(
        created(), in_progress(),
        added(fcall("fc_zero", "c0"), 0),
        added(fcall("fc_max", "cm"), 2**32 - 1),
        added(fcall("fc_one", "c1"), None),
        added(fcall("fc_two", "c2"), None),
        completed(),
        validation=LENIENT,
    )
    assert [f["output_index"] for f in frames if f["type"] == "response.output_item.added"] == [0, 2**32 - 1, 1, 2]
    assert [o["id"] for o in response.to_dict()["output"]] == ["fc_zero", "fc_one", "fc_two", "fc_max"]


def test_ambiguous_missing_index_does_not_guess() -> None:
    anon = fcall("", "")
    with pytest.raises(ProtocolError) as info:
        run(created(), in_progress(), added(anon, 0), args_delta("{", item_id="fc_9", index=None), validation=LENIENT)
    assert info.value.code == "ambiguous_identity"
    with pytest.raises(ProtocolError) as info:
        run(created(), in_progress(), added(fcall(), 0), args_delta("{", item_id="", index=None), validation=LENIENT)
    assert info.value.code == "ambiguous_identity"


def test_generated_public_ids_are_not_lookup_keys() -> None:
    frames, _ = run(created(), in_progress(), added(fcall("", "c1"), 0), validation=LENIENT)
    generated = frames[-1]["item"]["id"]
    assert generated.startswith("fc_")
    with pytest.raises(ProtocolError) as info:
        run(created(), in_progress(), added(fcall("", "c1"), 0), args_delta("{", item_id=generated, index=None), validation=LENIENT)
    assert info.value.code == "ambiguous_identity"


# ---- lenient recoveries ----------------------------------------------------------------------


def test_lenient_ignores_orphan_late_and_wrong_kind_deltas_without_emitting_them() -> None:
    frames, response = run(
        created(), in_progress(),
        text_delta("orphan", index=3, item_id="msg_3"),
        added(message()),
        args_delta("{", item_id="msg_1"),  # wrong kind
        text_delta("kept"),
        done(message(text="kept", status="completed")),
        text_delta("late"),
        completed(),
        validation=LENIENT,
    )
    deltas = [f.get("delta") for f in frames if f["type"].endswith(".delta")]
    assert deltas == ["kept"]
    assert response.to_dict()["output"][0]["content"][0]["text"] == "kept"


def test_completed_items_reject_late_events_strictly() -> None:
    error = strict_error(created(), in_progress(), added(message()), done(message(text="x", status="completed")), text_delta("late"))
    assert error.code == "no_active_item"


def test_duplicate_done_regression_one_item_not_two() -> None:
    """The RFC's bug: a repeated output_item.done gave two items on the lenient path."""
    item = fcall(arguments='{"a":1}', status="completed")
    frames, response = run(
        created(), in_progress(), added(fcall()), args_delta('{"a":1}'), done(item), done(item), completed(),
        validation=LENIENT,
    )
    assert [f["type"] for f in frames].count("response.output_item.done") == 1
    assert len(response.output) == 1


def test_repeat_with_empty_fields_falls_back_and_is_identical() -> None:
    item = fcall(arguments='{"a":1}', status="completed")
    sparse = {"type": "function_call", "id": "fc_1", "call_id": "", "name": "", "arguments": "", "status": "completed"}
    frames, response = run(created(), in_progress(), added(fcall()), done(item), done(sparse), completed(), validation=LENIENT)
    assert [f["type"] for f in frames].count("response.output_item.done") == 1
    assert response.to_dict()["output"][0]["arguments"] == '{"a":1}'


def test_conflicting_repeat_is_rejected_by_lenient_and_any_repeat_by_strict() -> None:
    item = fcall(arguments='{"a":1}', status="completed")
    with pytest.raises(ProtocolError) as info:
        run(created(), in_progress(), added(fcall()), done(item), done(fcall(arguments='{"a":2}', status="completed")), validation=LENIENT)
    assert info.value.code == "conflicting_repeat"
    assert info.value.output_index == 0
    assert strict_error(created(), in_progress(), added(fcall()), done(item), done(item)).code == "no_active_item"


def test_done_only_items_allocate_indexes() -> None:
    frames, response = run(
        created(), in_progress(), done(fcall("fc_a", "ca", arguments="{}", status="completed"), None),
        done(fcall("fc_b", "cb", arguments="{}", status="in_progress"), None), completed(),
        validation=LENIENT,
    )
    assert [f["output_index"] for f in frames if f["type"] == "response.output_item.done"] == [0, 1]
    out = response.to_dict()["output"]
    assert [o["id"] for o in out] == ["fc_a", "fc_b"]
    assert out[1]["status"] == "in_progress"  # the provider's status is preserved


@pytest.mark.parametrize("payload", ["{", "null", "[]", '{"type":3}'])
def test_malformed_data_is_rejected_strictly_and_skipped_leniently(payload: str) -> None:
    assert strict_error(created(), in_progress(), payload).code == "malformed_frame"
    frames, response = run(*text_stream()[:-1], payload, text_stream()[-1], validation=LENIENT)
    assert len(frames) == 10
    assert response.status == "completed"


def test_invalid_utf8_is_rejected_strictly_and_skipped_leniently() -> None:
    from respflow.flows import decode
    from tests._support import sse

    bad = b'data: {"type":"\xff"}\n\n'
    with pytest.raises(ProtocolError) as info:
        decode(bad, validation=STRICT)
    assert (info.value.code, info.value.line) == ("invalid_utf8", 1)
    body = sse(*text_stream()[:3]) + bad + sse(*text_stream()[3:])
    response = decode(body, validation=LENIENT)
    assert response.to_dict()["output"][0]["content"][0]["text"] == "Hello world"


def test_non_data_lines_do_not_satisfy_strict_finalization() -> None:
    error = strict_error(created(), in_progress())
    assert error.code == "eof_without_terminal"


def test_strict_terminal_requires_all_slots_done_and_keeps_index_order() -> None:
    m0, m1 = message("msg_a"), message("msg_b")
    error = strict_error(created(), in_progress(), added(m1, 1), added(m0, 0), done(message("msg_b", "b", "completed"), 1), completed())
    assert error.code == "unfinished_items"
    _, response = run(
        created(), in_progress(), added(m1, 1), added(m0, 0),
        done(message("msg_b", "b", "completed"), 1), done(message("msg_a", "a", "completed"), 0), completed(),
    )
    assert [o.id for o in response.output] == ["msg_a", "msg_b"]


def test_terminal_output_repeating_an_item_is_refused() -> None:
    m = message("msg_1", "x", "completed")
    error = strict_error(
        created(), in_progress(), added(message()), done(m), added(message("msg_2"), 1), done(message("msg_2", "y", "completed"), 1),
        completed(output=[m, m]),
    )
    assert error.code == "terminal_repeats_item"


def test_call_id_must_be_stable_except_on_failed() -> None:
    base = [created(), in_progress(), added(fcall(call_id="call_a")), done(fcall(call_id="call_b", arguments="{}", status="completed"))]
    error = strict_error(*base, completed())
    assert error.code == "call_id_changed"
    assert "call_a" not in error.message and "call_b" not in error.message
    _, response = run(*base, terminal("failed", error={"code": "server_error", "message": "boom"}))
    assert response.status == "failed"


def test_call_id_may_first_appear_in_done() -> None:
    _, response = run(created(), in_progress(), added(fcall(call_id="")), done(fcall(call_id="call_z", arguments="{}", status="completed")), completed())
    assert response.to_dict()["output"][0]["call_id"] == "call_z"


def test_argument_event_cannot_change_call_id() -> None:
    error = strict_error(created(), in_progress(), added(fcall()), args_done("{}", call_id="call_other"), done(fcall(arguments="{}", status="completed")), completed())
    assert error.code == "call_id_changed"


def test_strict_done_item_needs_a_call_id() -> None:
    error = strict_error(created(), in_progress(), added(fcall()), done(fcall(call_id="", arguments="{}", status="completed")))
    assert error.code == "invalid_item"


def test_strict_rejects_events_after_the_terminal_lenient_ignores_them() -> None:
    events = [*text_stream(), {"type": "keepalive"}]
    assert strict_error(*events).code == "event_after_terminal"
    frames, _ = run(*events, validation=LENIENT)
    assert frames[-1]["type"] == "response.completed"


def test_status_must_match_the_lifecycle_event() -> None:
    bad = {"type": "response.in_progress", "response": {"id": "resp_1", "status": "queued"}}
    assert strict_error(created(), bad).code == "status_mismatch"


def test_lenient_counts_what_it_skipped_and_ignored() -> None:
    from respflow.operators import AgentPipeline
    from tests._support import lines

    pipeline = AgentPipeline(validation=LENIENT)
    for line in lines(created(), "{", in_progress(), text_delta("orphan"), completed()):
        pipeline.push(line)
    assert pipeline.validator.skipped == 1
    assert pipeline.validator.ignored == 1


@pytest.mark.parametrize("kind", [[1], {"a": 1}, 3, None])
def test_an_item_type_that_is_not_a_string_is_a_typed_error_or_skipped(kind: Any) -> None:
    item = {"type": kind, "id": "x_1"}
    assert strict_error(created(), in_progress(), added(item)).code in ("unknown_item_type", "missing_field")
    frames, response = run(created(), in_progress(), added(item), done(item), completed(), validation=LENIENT)
    assert response.status == "completed"
    assert [f["type"] for f in frames] == ["response.created", "response.in_progress", "response.completed"]


ILL_TYPED: list[tuple[str, dict[str, Any]]] = [
    ("delta", {"delta": 5}),
    ("delta", {"delta": None}),
    ("content_index", {"content_index": "0"}),
    ("content_index", {"content_index": -1}),
    ("content_index", {"content_index": True}),
    ("content_index", {"content_index": 1 << 32}),
]


@pytest.mark.parametrize(("field", "change"), ILL_TYPED, ids=[f"{f}={c[f]!r}" for f, c in ILL_TYPED])
def test_a_sub_event_field_of_the_wrong_type_is_refused_strictly_and_ignored_leniently(field: str, change: dict[str, Any]) -> None:
    bad = {**text_delta("x"), **change}
    stream = text_stream(["Hello", " world"])
    stream.insert(5, bad)  # after the first delta: the slot is bound and active
    error = strict_error(*stream)
    assert (error.code, field in str(error)) == ("missing_field", True)
    frames, response = run(*stream, validation=LENIENT)
    assert [f.get("delta") for f in frames if f["type"].endswith(".delta")] == ["Hello", " world"]
    assert response.to_dict()["output"][0]["content"][0]["text"] == "Hello world"


def test_done_text_and_parts_of_the_wrong_type_are_ignored_leniently() -> None:
    stream = text_stream(["Hi"])
    wrong_text = {"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "text": 7}
    wrong_part = {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0, "content_index": 1, "part": "p"}
    assert strict_error(*stream[:5], wrong_text).code == "missing_field"
    frames, response = run(*stream[:5], wrong_text, wrong_part, *stream[5:], validation=LENIENT)
    assert wrong_text not in frames and wrong_part not in frames
    assert response.to_dict()["output"][0]["content"] == [{"type": "output_text", "text": "Hi", "annotations": []}]


def test_a_sub_event_that_names_no_item_gets_its_items_id() -> None:
    nameless = {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "hi"}
    frames, response = run(created(), in_progress(), added(message()), nameless, nameless | {"delta": "!"}, validation=LENIENT)
    assert [(f["item_id"], f["delta"]) for f in frames if f["type"].endswith(".delta")] == [("msg_1", "hi"), ("msg_1", "!")]
    assert response.to_dict()["output"][0]["content"][0]["text"] == "hi!"
