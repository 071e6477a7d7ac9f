"""Hosted tools the application makes real: ``web_search``, ``file_search``,
``code_interpreter`` and ``image_generation`` run by the gateway, shown in their own public
shapes.

A `HostedTool` registers a Python callable — or a tool of an MCP server — under a hosted type.
When a request declares that type, the model sees a function of that name (one string
parameter: ``query``, ``code`` or ``prompt``); the gateway runs its calls between rounds, gives
the output back to the model, and shows the client the type's own item and events:

| type | item | events between added and done |
|---|---|---|
| web_search | ``web_search_call`` (``action: search``, its ``query`` and ``sources``) | ``web_search_call.in_progress``, ``.searching``, ``.completed`` |
| file_search | ``file_search_call`` (``queries``, ``results``) | ``file_search_call.in_progress``, ``.searching``, ``.completed`` |
| code_interpreter | ``code_interpreter_call`` (``code``, ``outputs`` logs) | ``code_interpreter_call.in_progress``, ``_code.delta``, ``_code.done``, ``.interpreting``, ``.completed`` |
| image_generation | ``image_generation_call`` (``result``: base64) | ``image_generation_call.in_progress``, ``.generating``, ``.completed`` |

A call that fails (the callable raised, timed out, or the tool is not available on this
gateway) ends with its item ``status: "failed"`` and no ``.completed`` event; the model gets
the error as the tool output and the round goes on.

The callable takes the parsed arguments and returns the text for the model, or a dict with
``output`` (that text) and the type's extras: ``sources`` (``[{"url": …, "title": …}]``,
web_search), ``results`` (``[{"text": …, "filename": …}]``, file_search), ``result`` (base64
image, image_generation).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from respflow.flows.gateway._tools import Executor, Outcome, ToolFn, wire_text
from respflow.operators._tools import GATEWAY_BUILTINS, fnv1a_hex, hosted_function

HostedType = Literal["web_search", "file_search", "code_interpreter", "image_generation"]
HOSTED_KINDS: tuple[str, ...] = ("web_search", "file_search", "code_interpreter", "image_generation")


@dataclass(frozen=True)
class HostedTool:
    """An executor for a hosted tool type: a callable, or a tool of an MCP server."""

    type: HostedType
    fn: ToolFn | None = None
    mcp_url: str | None = None
    mcp_tool: str | None = None
    """The MCP tool to call (default: the function name, e.g. ``web_search``)."""
    mcp_headers: Mapping[str, str] = field(default_factory=dict)
    description: str | None = None

    def __post_init__(self) -> None:
        if self.type not in HOSTED_KINDS:
            raise ValueError(f"a hosted tool type is one of {', '.join(HOSTED_KINDS)}, not {self.type!r}")
        if (self.fn is None) == (self.mcp_url is None):
            raise ValueError("give a hosted tool exactly one of fn= or mcp_url=")

    @property
    def function(self) -> str:
        return GATEWAY_BUILTINS[self.type]

    def declaration(self) -> dict[str, Any]:
        return hosted_function(self.type, self.description)

    def executor(self, call_timeout: float) -> Executor:
        async def run(arguments: dict[str, Any]) -> Outcome:
            result = await self._call(arguments, call_timeout)
            if isinstance(result, dict):
                output = result.get("output")
                extra = {k: v for k, v in result.items() if k != "output"}
                return Outcome(wire_text(output) if isinstance(output, str) else orjson.dumps(output).decode(), extra=extra)
            return Outcome(wire_text(result) if isinstance(result, str) else orjson.dumps(result).decode())

        return hosted_executor(self.type, run)

    async def _call(self, arguments: dict[str, Any], call_timeout: float) -> Any:
        if self.fn is not None:
            result = self.fn(arguments)
            return await result if inspect.isawaitable(result) else result
        from mcp import Client

        assert self.mcp_url is not None
        async with Client(self.mcp_url, read_timeout_seconds=call_timeout) as client:
            called = await client.call_tool(self.mcp_tool or self.function, arguments, read_timeout_seconds=call_timeout)
        body = "\n".join(getattr(block, "text", "") for block in called.content if getattr(block, "text", None))
        if called.is_error:
            raise RuntimeError(body or "the MCP tool failed")
        if isinstance(called.structured_content, dict) and "output" in called.structured_content:
            return dict(called.structured_content)
        return body


def hosted_executor(kind: str, run: Any) -> Executor:
    """An executor whose calls are shown as the hosted ``kind``'s item and events."""
    return Executor(server_label="gateway", public_name=GATEWAY_BUILTINS[kind], run=run, item=_ITEMS[kind], events=_EVENTS[kind])


def unavailable_executor(name: str) -> Executor:
    """For a call to a tool this gateway cannot run: a failed output, in the tool's own shape."""
    kind = next((k for k, fn in GATEWAY_BUILTINS.items() if fn == name and k in HOSTED_KINDS), None)

    async def run(arguments: dict[str, Any]) -> Outcome:
        return Outcome(None, f"the tool {name!r} is not available on this gateway")

    if kind is not None:
        return hosted_executor(kind, run)
    return Executor(server_label="gateway", public_name=name, run=run)


# ---- public items and events, per type ---------------------------------------------------------


def _id(prefix: str, call_id: str) -> str:
    return prefix + fnv1a_hex(call_id)


def _args(arguments: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _status(outcome: Outcome | None) -> str:
    if outcome is None:
        return "in_progress"
    return "failed" if outcome.error is not None else "completed"


def _web_search_item(call_id: str, arguments: str, outcome: Outcome | None) -> dict[str, Any]:
    action: dict[str, Any] = {"type": "search", "query": str(_args(arguments).get("query", ""))}
    extra = outcome.extra if outcome is not None else {}
    sources = extra.get("sources") if isinstance(extra.get("sources"), list) else None
    if outcome is not None and sources is not None:
        action["sources"] = [{"type": "url", "url": str(s.get("url", ""))} for s in sources if isinstance(s, dict)]
    return {"type": "web_search_call", "id": _id("ws_", call_id), "status": _status(outcome), "action": action}


def _file_search_item(call_id: str, arguments: str, outcome: Outcome | None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "file_search_call",
        "id": _id("fs_", call_id),
        "status": _status(outcome),
        "queries": [str(_args(arguments).get("query", ""))],
        "results": None,
    }
    extra = outcome.extra if outcome is not None else {}
    if isinstance(extra.get("results"), list):
        keep = ("text", "filename", "file_id", "score", "attributes")
        item["results"] = [{k: r[k] for k in keep if k in r} for r in extra["results"] if isinstance(r, dict)]
    return item


def _code_interpreter_item(call_id: str, arguments: str, outcome: Outcome | None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "code_interpreter_call",
        "id": _id("ci_", call_id),
        "status": _status(outcome),
        "code": str(_args(arguments).get("code", "")),
        "container_id": "respflow",
        "outputs": None,
    }
    if outcome is not None:
        logs = outcome.output if outcome.error is None else outcome.error
        item["outputs"] = [{"type": "logs", "logs": logs or ""}]
    return item


def _image_item(call_id: str, arguments: str, outcome: Outcome | None) -> dict[str, Any]:
    extra = outcome.extra if outcome is not None else {}
    result = extra.get("result")
    return {
        "type": "image_generation_call",
        "id": _id("ig_", call_id),
        "status": _status(outcome),
        "result": result if isinstance(result, str) and outcome is not None and outcome.error is None else None,
    }


def _lifecycle(kind: str, steps: tuple[str, ...]) -> Any:
    """The events of a finished hosted call: added, the type's steps, (completed), done."""

    def events(item: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
        item_id = item["id"]
        start = dict(item, status="in_progress")
        for key in ("results", "outputs", "result"):
            if key in start:
                start[key] = None
        if kind == "web_search_call" and isinstance(start.get("action"), dict):
            start["action"] = {k: v for k, v in start["action"].items() if k != "sources"}
        out: list[dict[str, Any]] = [{"type": "response.output_item.added", "output_index": index, "item": start}]
        for step in steps:
            out.append({"type": f"response.{kind}.{step}", "output_index": index, "item_id": item_id})
            if kind == "code_interpreter_call" and step == "in_progress":
                code = str(item.get("code") or "")
                out.append({"type": "response.code_interpreter_call_code.delta", "output_index": index, "item_id": item_id, "delta": code})
                out.append({"type": "response.code_interpreter_call_code.done", "output_index": index, "item_id": item_id, "code": code})
        if item.get("status") == "completed":
            out.append({"type": f"response.{kind}.completed", "output_index": index, "item_id": item_id})
        out.append({"type": "response.output_item.done", "output_index": index, "item": dict(item)})
        return out

    return events


_ITEMS = {
    "web_search": _web_search_item,
    "file_search": _file_search_item,
    "code_interpreter": _code_interpreter_item,
    "image_generation": _image_item,
}
_EVENTS = {
    "web_search": _lifecycle("web_search_call", ("in_progress", "searching")),
    "file_search": _lifecycle("file_search_call", ("in_progress", "searching")),
    "code_interpreter": _lifecycle("code_interpreter_call", ("in_progress", "interpreting")),
    "image_generation": _lifecycle("image_generation_call", ("in_progress", "generating")),
}
