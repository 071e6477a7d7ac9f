"""normalize: one parse per payload, the catalogue, vLLM renames."""

from __future__ import annotations

from respflow.operators import Action, Normalizer


def norm(data: str):  # type: ignore[no-untyped-def]
    return Normalizer().normalize((data.encode(), 7))


def test_known_event_gets_its_spec() -> None:
    f = norm('{"type":"response.output_text.delta","output_index":0,"item_id":"m","delta":"x"}')
    assert f.type == "response.output_text.delta"
    assert f.spec.action is Action.MUTATE
    assert f.spec.kinds == {"message"}
    assert f.output_index == 0
    assert f.line == 7


def test_vllm_response_done_is_completed_in_frame_and_wire() -> None:
    f = norm('{"type":"response.done","response":{"id":"r","status":"completed"}}')
    assert f.type == f.data["type"] == "response.completed"
    assert f.spec.action is Action.TERMINAL


def test_completed_with_status_incomplete_becomes_incomplete() -> None:
    f = norm('{"type":"response.completed","response":{"id":"r","status":"incomplete"}}')
    assert f.type == f.data["type"] == "response.incomplete"


def test_vllm_reasoning_part_names_become_content_part() -> None:
    f = norm('{"type":"response.reasoning_part.added","output_index":0,"item_id":"r","content_index":0,"part":{"type":"reasoning_text","text":""}}')
    assert f.type == f.data["type"] == "response.content_part.added"
    assert "reasoning" in f.spec.kinds


def test_unknown_types_pass_as_other() -> None:
    f = norm('{"type":"response.future_event","x":1}')
    assert f.spec.action is Action.OTHER
    assert not f.malformed
    assert f.data == {"type": "response.future_event", "x": 1}


def test_error_event_is_other_not_terminal() -> None:
    assert norm('{"type":"error","message":"boom"}').spec.action is Action.OTHER


def test_malformed_payloads_are_flagged_not_raised() -> None:
    for bad in ("{", "null", "[]", "3", '{"type":3}', '{"type":[1]}', '{"type":{"a":1}}', '{"type":null}'):
        assert norm(bad).malformed or (bad == '{"type":null}' and norm(bad).type == "")
    assert norm("{").malformed == "json"
    assert Normalizer().normalize((b'{"type":"\xff"}', 1)).malformed == "utf8"


def test_renamed_vllm_events_get_the_same_checks() -> None:
    import pytest

    from respflow.operators import ProtocolError

    with pytest.raises(ProtocolError) as info:
        norm('{"type":"response.reasoning_part.added","output_index":-1,"item_id":"r","content_index":0,"part":{}}')
    assert info.value.code == "invalid_output_index"
    f = norm('{"type":"response.done","response":{"id":"r","status":"incomplete"}}')
    assert f.type == f.data["type"] == "response.incomplete"


def test_every_shape_is_classified_the_same_on_and_off_the_fast_path() -> None:
    # an output_index puts an event on the fast path; the result must not depend on it
    f = norm('{"type":"response.completed","output_index":0,"response":{"id":"r","status":"incomplete"}}')
    assert f.type == f.data["type"] == "response.incomplete"
    f = norm('{"type":"response.reasoning_part.added","output_index":0,"item_id":"r","part":{}}')
    assert f.type == "response.content_part.added"
    for payload in ('{"type":["x"],"output_index":0}', '{"type":7,"output_index":0}', '["type"]', '"type"'):
        assert norm(payload).malformed == "json"
    f = norm('{"type":"vendor.thing","output_index":0}')
    assert (f.type, f.spec.action, f.malformed) == ("vendor.thing", Action.OTHER, None)
    f = norm('{"output_index":0,"delta":"x"}')
    assert (f.type, f.spec.action, f.malformed) == ("", Action.OTHER, None)


def test_frames_from_the_fast_path_behave_like_any_frame() -> None:
    import copy
    import pickle

    from respflow.operators import Frame

    f = norm('{"type":"response.output_text.delta","output_index":0,"item_id":"m","delta":"x"}')
    assert isinstance(f, Frame) and f.malformed is None
    for twin in (copy.copy(f), copy.deepcopy(f), pickle.loads(pickle.dumps(f))):
        assert (twin.type, twin.data, twin.spec, twin.line, twin.malformed) == (f.type, f.data, f.spec, f.line, None)
