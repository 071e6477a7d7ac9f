"""Properties over large input spaces: chunking, line endings, policies, the client oracle."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from respflow.flows import decode
from respflow.operators import LineSplitter, SseLine, Validation
from tests._support import RECORDED, client_final_response, fixture_bytes, sse
from tests.flows.test_fixtures_vs_client import content_of
from tests.property.strategies import valid_streams

BODIES = {name: fixture_bytes(name) for name in RECORDED}


def chunked(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts})
    out, last = [], 0
    for p in [*points, len(body)]:
        out.append(body[last:p])
        last = p
    return out


def split(chunks: list[bytes]) -> list[SseLine]:
    s = LineSplitter()
    out: list[SseLine] = []
    for c in chunks:
        out += s.feed(c)
    return out + s.flush()


def stable(response: dict[str, Any]) -> dict[str, Any]:
    response = dict(response)
    response.pop("created_at", None)
    return response


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(BODIES)), cuts=st.lists(st.integers(0, 1 << 20), max_size=40))
def test_any_chunking_gives_the_same_lines_and_response(name: str, cuts: list[int]) -> None:
    body = BODIES[name]
    assert split(chunked(body, cuts)) == split([body])
    one = decode([body], validation=Validation.LENIENT, response_id="r").to_dict()
    many = decode(chunked(body, cuts), validation=Validation.LENIENT, response_id="r").to_dict()
    assert stable(one) == stable(many)


EVENT_SHAPES = [
    b'data: {"a":1}\n\n',
    b'event: x\ndata: {"b":2}\n\n',
    b": comment\ndata: {\"c\":3}\n\n",
    b"data: [DONE]\n\n",
    b'data:{"d":4}\n\n',
    b"\ndata: {\"e\":5}\n\n",
    b'data: {"f":6}\ndata: {"g":7}\n\n',
    b"event: y\n\n",
    b'data: {"h"\n\n',
    b"id: 3\nevent: z\ndata: {\"i\":9}\n\n",
    b'data: {"j":10}\r\n\r\n',
]


@settings(max_examples=300, deadline=None)
@given(events=st.lists(st.sampled_from(EVENT_SHAPES), min_size=1, max_size=12), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_one_event_per_read_splits_as_one_read(events: list[bytes], cuts: list[int]) -> None:
    """The trickle fast path (a read that is exactly one event) agrees with the line loop:
    event-aligned reads, mixed with arbitrary cuts, give the lines of one whole read."""
    body = b"".join(events)
    reads = [piece for event in events for piece in chunked(event, cuts)]
    assert split(reads) == split([body]) == split([bytes([b]) for b in body])


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(BODIES)),
    ending=st.sampled_from([b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(0, 1 << 20), max_size=20),
)
def test_cr_lf_and_crlf_agree(name: str, ending: bytes, cuts: list[int]) -> None:
    body = BODIES[name]
    other = body.replace(b"\n", ending)
    lf = [tuple(x) for x in split([body])]
    assert [tuple(x) for x in split(chunked(other, cuts))] == lf


@settings(max_examples=150, deadline=None)
@given(stream=valid_streams(), cuts=st.lists(st.integers(0, 1 << 16), max_size=30))
def test_lenient_accepts_what_strict_accepts_with_the_same_frames_and_response(stream: list[dict[str, Any]], cuts: list[int]) -> None:
    from respflow.operators import AgentPipeline

    body = sse(*stream)
    strict = decode(chunked(body, cuts), validation=Validation.STRICT, response_id="r")
    lenient = decode(chunked(body, cuts), validation=Validation.LENIENT, response_id="r")
    assert stable(strict.to_dict()) == stable(lenient.to_dict())
    emitted = []
    for policy in (Validation.STRICT, Validation.LENIENT):
        pipeline = AgentPipeline(validation=policy, response_id="r")
        frames = []
        splitter = LineSplitter()
        for chunk in chunked(body, cuts):
            frames += [f.data for f in pipeline.push_all(splitter.feed(chunk)).frames]
        frames += [f.data for f in pipeline.push_all(splitter.flush()).frames]
        emitted.append(frames)
    assert emitted[0] == emitted[1]
    assert len(emitted[0]) == len(stream)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=valid_streams())
def test_one_pass_fold_equals_the_official_clients_final_response(stream: list[dict[str, Any]]) -> None:
    body = sse(*[dict(e, sequence_number=i) for i, e in enumerate(stream)])
    ours = decode(body, validation=Validation.STRICT).to_dict()
    theirs = client_final_response(body).model_dump(mode="json")
    assert [content_of(i) for i in ours["output"]] == [content_of(i) for i in theirs["output"]]
    assert [i["id"] for i in ours["output"]] == [i["id"] for i in theirs["output"]]
    for item in ours["output"]:
        if item["type"] == "function_call":
            json.loads(item["arguments"])


@settings(max_examples=200, deadline=None)
@given(garbage=st.lists(st.binary(max_size=64) | st.sampled_from([b"data: {}\n\n", b"data: [DONE]\n", b"\r", b"\n", b"data: {\"type\":\"response.created\"}\n\n"]), max_size=20))
def test_malformed_input_gives_a_typed_error_or_a_response(garbage: list[bytes]) -> None:
    from respflow.operators import RespflowError

    for policy in (Validation.STRICT, Validation.LENIENT):
        try:
            response = decode(garbage, validation=policy)
        except RespflowError as exc:
            assert exc.code and exc.describe().startswith("error[")
        else:
            assert response.status in ("completed", "failed", "incomplete")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**33) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_KEYS = st.sampled_from(["type", "output_index", "item_id", "item", "delta", "text", "arguments", "response", "content_index", "part", "call_id", "name", "id", "status", "output"])
_TYPES = st.sampled_from([
    "response.created", "response.in_progress", "response.completed", "response.failed", "response.done",
    "response.output_item.added", "response.output_item.done", "response.output_text.delta",
    "response.function_call_arguments.delta", "response.function_call_arguments.done",
    "response.reasoning_part.added", "response.content_part.done", "error", "x",
])


@st.composite
def _events(draw: st.DrawFn) -> dict[str, Any]:
    event = draw(st.dictionaries(_KEYS, _JSON, max_size=6))
    if draw(st.booleans()):
        event["type"] = draw(_TYPES)
    if draw(st.booleans()):
        event["item"] = draw(st.dictionaries(_KEYS, _JSON | _TYPES, max_size=6))
    return event


@settings(max_examples=300, deadline=None)
@given(events=st.lists(_events(), max_size=12))
def test_any_json_events_give_a_typed_error_or_a_response(events: list[dict[str, Any]]) -> None:
    import asyncio

    from respflow.flows import live
    from respflow.operators import RespflowError, ToolRegistry
    from respflow.sinks import CollectSink

    body = sse(*events)
    tools = ToolRegistry([{"type": "custom", "name": "x"}, {"type": "web_search"}])
    for policy in (Validation.STRICT, Validation.LENIENT):
        try:
            decode(body, validation=policy, tools=tools)
        except RespflowError as exc:
            assert exc.code
    try:
        asyncio.run(live([body], CollectSink(), placement="inline", tools=tools))
    except RespflowError as exc:
        assert exc.code
