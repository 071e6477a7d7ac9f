"""Hypothesis strategies: random, strictly valid Responses streams."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

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
    text_delta,
)

texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(text)]:
        if p > last:
            pieces.append(text[last:p])
            last = p
    return pieces


@st.composite
def valid_streams(draw: st.DrawFn, *, call_name: str = "lookup", custom: bool = False) -> list[dict[str, Any]]:
    """A strictly valid stream: created, in_progress, 0-4 items (messages, function calls), completed.

    With ``custom``, calls carry ``{"input": …}`` arguments, as a custom tool's calls do upstream.
    """
    events: list[dict[str, Any]] = [created(), in_progress()]
    final: list[dict[str, Any]] = []
    for index in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            mid = f"msg_{index}"
            text = draw(texts)
            pieces = _split(text, draw(st.lists(st.integers(0, 60), max_size=6)))
            events.append(added(message(mid), index))
            events.append({"type": "response.content_part.added", "item_id": mid, "output_index": index, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
            events += [text_delta(p, mid, index) for p in pieces]
            events.append({"type": "response.output_text.done", "item_id": mid, "output_index": index, "content_index": 0, "text": text, "logprobs": []})
            events.append({"type": "response.content_part.done", "item_id": mid, "output_index": index, "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}})
            item = message(mid, text, "completed")
        else:
            fid, cid = f"fc_{index}", f"call_{index}"
            payload: dict[str, Any] = {"input": draw(texts)} if custom else {"q": draw(texts), "n": draw(st.integers())}
            args = json.dumps(payload, ensure_ascii=draw(st.booleans()))
            pieces = _split(args, draw(st.lists(st.integers(0, 200), max_size=8)))
            events.append(added(fcall(fid, cid, call_name), index))
            events += [args_delta(p, fid, index) for p in pieces]
            events.append(args_done(args, fid, index))
            item = fcall(fid, cid, call_name, args, "completed")
        events.append(done(item, index))
        final.append(item)
    events.append(completed(output=final if draw(st.booleans()) else None, usage={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}))
    return events
