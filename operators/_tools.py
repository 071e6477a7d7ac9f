"""Tool declarations → what each model-visible function name really is.

Upstream (vLLM) knows only ``type: "function"`` tools. A request's ``tools`` array, as the
client sends it, may hold functions, custom tools (free-form ``input``), namespace groups (Codex
``{"type": "namespace", "name": NS, "tools": [functions]}``) and built-in tools the gateway runs
itself (web_search, file_search, code_interpreter, mcp, …). `ToolRegistry` is built once per
request and answers both directions:

* `upstream_tools()` — the declarations to send upstream, every one a function; a custom tool
  becomes a function with one string parameter ``input``; a namespace member gets the flat,
  model-visible name ``agentic_ns__{namespace}__{member}`` (64 characters at most: a longer one
  keeps a readable prefix and ends in a 16-hex FNV-1a fingerprint — restoration uses the map,
  never parses the name, so it round-trips whatever the length);
* `route(name)` — for a name the model called: client function, custom tool, namespace member
  (with its public namespace and name) or gateway-owned. Unknown names are client functions.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from respflow.operators._errors import TranslateError

NAMESPACE_PREFIX = "agentic_ns__"
GATEWAY_LABEL = "gateway"
"""The ``server_label`` of calls to the embedding application's own gateway tools."""
MAX_TOOL_NAME = 64
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3

# built-in tool types the gateway executes itself, with the function name the model sees
GATEWAY_BUILTINS: dict[str, str] = {
    "web_search": "web_search",
    "web_search_preview": "web_search",
    "file_search": "file_search",
    "code_interpreter": "code_interpreter",
    "image_generation": "image_generation",
}


class ToolKind(enum.Enum):
    """Who owns a model-visible function name, and which public shape its calls take."""

    FUNCTION = "function"
    CUSTOM = "custom"
    NAMESPACE = "namespace"
    GATEWAY = "gateway"


@dataclass(frozen=True, slots=True)
class ToolRoute:
    """What one model-visible name stands for."""

    kind: ToolKind
    name: str
    """The public name (the member name for a namespace member)."""
    namespace: str | None = None
    declaration: Any = None
    """The client's declaration (for gateway tools: the built-in tool or a registered one)."""


FUNCTION_ROUTE = ToolRoute(ToolKind.FUNCTION, "")


def fnv1a_hex(value: str) -> str:
    """16 hex digits of the 64-bit FNV-1a hash of ``value`` (stable across processes)."""
    h = _FNV_OFFSET
    for byte in value.encode():
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def bounded_name(name: str) -> str:
    """``name`` if it fits upstream's 64-character limit, else a readable prefix plus a
    16-hex fingerprint of the whole name (exactly 64 characters)."""
    if len(name) <= MAX_TOOL_NAME:
        return name
    suffix = "__" + fnv1a_hex(name)
    return name[: MAX_TOOL_NAME - len(suffix)] + suffix


def mcp_function_name(label: str, tool: str) -> str:
    """The model-visible name of a tool of the MCP server ``label`` (64 characters at most)."""
    return bounded_name(f"mcp__{label}__{tool}")


def flat_name(namespace: str, member: str) -> str:
    """The model-visible name of a namespace member (at most 64 characters)."""
    return bounded_name(f"{NAMESPACE_PREFIX}{namespace}__{member}")


def custom_function(decl: dict[str, Any]) -> dict[str, Any]:
    """A custom tool as the function upstream sees: one string parameter ``input``."""
    fn: dict[str, Any] = {
        "type": "function",
        "name": decl["name"],
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string"}},
            "required": ["input"],
            "additionalProperties": False,
        },
    }
    description = decl.get("description")
    fmt = decl.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        grammar = f"Input must match this {fmt.get('syntax', '')} grammar: {fmt.get('definition', '')}"
        description = f"{description}\n\n{grammar}" if description else grammar
    if description:
        fn["description"] = description
    return fn


class ToolRegistry:
    """The tool routes of one request."""

    def __init__(
        self,
        tools: Iterable[Any] | None = None,
        *,
        gateway_functions: Iterable[dict[str, Any]] = (),
    ) -> None:
        """Build the routes.

        Args:
            tools: the request's ``tools`` array as the client sent it.
            gateway_functions: function declarations of tools the embedding gateway runs
                itself (registered Python callables, MCP members); calls to them are withheld
                from the client.

        Raises:
            TranslateError: a malformed declaration, or two tools with one model-visible name.
        """
        self.declared: list[Any] = list(tools or [])
        """The tools array exactly as the client sent it."""
        self.public_tools: list[Any] = [_public_declaration(t) for t in self.declared]
        """The same, with fields clients require filled in: what ``response.tools`` echoes."""
        self._routes: dict[str, ToolRoute] = {}
        self._upstream: list[dict[str, Any]] = []
        for decl in self.declared:
            if not isinstance(decl, dict) or not isinstance(decl.get("type"), str):
                raise TranslateError("each tool must be an object with a string 'type'", code="bad_tools")
            kind = decl["type"]
            if kind == "function":
                self._add(_name(decl), ToolRoute(ToolKind.FUNCTION, _name(decl), None, decl), decl)
            elif kind == "custom":
                name = _name(decl)
                self._add(name, ToolRoute(ToolKind.CUSTOM, name, None, decl), custom_function(decl))
            elif kind == "namespace":
                namespace = _name(decl)
                members = decl.get("tools")
                if not isinstance(members, list):
                    raise TranslateError(f"namespace tool {namespace!r} needs a 'tools' array", code="bad_tools")
                for member in members:
                    if not isinstance(member, dict) or member.get("type", "function") != "function":
                        raise TranslateError(
                            f"namespace {namespace!r} may only hold function tools", code="bad_tools"
                        )
                    flat = flat_name(namespace, _name(member))
                    upstream = dict(member, type="function", name=flat)
                    self._add(flat, ToolRoute(ToolKind.NAMESPACE, _name(member), namespace, member), upstream)
            elif kind in GATEWAY_BUILTINS:
                name = GATEWAY_BUILTINS[kind]
                self._add(name, ToolRoute(ToolKind.GATEWAY, name, None, decl), _builtin_function(name, kind))
            # mcp servers and other types are expanded by the gateway (gateway_functions)
        for fn in gateway_functions:
            name = _name(fn)
            self._add(name, ToolRoute(ToolKind.GATEWAY, name, None, fn), dict(fn, type="function"))

    def _add(self, name: str, route: ToolRoute, upstream: dict[str, Any]) -> None:
        if name in self._routes:
            raise TranslateError(
                f"two tools share the model-visible name {name[:64]!r}", code="tool_name_collision"
            )
        self._routes[name] = route
        self._upstream.append(upstream)

    @property
    def rewrites(self) -> bool:
        """True if any call needs restoring (custom, namespace or gateway tools declared)."""
        return any(r.kind is not ToolKind.FUNCTION for r in self._routes.values())

    def route(self, name: str) -> ToolRoute:
        """The route of a model-visible name; unknown names are client functions."""
        return self._routes.get(name) or ToolRoute(ToolKind.FUNCTION, name)

    def upstream_tools(self) -> list[dict[str, Any]]:
        """The tools array to send upstream: every tool as a function."""
        return [dict(t) for t in self._upstream]

    def upstream_tool_choice(self, choice: Any) -> Any:
        """A request's ``tool_choice`` as upstream must see it: a custom tool or a namespace
        member is chosen as the function it became; anything else is untouched."""
        if not isinstance(choice, dict):
            return choice
        if choice.get("type") == "custom" and isinstance(choice.get("name"), str):
            return {"type": "function", "name": choice["name"]}
        if choice.get("type") == "function" and choice.get("namespace") and isinstance(choice.get("name"), str):
            return {"type": "function", "name": flat_name(str(choice["namespace"]), choice["name"])}
        return choice

    def upstream_input(self, items: list[Any]) -> list[Any]:
        """A request's input items as upstream must see them (the reverse of `restore_item`).

        A continuation turn replays public items: ``custom_tool_call`` (and its output) becomes
        a ``function_call`` with ``{"input": …}`` arguments (and a ``function_call_output``); a
        namespaced ``function_call`` gets its flat model-visible name; a server-side ``mcp_call``
        becomes the call and its output, so the model keeps the context; ``mcp_list_tools``
        items are dropped (upstream gets the tools as declarations). Anything else is untouched.
        """
        out: list[Any] = []
        for item in items:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "custom_tool_call":
                out.append(
                    {
                        "type": "function_call",
                        "call_id": item.get("call_id", ""),
                        "name": item.get("name", ""),
                        "arguments": orjson.dumps({"input": item.get("input", "")}).decode(),
                    }
                )
            elif kind == "custom_tool_call_output":
                out.append({"type": "function_call_output", "call_id": item.get("call_id", ""), "output": item.get("output", "")})
            elif kind == "function_call" and item.get("namespace"):
                flat = flat_name(str(item["namespace"]), str(item.get("name", "")))
                out.append({k: v for k, v in item.items() if k != "namespace"} | {"name": flat})
            elif kind == "mcp_call":
                call_id = str(item.get("id") or "")
                name = str(item.get("name", ""))
                label = item.get("server_label")
                if label != GATEWAY_LABEL and isinstance(label, str):
                    name = mcp_function_name(label, name)
                out.append({"type": "function_call", "call_id": call_id, "name": name, "arguments": item.get("arguments") or "{}"})
                error = item.get("error")
                output = item.get("output") if not error else f"ERROR: {orjson.dumps(error).decode()}"
                out.append({"type": "function_call_output", "call_id": call_id, "output": output or ""})
            elif kind == "mcp_list_tools":
                continue
            else:
                out.append(item)
        return out

    def restore_item(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """A final output item in its public shape; None for a withheld gateway call."""
        if item.get("type") != "function_call":
            return item
        route = self.route(str(item.get("name", "")))
        if route.kind is ToolKind.FUNCTION:
            return item
        if route.kind is ToolKind.GATEWAY:
            return None
        if route.kind is ToolKind.NAMESPACE:
            return dict(item, name=route.name, namespace=route.namespace)
        public = {
            "type": "custom_tool_call",
            "id": custom_id(str(item.get("id", ""))),
            "call_id": item.get("call_id", ""),
            "name": route.name,
            "input": input_from_arguments(str(item.get("arguments", ""))),
            "status": item.get("status", "completed"),
        }
        return public


def _public_declaration(decl: Any) -> Any:
    if isinstance(decl, dict) and decl.get("type") == "code_interpreter" and "container" not in decl:
        return {**decl, "container": {"type": "auto"}}
    return decl


def _name(decl: dict[str, Any]) -> str:
    name = decl.get("name")
    if not isinstance(name, str) or not name:
        raise TranslateError(f"a {decl.get('type', 'tool')} tool needs a non-empty 'name'", code="bad_tools")
    return name


def _builtin_function(name: str, kind: str) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": True}
    if name in ("web_search", "file_search"):
        params = {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        }
    elif name == "code_interpreter":
        params = {
            "type": "object",
            "properties": {"code": {"type": "string"}},
            "required": ["code"],
        }
    return {"type": "function", "name": name, "description": f"The {kind} tool.", "parameters": params}


def custom_id(upstream_id: str) -> str:
    """The public id of a custom tool call: ``ctc_<suffix>`` for ``fc_<suffix>``."""
    if upstream_id.startswith("ctc_"):
        return upstream_id
    if upstream_id.startswith("fc_"):
        return "ctc_" + upstream_id[3:]
    return "ctc_" + fnv1a_hex(upstream_id)


def input_from_arguments(arguments: str) -> str:
    """A custom tool's input from the function arguments the model produced.

    A JSON object → its ``input`` string; a JSON string → itself; anything else → the raw text.
    """
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments
