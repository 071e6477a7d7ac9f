"""Batching never changes the outcome: a whole stream pushed as ONE batch (where validate and
fold take runs of deltas at once) gives the same frames, Response or error as the same stream
pushed one line at a time (every run one frame long)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from respflow.operators import AgentPipeline, RespflowError, Validation
from tests._support import added, completed, created, done, fcall, in_progress, lines, message

_TEXT = st.text(alphabet="ab é\n{}\"", max_size=6)


@st.composite
def interleaved_streams(draw: st.DrawFn) -> tuple[list[dict[str, Any]], Any]:
    """Several items open at once; runs of deltas hop between items and parts; some deltas
    name no item, a few carry a field of the wrong type."""
    events: list[dict[str, Any]] = [created(), in_progress()]
    kinds = draw(st.lists(st.sampled_from(["message", "reasoning", "function_call"]), min_size=1, max_size=4))
    targets: list[tuple[str, str, int, str, int]] = []  # (delta type, item id, index, index field, part)
    for index, kind in enumerate(kinds):
        if kind == "message":
            iid = f"msg_{index}"
            events.append(added(message(iid), index))
            for part in (0, 1):
                events.append({"type": "response.content_part.added", "item_id": iid, "output_index": index, "content_index": part, "part": {"type": "output_text", "text": "", "annotations": []}})
                targets.append(("response.output_text.delta", iid, index, "content_index", part))
        elif kind == "reasoning":
            iid = f"rs_{index}"
            events.append(added({"type": "reasoning", "id": iid, "summary": []}, index))
            targets.append(("response.reasoning_text.delta", iid, index, "content_index", 0))
            targets.append(("response.reasoning_summary_text.delta", iid, index, "summary_index", 0))
        else:
            iid = f"fc_{index}"
            events.append(added(fcall(iid, f"call_{index}"), index))
            targets.append(("response.function_call_arguments.delta", iid, index, "", 0))
    runs = draw(st.lists(st.tuples(st.integers(0, len(targets) - 1), st.integers(1, 6)), max_size=12))
    for which, length in runs:
        kind, iid, index, field, part = targets[which]
        for _ in range(length):
            event: dict[str, Any] = {"type": kind, "item_id": iid, "output_index": index, "delta": draw(_TEXT)}
            if field:
                event[field] = part
            quirk = draw(st.sampled_from(["", "", "", "", "no_item_id", "bad_delta", "bad_index", "call_id"]))
            if quirk == "no_item_id":
                del event["item_id"]
            elif quirk == "bad_delta":
                event["delta"] = 5
            elif quirk == "bad_index" and field:
                event[field] = "0"
            elif quirk == "call_id":
                event["call_id"] = "call_x"
            events.append(event)
    for index, kind in enumerate(kinds):
        if kind == "message":
            # no content key: the fold keeps what it streamed, so the parts show in the Response
            events.append(done({"type": "message", "id": f"msg_{index}", "role": "assistant", "status": "completed"}, index))
        elif kind == "reasoning":
            events.append(done({"type": "reasoning", "id": f"rs_{index}", "summary": [], "status": "completed"}, index))
        else:
            events.append(done(fcall(f"fc_{index}", f"call_{index}", status="completed"), index))
    events.append(completed())
    return events, draw(st.sampled_from([Validation.LENIENT, Validation.STRICT]))


def _outcome(events: list[dict[str, Any]], validation: Validation, *, batched: bool) -> Any:
    pipeline = AgentPipeline(validation=validation, response_id="resp_gw")
    frames: list[dict[str, Any]] = []
    try:
        if batched:
            frames += [f.data for f in pipeline.push_all(lines(*events)).frames]
        else:
            for line in lines(*events):
                frames += [f.data for f in pipeline.push(line).frames]
        response = pipeline.finish().to_dict()
    except RespflowError as exc:
        return ("error", exc.code, exc.line, frames + [f.data for f in exc.partial])
    response.pop("created_at", None)
    return frames, response


@settings(max_examples=400, deadline=None)
@given(case=interleaved_streams())
def test_one_batch_equals_one_line_at_a_time(case: tuple[list[dict[str, Any]], Validation]) -> None:
    events, validation = case
    assert _outcome(events, validation, batched=True) == _outcome(events, validation, batched=False)
