"""The fields every client-bound event must carry: ONE table (`EventSpec.fields`, from the
protocol catalogue), checked here against the official client's own event models, and enforced
for every catalogued type — strict refuses a sub-event that lacks one (``missing_field``),
lenient ignores it and counts it."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from openai.types.responses import ResponseStreamEvent

from respflow.operators import AgentPipeline, LineSplitter, ProtocolError, Validation
from respflow.operators._frames import CATALOGUE, INT, OBJECT, STR, Action, EventSpec
from tests._support import sse

IDENTITY = {"type", "sequence_number", "output_index", "item_id", "logprobs"}
"""Fields not in the table: the type and number (the relay's), the identity (resolved by
validate), ``logprobs`` (the relay fills ``[]``)."""

SDK: dict[str, Any] = {
    typing.get_args(model.model_fields["type"].annotation)[0]: model
    for model in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def sdk_required(kind: str) -> dict[str, Any]:
    model = SDK[kind]
    return {name: f.annotation for name, f in model.model_fields.items() if f.is_required() and name not in IDENTITY}


SUB_EVENTS = sorted(t for t, spec in CATALOGUE.items() if spec.action in (Action.MUTATE, Action.OTHER) and t in SDK)


def test_the_table_covers_every_type_both_sides_know() -> None:
    assert len(SUB_EVENTS) > 45
    assert not [t for t in CATALOGUE if t not in SDK], "a catalogued type the official client does not know"


@pytest.mark.parametrize("kind", SUB_EVENTS)
def test_the_table_lists_what_the_official_client_requires(kind: str) -> None:
    ours = dict(CATALOGUE[kind].fields)
    theirs = sdk_required(kind)
    assert set(ours) == set(theirs), f"{kind}: ours {sorted(ours)}, the client's {sorted(theirs)}"
    for name, json_type in ours.items():
        annotation = theirs[name]
        expected = {INT: int, STR: str}.get(json_type)
        if expected is not None:
            assert annotation is expected, (kind, name, annotation)
        else:
            assert json_type == OBJECT


def event_with_every_field(spec: EventSpec) -> dict[str, Any]:
    values = {INT: 0, STR: "x", OBJECT: {"type": "output_text", "text": "", "annotations": []}}
    event: dict[str, Any] = {"type": spec.type, "output_index": 0, "item_id": "it_1"}
    for name, json_type in spec.fields:
        event[name] = values[json_type]
    if spec.type == "response.reasoning_summary_part.added" or spec.type == "response.reasoning_summary_part.done":
        event["part"] = {"type": "summary_text", "text": ""}
    return event


def stream_for(spec: EventSpec, event: dict[str, Any]) -> bytes:
    """A stream with an open item of a kind this sub-event may target, the event, then the end."""
    kind = sorted(spec.kinds)[0] if spec.kinds else "message"
    item: dict[str, Any] = {"type": kind, "id": "it_1", "status": "in_progress"}
    if kind == "message":
        item.update(role="assistant", content=[])
    if kind == "function_call":
        item.update(name="f", call_id="call_1", arguments="")  # a call without them waits for its done
    created = {"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}}
    progress = {"type": "response.in_progress", "response": {"id": "r", "status": "in_progress"}}
    added = {"type": "response.output_item.added", "output_index": 0, "item": item}
    return sse(created, progress, added, event)


def run(body: bytes, validation: Validation) -> tuple[list[str], AgentPipeline]:
    pipeline = AgentPipeline(validation=validation)
    splitter = LineSplitter()
    frames = pipeline.push_all(splitter.feed(body) + splitter.flush()).frames
    return [f.type for f in frames], pipeline


CHECKED = [(t, name) for t in SUB_EVENTS for name, _ in CATALOGUE[t].fields]


@pytest.mark.parametrize(("kind", "field"), CHECKED, ids=[f"{t}-{f}" for t, f in CHECKED])
@pytest.mark.parametrize("how", ["missing", "renamed", "retyped"])
def test_a_sub_event_without_a_required_field_is_refused_or_ignored(kind: str, field: str, how: str) -> None:
    spec = CATALOGUE[kind]
    event = event_with_every_field(spec)
    whole, _ = run(stream_for(spec, event), Validation.LENIENT)
    assert kind in whole  # whole, it is accepted
    broken = dict(event)
    value = broken.pop(field)
    if how == "renamed":
        broken["j" + field[1:]] = value
    elif how == "retyped":
        broken[field] = [value]
    kinds, pipeline = run(stream_for(spec, broken), Validation.LENIENT)
    assert kind not in kinds
    assert pipeline.validator.ignored == 1
    with pytest.raises(ProtocolError) as info:
        run(stream_for(spec, broken), Validation.STRICT)
    assert info.value.code == "missing_field"
    assert field in info.value.message


def test_the_delta_that_got_through_before_is_not_relayed() -> None:
    """The mutant of the issue: a function-call delta whose ``delta`` key was damaged."""
    call = {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "", "status": "in_progress"}
    body = sse(
        {"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": call},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_1", "delta": "{"},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_1", "jelta": "}"},
    )
    kinds, pipeline = run(body, Validation.LENIENT)
    assert kinds.count("response.function_call_arguments.delta") == 1
    assert pipeline.validator.ignored == 1
