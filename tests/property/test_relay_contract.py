"""The relay's contract with strict clients, as a property: whatever the upstream sends — a
valid stream, or one with fields removed, retyped or renamed, events dropped, duplicated or
swapped — every frame the relay sends parses with the official client's own event models
(what ``_strict_response_validation`` does), numbered 0..N, with one terminal; and a stream
that ends ``completed`` is accepted whole by the official client's stream helper, strict."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from respflow.flows import live
from respflow.operators import RespflowError
from respflow.sinks import CollectSink
from tests._support import client_final_response, sse
from tests.property.strategies import valid_streams

EVENT = TypeAdapter(ResponseStreamEvent)
TERMINALS = {"response.completed", "response.failed", "response.incomplete"}


@st.composite
def damaged_streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    events = copy.deepcopy(draw(valid_streams()))
    for _ in range(draw(st.integers(0, 4))):
        if not events:
            break
        at = draw(st.integers(0, len(events) - 1))
        how = draw(st.sampled_from(["remove", "retype", "rename", "drop", "duplicate", "swap", "nested"]))
        event = events[at]
        if how == "nested":  # damage inside the item, part or response the event carries
            inner = [k for k in ("item", "part", "response") if isinstance(event.get(k), dict)]
            if not inner:
                continue
            event = event[draw(st.sampled_from(inner))]
            how = draw(st.sampled_from(["remove", "retype", "rename"]))
        fields = sorted(k for k in event if k != "type" or how == "retype")
        if how in ("remove", "retype", "rename") and fields:
            name = draw(st.sampled_from(fields))
            value = event.pop(name)
            if how == "retype":
                event[name] = draw(st.sampled_from([5, None, [value], "x", {"v": 1}]))
            elif how == "rename":
                event["j" + name[1:]] = value
        elif how == "drop":
            events.pop(at)
        elif how == "duplicate":
            events.insert(at, copy.deepcopy(event))
        elif how == "swap" and at + 1 < len(events):
            events[at], events[at + 1] = events[at + 1], events[at]
    return events


def relayed(events: list[dict[str, Any]]) -> bytes:
    """The relayed stream, for a client that knows only the catalogued types (unknown ones
    are dropped: forwarding them is forward compatibility, which a strict client of an older
    protocol refuses by design — tests/sinks/test_relay.py covers both settings)."""
    sink = CollectSink()
    # a typed error is raised after the stream already ended with error + response.failed
    with contextlib.suppress(RespflowError):
        asyncio.run(live([sse(*events)], sink, placement="inline", response_id="resp_gw", unknown_events="drop"))
    return sink.getvalue()


def check_contract(out: bytes) -> list[dict[str, Any]]:
    frames = [json.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: ")]
    assert frames, "nothing was relayed"
    assert frames[0]["type"] == "response.created"
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
    for frame in frames:
        try:
            EVENT.validate_python(frame)  # what a strict client does with each event
        except Exception as exc:
            raise AssertionError(f"a strict client refuses {frame}: {str(exc)[-300:]}") from None
    kinds = [f["type"] for f in frames]
    assert kinds[-1] in TERMINALS
    assert sum(k in TERMINALS for k in kinds) == 1
    if "error" in kinds:
        assert kinds[-2:] == ["error", "response.failed"]
        error = frames[-1]["response"]["error"]
        assert frames[-2]["code"] in (error["code"], error.get("type"))
        assert error["message"] == frames[-2]["message"]
    return frames


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=valid_streams())
def test_a_valid_stream_relays_within_the_contract(events: list[dict[str, Any]]) -> None:
    out = relayed(events)
    frames = check_contract(out)
    assert frames[-1]["type"] == "response.completed"
    final = client_final_response(out, strict=True)
    assert final.status == "completed"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=damaged_streams())
def test_a_damaged_stream_relays_within_the_contract(events: list[dict[str, Any]]) -> None:
    out = relayed(events)
    frames = check_contract(out)
    if frames[-1]["type"] == "response.completed":
        client_final_response(out, strict=True)  # the whole stream is accepted, not only each frame
