"""A built-in upstream: an OpenAI-style Responses server that streams vLLM-shaped answers.

So ``respflow serve`` works on a bare machine, and tests and benchmarks have a real HTTP
upstream. It answers ``POST /v1/responses`` (streaming and not) deterministically:

* the last input item is a ``function_call_output`` → a message that reports the tool output;
* a declared function whose name appears in the last user message → a call to it, its
  arguments built from its JSON schema and the message (numbers for number fields, the
  message text for the first string field, ``input`` for a custom tool's one parameter);
* a message that mentions "think" or "reason" → a reasoning item first;
* otherwise → a short text answer.

vLLM's shape is kept where it differs from OpenAI's: bare-uuid item ids, ``call_`` call ids,
``response.reasoning_part.*`` names, ``name`` on ``function_call_arguments.done``, a
``response.completed`` whose output re-mints the item ids, usage without
``cache_write_tokens``. ``pace`` seconds pass between tokens.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

_WORD = re.compile(r"\S+\s*")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _uid() -> str:
    return uuid.uuid4().hex[:16]


def _last_user_text(items: list[Any]) -> str:
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _arguments(schema: dict[str, Any], text: str) -> dict[str, Any]:
    """Arguments a strict client accepts, from the tool's JSON schema: the required properties
    (and those the prompt names), each of its declared type — an enum value (one the prompt
    names, else the first), numbers from the prompt, the prompt as the first string, arrays
    and nested objects of their item types."""
    numbers = [float(n) if "." in n else int(n) for n in _NUMBER.findall(text)]
    used_text = [False]
    value = _object(schema, text, numbers, used_text)
    return value if isinstance(value, dict) else {}


def _type_of(spec: dict[str, Any]) -> str | None:
    kind = spec.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first that is not null
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) else None


def _object(schema: Any, text: str, numbers: list[int | float], used_text: list[bool]) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    wanted = set(required) if isinstance(required, list) else set()
    lowered = text.lower()
    return {
        name: _value(spec, name, text, numbers, used_text)
        for name, spec in props.items()
        if name in wanted or name.lower() in lowered
    }


def _value(spec: Any, name: str, text: str, numbers: list[int | float], used_text: list[bool]) -> Any:
    if not isinstance(spec, dict):
        return text
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        named = [v for v in enum if isinstance(v, str) and v.lower() in text.lower()]
        return named[0] if named else enum[0]
    kind = _type_of(spec)
    if kind == "string":
        if used_text[0]:
            return name
        used_text[0] = True
        return text
    if kind in ("number", "integer"):
        number = numbers.pop(0) if numbers else 1
        return int(number) if kind == "integer" else number
    if kind == "boolean":
        return True
    if kind == "array":
        given = spec.get("items")
        items: dict[str, Any] = given if isinstance(given, dict) else {}
        item_kind = _type_of(items)
        if item_kind in ("number", "integer"):
            taken, numbers[:] = (numbers[:] or [1, 2]), []
            return [int(n) for n in taken] if item_kind == "integer" else taken
        if item_kind == "object":
            return [_object(items, text, numbers, used_text)]
        return [_value(items, name, text, numbers, used_text)]
    if kind == "object" or "properties" in spec:
        return _object(spec, text, numbers, used_text)
    return text


def plan(body: dict[str, Any]) -> list[dict[str, Any]]:
    """What the simulated model answers: a list of output item plans."""
    raw = body.get("input")
    items: list[Any] = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or [])
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
    last = items[-1] if items else {}
    if isinstance(last, dict) and last.get("type") == "function_call_output":
        outputs = [str(i.get("output", "")) for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        return [{"type": "message", "text": f"The tool returned {outputs[-1]}."}]
    text = _last_user_text(items)
    out: list[dict[str, Any]] = []
    if re.search(r"\b(think|reason)", text, re.I):
        out.append({"type": "reasoning", "text": f"The user asks: {text[:80]}. I will answer briefly."})
    lowered = text.lower()
    called = [t for t in tools if str(t.get("name", "")).lower() in lowered or _short(t).lower() in lowered]
    if called and body.get("tool_choice") != "none":
        for tool in called[:2]:
            out.append({"type": "function_call", "name": tool["name"], "arguments": orjson.dumps(_arguments(tool.get("parameters") or {}, text)).decode()})
        return out
    answer = "Hello! This is respflow's built-in upstream simulator." if not text else f"You said: {text}"
    out.append({"type": "message", "text": answer})
    return out


def _short(tool: dict[str, Any]) -> str:
    name = str(tool.get("name", ""))
    return name.rsplit("__", 1)[-1] if name.startswith(("agentic_ns__", "mcp__")) else name


class _Stream:
    def __init__(self, body: dict[str, Any], pace: float) -> None:
        self.body = body
        self.pace = pace
        self.seq = 0
        self.rid = "resp_" + _uid()
        self.created = int(time.time())

    def frame(self, event: dict[str, Any]) -> bytes:
        event["sequence_number"] = self.seq
        self.seq += 1
        kind: str = event["type"]
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    def snapshot(self, status: str, output: list[Any], usage: Any) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": "response",
            "created_at": self.created,
            "model": self.body.get("model", "simulator"),
            "status": status,
            "output": output,
            "usage": usage,
            "tools": self.body.get("tools") or [],
            "tool_choice": self.body.get("tool_choice", "auto"),
            "parallel_tool_calls": True,
            "instructions": self.body.get("instructions"),
            "metadata": self.body.get("metadata") or {},
        }

    async def tokens(self, text: str) -> AsyncIterator[str]:
        for piece in _WORD.findall(text) or [text]:
            if self.pace:
                await asyncio.sleep(self.pace)
            yield piece

    async def events(self) -> AsyncIterator[bytes]:
        yield self.frame({"type": "response.created", "response": self.snapshot("in_progress", [], None)})
        yield self.frame({"type": "response.in_progress", "response": self.snapshot("in_progress", [], None)})
        final: list[dict[str, Any]] = []
        produced = 0
        for index, p in enumerate(plan(self.body)):
            iid = str(uuid.uuid4())
            if p["type"] == "reasoning":
                yield self.frame({"type": "response.output_item.added", "output_index": index, "item": {"type": "reasoning", "id": iid, "summary": [], "status": "in_progress"}})
                yield self.frame({"type": "response.reasoning_part.added", "output_index": index, "item_id": iid, "content_index": 0, "part": {"type": "reasoning_text", "text": ""}})
                async for tok in self.tokens(p["text"]):
                    produced += 1
                    yield self.frame({"type": "response.reasoning_text.delta", "output_index": index, "item_id": iid, "content_index": 0, "delta": tok})
                yield self.frame({"type": "response.reasoning_text.done", "output_index": index, "item_id": iid, "content_index": 0, "text": p["text"]})
                yield self.frame({"type": "response.reasoning_part.done", "output_index": index, "item_id": iid, "content_index": 0, "part": {"type": "reasoning_text", "text": p["text"]}})
                item = {"type": "reasoning", "id": iid, "summary": [], "content": [{"type": "reasoning_text", "text": p["text"]}], "status": "completed"}
            elif p["type"] == "message":
                yield self.frame({"type": "response.output_item.added", "output_index": index, "item": {"type": "message", "id": iid, "role": "assistant", "status": "in_progress", "content": []}})
                yield self.frame({"type": "response.content_part.added", "output_index": index, "item_id": iid, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
                async for tok in self.tokens(p["text"]):
                    produced += 1
                    yield self.frame({"type": "response.output_text.delta", "output_index": index, "item_id": iid, "content_index": 0, "delta": tok, "logprobs": []})
                yield self.frame({"type": "response.output_text.done", "output_index": index, "item_id": iid, "content_index": 0, "text": p["text"], "logprobs": []})
                part = {"type": "output_text", "text": p["text"], "annotations": [], "logprobs": None}
                yield self.frame({"type": "response.content_part.done", "output_index": index, "item_id": iid, "content_index": 0, "part": part})
                item = {"type": "message", "id": iid, "role": "assistant", "status": "completed", "content": [part]}
            else:
                call_id = "call_" + _uid()
                head = {"type": "function_call", "id": iid, "call_id": call_id, "name": p["name"], "arguments": "", "status": "in_progress"}
                yield self.frame({"type": "response.output_item.added", "output_index": index, "item": head})
                args = p["arguments"]
                for i in range(0, len(args), 6):
                    if self.pace:
                        await asyncio.sleep(self.pace)
                    produced += 1
                    yield self.frame({"type": "response.function_call_arguments.delta", "output_index": index, "item_id": iid, "delta": args[i : i + 6]})
                yield self.frame({"type": "response.function_call_arguments.done", "output_index": index, "item_id": iid, "arguments": args, "name": p["name"]})
                item = dict(head, arguments=args, status="completed")
            yield self.frame({"type": "response.output_item.done", "output_index": index, "item": item})
            final.append(dict(item, id=str(uuid.uuid4())))  # vLLM re-mints ids in the terminal
        usage = {"input_tokens": 12, "output_tokens": produced, "total_tokens": 12 + produced}
        yield self.frame({"type": "response.completed", "response": self.snapshot("completed", final, usage)})


def simulator_app(*, pace: float = 0.02) -> Starlette:
    """The simulator as an ASGI app (``POST /v1/responses``, ``GET /health``)."""

    async def responses(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return JSONResponse({"error": {"message": "invalid JSON", "type": "invalid_request_error", "param": None, "code": None}}, status_code=400)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return JSONResponse({"error": {"message": "'model' is required", "type": "invalid_request_error", "param": "model", "code": None}}, status_code=400)
        run = _Stream(body, pace)
        if body.get("stream"):
            return StreamingResponse(run.events(), media_type="text/event-stream")
        last = b""
        async for frame in run.events():
            last = frame
        completed = orjson.loads(last.split(b"data: ", 1)[1])
        return JSONResponse(completed["response"])

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "simulator": True})

    return Starlette(routes=[Route("/v1/responses", responses, methods=["POST"]), Route("/health", health, methods=["GET"])])
