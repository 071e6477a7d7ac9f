"""Every fixture folds (lenient) to what the official openai client reports for the same bytes.

The oracle is ``client.responses.stream(...).get_final_response()`` of the real ``openai``
package, fed the recorded bytes through httpx's MockTransport. That final response is the
terminal event's ``response`` verbatim (the client folds nothing unless ``output`` is null).
vLLM re-mints item ids and call_ids in its terminal ``response.output`` (protocol.md §7.1, V2)
while we report the ids that were streamed — so items are compared by CONTENT (kind, order,
message text, reasoning text, function name and parsed arguments, custom input), never by id.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.responses import Response as OpenAIResponse

from respflow.flows import decode
from respflow.operators import Validation
from tests._support import AUTHORED, RECORDED, client_final_response, fixture_bytes


def content_of(item: dict[str, Any]) -> tuple[Any, ...]:
    kind = item["type"]
    if kind == "message":
        return (kind, "".join(p.get("text") or p.get("refusal") or "" for p in item.get("content") or []))
    if kind == "reasoning":
        texts = [p["text"] for p in item.get("content") or []] + [p["text"] for p in item.get("summary") or []]
        return (kind, "".join(texts))
    if kind == "function_call":
        return (kind, item["name"], json.loads(item["arguments"]))
    if kind == "custom_tool_call":
        return (kind, item["name"], item["input"])
    return (kind,)


OPENAI_MAJOR = int(openai.__version__.split(".")[0])

# Streams the client's stream helper refuses, and why (our fold still recovers them).
CLIENT_REFUSES: dict[str, tuple[type[Exception], str]] = {
    "authored/failed.sse": (RuntimeError, "Didn't receive a `response.completed` event"),
    "authored/incomplete.sse": (RuntimeError, "Didn't receive a `response.completed` event"),
    "web-search-gpt-oss-20b.sse": (RuntimeError, "Expected to have received `response.created`"),
}
if OPENAI_MAJOR < 3:
    # before 3.x the helper takes the terminal's output verbatim; this terminal has none
    CLIENT_REFUSES["function-call-vllm-gemma4.sse"] = (TypeError, "not iterable")


@pytest.mark.parametrize("name", RECORDED + AUTHORED)
def test_fold_matches_the_official_client(name: str) -> None:
    body = fixture_bytes(name)
    ours = decode(body, validation=Validation.LENIENT).to_dict()
    OpenAIResponse.model_validate(ours)  # the official model accepts our shape
    if name in CLIENT_REFUSES:
        kind, message = CLIENT_REFUSES[name]
        with pytest.raises(kind, match=message):
            client_final_response(body)
        return
    theirs = client_final_response(body).model_dump(mode="json")
    assert [content_of(i) for i in ours["output"]] == [content_of(i) for i in theirs["output"]]
    assert ours["status"] == theirs["status"]
    counts = ("input_tokens", "output_tokens", "total_tokens")
    if theirs["usage"] is None:
        assert ours["usage"] is None
    else:
        assert {k: ours["usage"][k] for k in counts} == {k: theirs["usage"][k] for k in counts}


def test_refused_streams_still_fold_with_their_terminal_status() -> None:
    assert decode(fixture_bytes("authored/failed.sse"), validation=Validation.LENIENT).status == "failed"
    incomplete = decode(fixture_bytes("authored/incomplete.sse"), validation=Validation.LENIENT)
    assert incomplete.status == "incomplete"
    assert incomplete.incomplete_details is not None
    ws = decode(fixture_bytes("web-search-gpt-oss-20b.sse"), validation=Validation.LENIENT)
    assert [o.type for o in ws.output] == ["web_search_call"]
    assert ws.to_dict()["output"][0]["action"]["query"] == "potato"


STRICT_REFUSES = {
    # vLLM's terminal re-mints call_ids (upstream-behaviour.md §3.4: a known strict rejection)
    "tool-call-auto-qwen3-30b.sse": "call_id_changed",
    "tool-call-named-qwen3-30b.sse": "call_id_changed",
    # the recording starts at output_item.added: no response.created
    "web-search-gpt-oss-20b.sse": "lifecycle_order",
}


@pytest.mark.parametrize("name", RECORDED + AUTHORED)
def test_strict_and_lenient_agree_where_strict_accepts(name: str) -> None:
    from respflow.operators import ProtocolError

    body = fixture_bytes(name)
    lenient = decode(body, validation=Validation.LENIENT, response_id="resp_x").to_dict()
    if name in STRICT_REFUSES:
        with pytest.raises(ProtocolError) as info:
            decode(body, validation=Validation.STRICT)
        assert info.value.code == STRICT_REFUSES[name]
        return
    strict = decode(body, validation=Validation.STRICT, response_id="resp_x").to_dict()
    assert strict == lenient
