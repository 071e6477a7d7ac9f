"""Shared test helpers: fixture loading, literal-event builders, the official client as oracle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
from openai.types.responses import Response as OpenAIResponse

from respflow.operators import AgentPipeline, LineSplitter, Response, SseLine, Validation

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = sorted(p.name for p in FIXTURES.glob("*.sse"))
AUTHORED = sorted(f"authored/{p.name}" for p in (FIXTURES / "authored").glob("*.sse"))


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def sidecar(name: str) -> dict[str, Any]:
    path = FIXTURES / name.replace(".sse", ".json")
    return json.loads(path.read_text()) if path.exists() else {}


def sse(*events: dict[str, Any] | str) -> bytes:
    """Frames as an upstream sends them: ``data: <json>`` + blank line (strings verbatim)."""
    out = []
    for event in events:
        payload = event if isinstance(event, str) else orjson.dumps(event).decode()
        out.append(f"data: {payload}\n\n")
    return "".join(out).encode()


def lines(*events: dict[str, Any] | str) -> list[SseLine]:
    splitter = LineSplitter()
    return splitter.feed(sse(*events)) + splitter.flush()


def run(
    *events: dict[str, Any] | str,
    validation: Validation = Validation.STRICT,
    **kw: Any,
) -> tuple[list[dict[str, Any]], Response]:
    """Push literal events through a pipeline; the emitted frames' JSON and the Response."""
    pipeline = AgentPipeline(validation=validation, **kw)
    frames: list[dict[str, Any]] = []
    for line in lines(*events):
        frames.extend(f.data for f in pipeline.push(line).frames)
    return frames, pipeline.finish()


# ---- literal event builders (the canonical OpenAI shapes) -------------------------------------

RID = "resp_1"


def created(rid: str = RID, **extra: Any) -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": rid, "status": "in_progress", "output": [], **extra}}


def in_progress(rid: str = RID) -> dict[str, Any]:
    return {"type": "response.in_progress", "response": {"id": rid, "status": "in_progress"}}


def completed(rid: str = RID, output: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    response: dict[str, Any] = {"id": rid, "status": "completed", **extra}
    if output is not None:
        response["output"] = output
    return {"type": "response.completed", "response": response}


def terminal(kind: str, rid: str = RID, **extra: Any) -> dict[str, Any]:
    return {"type": f"response.{kind}", "response": {"id": rid, "status": kind, **extra}}


def message(mid: str = "msg_1", text: str | None = None, status: str = "in_progress") -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": mid, "role": "assistant", "status": status, "content": content}


def fcall(fid: str = "fc_1", call_id: str = "call_1", name: str = "get_weather", arguments: str = "", status: str = "in_progress") -> dict[str, Any]:
    return {"type": "function_call", "id": fid, "call_id": call_id, "name": name, "arguments": arguments, "status": status}


def added(item: dict[str, Any], index: int | None = 0) -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "response.output_item.added", "item": item}
    if index is not None:
        ev["output_index"] = index
    return ev


def done(item: dict[str, Any], index: int | None = 0) -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "response.output_item.done", "item": item}
    if index is not None:
        ev["output_index"] = index
    return ev


def text_delta(delta: str, item_id: str = "msg_1", index: int | None = 0, content_index: int = 0) -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "response.output_text.delta", "item_id": item_id, "content_index": content_index, "delta": delta, "logprobs": []}
    if index is not None:
        ev["output_index"] = index
    return ev


def args_delta(delta: str, item_id: str = "fc_1", index: int | None = 0) -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "response.function_call_arguments.delta", "item_id": item_id, "delta": delta}
    if index is not None:
        ev["output_index"] = index
    return ev


def args_done(arguments: str, item_id: str = "fc_1", index: int | None = 0, **extra: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "response.function_call_arguments.done", "item_id": item_id, "arguments": arguments, **extra}
    if index is not None:
        ev["output_index"] = index
    return ev


def text_stream(text_parts: list[str] | None = None) -> list[dict[str, Any]]:
    """A complete, strictly valid single-message stream."""
    parts = text_parts if text_parts is not None else ["Hello", " world"]
    full = "".join(parts)
    return [
        created(),
        in_progress(),
        added(message()),
        {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}},
        *[text_delta(p) for p in parts],
        {"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "text": full, "logprobs": []},
        {"type": "response.content_part.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": full, "annotations": []}},
        done(message(text=full, status="completed")),
        completed(output=[message(text=full, status="completed")], usage={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}),
    ]


def function_stream() -> list[dict[str, Any]]:
    """A complete, strictly valid single function-call stream."""
    return [
        created(),
        in_progress(),
        added(fcall()),
        args_delta('{"city":'),
        args_delta('"Paris"}'),
        args_done('{"city":"Paris"}'),
        done(fcall(arguments='{"city":"Paris"}', status="completed")),
        completed(output=[fcall(arguments='{"city":"Paris"}', status="completed")]),
    ]


# ---- the official client as oracle -------------------------------------------------------------


def client_final_response(body: bytes, *, strict: bool = False) -> OpenAIResponse:
    """Feed ``body`` to the official openai client's stream helper; its final response."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = openai.OpenAI(
        api_key="test",
        base_url="http://upstream.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        _strict_response_validation=strict,
    )
    with client.responses.stream(model="m", input="hi") as stream:
        for _ in stream:
            pass
        return stream.get_final_response()
