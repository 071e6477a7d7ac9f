"""Gateway-owned tools: Python callables the embedding application registers, and MCP servers a
request declares (``{"type": "mcp", "server_label": …, "server_url": …}``), called through the
official ``mcp`` SDK. Both are shown to the client as public ``mcp_call`` items (server-side
calls the client must not act on) with their lifecycle events; MCP discovery as
``mcp_list_tools`` items.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import orjson

from respflow.flows.gateway._metrics import start_span
from respflow.operators._tools import GATEWAY_LABEL, fnv1a_hex, mcp_function_name

ToolFn = Callable[[dict[str, Any]], Awaitable[Any] | Any]


@dataclass(frozen=True)
class GatewayTool:
    """A Python callable the gateway runs between rounds.

    ``fn`` takes the parsed arguments (a dict) and returns the output: a string, or anything
    JSON-serializable. It may be sync or async. An exception or a timeout becomes an error
    tool output; the round continues.
    """

    name: str
    fn: ToolFn
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    server_label: str = GATEWAY_LABEL

    def declaration(self) -> dict[str, Any]:
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }


@dataclass
class Outcome:
    """What one tool call gave: an output, or an error (and, for hosted types, extras such as
    a web search's sources)."""

    output: str | None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


PublicItem = Callable[[str, str, "Outcome | None"], dict[str, Any]]
PublicEvents = Callable[[Mapping[str, Any], int], list[dict[str, Any]]]


class Executor:
    """How a model-visible gateway function is run, and how its calls look to the client
    (``mcp_call`` items unless the executor says otherwise: hosted types have their own)."""

    def __init__(
        self,
        *,
        server_label: str,
        public_name: str,
        run: Callable[[dict[str, Any]], Awaitable[Outcome]],
        item: PublicItem | None = None,
        events: PublicEvents | None = None,
    ) -> None:
        self.server_label = server_label
        self.public_name = public_name
        self.run = run
        self._item = item
        self._events = events

    def public_item(self, call_id: str, arguments: str, outcome: Outcome | None) -> dict[str, Any]:
        if self._item is not None:
            return self._item(call_id, arguments, outcome)
        return mcp_call_item(call_id, self, arguments, outcome)

    def public_events(self, item: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
        if self._events is not None:
            return self._events(item, index)
        return mcp_call_events(item, index)


def wire_text(value: str) -> str:
    """``value`` as text that can go on the wire (a lone surrogate becomes "?")."""
    return value.encode("utf-8", "replace").decode("utf-8", "replace")


def gateway_tool_executor(tool: GatewayTool) -> Executor:
    async def run(arguments: dict[str, Any]) -> Outcome:
        result = tool.fn(arguments)
        if inspect.isawaitable(result):
            result = await result
        return Outcome(wire_text(result) if isinstance(result, str) else orjson.dumps(result).decode())

    return Executor(server_label=tool.server_label, public_name=tool.name, run=run)


class McpServer:
    """One MCP server declared in a request, connected for the request's lifetime."""

    def __init__(self, declaration: Mapping[str, Any]) -> None:
        self.label = str(declaration.get("server_label") or "mcp")
        self.url = str(declaration.get("server_url") or "")
        allowed = declaration.get("allowed_tools")
        self.allowed: set[str] | None = set(allowed) if isinstance(allowed, list) else None
        headers = declaration.get("headers")
        self.headers: dict[str, str] = dict(headers) if isinstance(headers, dict) else {}
        self.tools: list[dict[str, Any]] = []
        self.error: str | None = None
        self._client: Any = None

    async def connect(self, stack: AsyncExitStack, timeout: float) -> None:
        """List the server's tools; on failure record the error (the request goes on)."""
        from mcp import Client

        if not self.url:
            self.error = "the mcp tool declaration has no server_url"
            return
        try:
            async with asyncio.timeout(timeout):
                client = Client(self.url, read_timeout_seconds=timeout)
                self._client = await stack.enter_async_context(client)
                listed = await self._client.list_tools()
        except Exception as exc:  # unreachable, refused, protocol error: a failed listing
            self.error = f"could not list the tools of MCP server {self.label!r}: {type(exc).__name__}"
            self._client = None
            return
        for tool in listed.tools:
            if self.allowed is not None and tool.name not in self.allowed:
                continue
            self.tools.append(
                {
                    "name": tool.name,
                    "description": tool.description or "",
                    "input_schema": dict(tool.input_schema or {"type": "object"}),
                    "annotations": None,
                }
            )

    def declarations(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "name": mcp_function_name(self.label, t["name"]),
                "description": t["description"],
                "parameters": t["input_schema"],
            }
            for t in self.tools
        ]

    def executors(self, call_timeout: float) -> dict[str, Executor]:
        out: dict[str, Executor] = {}
        for tool in self.tools:
            name = tool["name"]

            async def run(arguments: dict[str, Any], name: str = name) -> Outcome:
                if self._client is None:
                    return Outcome(None, f"MCP server {self.label!r} is not connected")
                result = await self._client.call_tool(name, arguments, read_timeout_seconds=call_timeout)
                text = "\n".join(getattr(block, "text", "") for block in result.content if getattr(block, "text", None))
                if result.is_error:
                    return Outcome(None, text or f"MCP tool {name!r} failed")
                if not text and result.structured_content is not None:
                    text = orjson.dumps(result.structured_content).decode()
                return Outcome(text)

            out[mcp_function_name(self.label, name)] = Executor(server_label=self.label, public_name=name, run=run)
        return out

    def list_item(self) -> dict[str, Any]:
        item: dict[str, Any] = {
            "type": "mcp_list_tools",
            "id": "mcpl_" + uuid.uuid4().hex,
            "server_label": self.label,
            "tools": self.tools,
        }
        if self.error is not None:
            item["error"] = self.error
        return item


def list_tools_events(item: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """The public lifecycle of an MCP tool listing at ``index``."""
    added = dict(item, tools=[])
    added.pop("error", None)
    ending = "response.mcp_list_tools.failed" if item.get("error") else "response.mcp_list_tools.completed"
    return [
        {"type": "response.output_item.added", "output_index": index, "item": added},
        {"type": "response.mcp_list_tools.in_progress", "output_index": index, "item_id": item["id"]},
        {"type": ending, "output_index": index, "item_id": item["id"]},
        {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
    ]


def mcp_call_item(call_id: str, executor: Executor, arguments: str, outcome: Outcome | None) -> dict[str, Any]:
    """The public ``mcp_call`` item of a gateway call (the item of a server-run call)."""
    item: dict[str, Any] = {
        "type": "mcp_call",
        "id": "mcp_" + fnv1a_hex(call_id),
        "server_label": executor.server_label,
        "name": executor.public_name,
        "arguments": arguments,
        "status": "in_progress",
    }
    if outcome is not None:
        item["output"] = outcome.output
        item["error"] = None
        if outcome.error is not None:
            # the public (openai ≥ 3) shape of a tool that failed while executing
            item["error"] = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": outcome.error}]}
        item["status"] = "failed" if outcome.error is not None else "completed"
    return item


def mcp_call_events(item: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """The public lifecycle of a finished gateway call at ``index``."""
    item_id = item["id"]
    added = {k: v for k, v in item.items() if k not in ("output", "error")}
    added.update(arguments="", status="in_progress")
    failed = item.get("status") == "failed"
    return [
        {"type": "response.output_item.added", "output_index": index, "item": added},
        {"type": "response.mcp_call.in_progress", "output_index": index, "item_id": item_id},
        {"type": "response.mcp_call_arguments.delta", "output_index": index, "item_id": item_id, "delta": item["arguments"]},
        {"type": "response.mcp_call_arguments.done", "output_index": index, "item_id": item_id, "arguments": item["arguments"]},
        {
            "type": "response.mcp_call.failed" if failed else "response.mcp_call.completed",
            "output_index": index,
            "item_id": item_id,
        },
        {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
    ]


async def run_calls(
    calls: list[tuple[Executor, str, str]],
    *,
    concurrency: int,
    timeout: float,
    label: Callable[[str], str] = lambda name: name,
    observe: Callable[[str, str, float], None] | None = None,
) -> list[Outcome]:
    """Run ``(executor, name, arguments JSON)`` calls concurrently (bounded), each with a timeout.

    A call that raises, times out or gets arguments that are not a JSON object gives an
    error outcome; the others are unaffected.
    """
    gate = asyncio.Semaphore(concurrency)

    async def one(executor: Executor, name: str, arguments: str) -> Outcome:
        try:
            parsed = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            return Outcome(None, f"tool {name!r} got arguments that are not JSON")
        if not isinstance(parsed, dict):
            return Outcome(None, f"tool {name!r} needs a JSON object as arguments")
        async with gate:
            tool = label(name)
            started = time.perf_counter()
            result = "error"
            with start_span("tool call", attributes={"respflow.tool": tool}) as span:
                try:
                    async with asyncio.timeout(timeout):
                        outcome = await executor.run(parsed)
                    result = "ok" if outcome.error is None else "error"
                    return outcome
                except TimeoutError:
                    result = "timeout"
                    return Outcome(None, f"tool {name!r} timed out after {timeout:g} s")
                except Exception as exc:
                    return Outcome(None, wire_text(f"tool {name!r} failed: {type(exc).__name__}: {str(exc)[:300]}"))
                finally:
                    span.set_attribute("respflow.tool.result", result)
                    if observe is not None:
                        observe(tool, result, time.perf_counter() - started)

    return list(await asyncio.gather(*(one(e, n, a) for e, n, a in calls)))
