"""Tool declarations → what each model-visible function name really is.

Upstream (vLLM) knows only ``type: "function"`` tools. A request's ``tools`` array, as the
client sends it, may hold functions, custom tools (free-form ``input``), namespace groups (Codex
``{"type": "namespace", "name": NS, "tools": [functions]}``), client-run built-ins (``shell``,
``local_shell``, ``apply_patch``, ``tool_search``) and hosted tools a server runs (web_search,
file_search, code_interpreter, image_generation, mcp). Every declared tool has ONE fate,
decided here (`tool_fate`), never a silent one:

| fate | types | upstream sees | the client sees |
|---|---|---|---|
| client | function, custom, namespace | a function (custom: one ``input`` string; namespace members by a flat name) | its call in the public shape |
| client built-in | shell, local_shell, apply_patch, tool_search | a function with the built-in's parameters | a ``shell_call`` / ``local_shell_call`` / ``apply_patch_call`` / ``tool_search_call`` item |
| gateway | the gateway's own functions, mcp servers, hosted types with an executor | a function | the call's public item (``mcp_call``, ``web_search_call``, …), run between rounds |
| dropped | a hosted type with no executor (policy ``drop``, the default) | nothing | its declaration echoed in ``response.tools``; a call to it anyway is a failed tool output |
| refused | a hosted type with no executor under policy ``reject``; any other type | — | HTTP 400 naming the tool |

(Without a gateway — ``respflow fold``/``relay`` of a recording — hosted types keep the route
they had upstream: gateway-owned, withheld from the client.) `ToolRegistry` is built once per
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

# hosted tool types (a server runs them), with the function name the model sees
GATEWAY_BUILTINS: dict[str, str] = {
    "web_search": "web_search",
    "web_search_preview": "web_search",
    "file_search": "file_search",
    "code_interpreter": "code_interpreter",
    "image_generation": "image_generation",
}
HOSTED_TYPES = frozenset(GATEWAY_BUILTINS)

HostedPolicy = str
"""What a gateway does with a hosted tool it has no executor for: ``"drop"`` or ``"reject"``."""


class ToolKind(enum.Enum):
    """Who owns a model-visible function name, and which public shape its calls take."""

    FUNCTION = "function"
    CUSTOM = "custom"
    NAMESPACE = "namespace"
    BUILTIN = "builtin"
    """A client-run built-in (shell, local_shell, apply_patch, tool_search): its call is shown
    as that built-in's item, built from the arguments once the call is done."""
    GATEWAY = "gateway"


def _string_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else ([value] if isinstance(value, str) and value else [])


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class BuiltinKind:
    """A client-run built-in tool: the function upstream sees, the item the client sees."""

    tool_type: str
    function: str
    item_type: str
    id_prefix: str
    output_type: str
    parameters: dict[str, Any]
    description: str

    def item(self, arguments: Any, *, item_id: str, call_id: str, status: str) -> dict[str, Any]:
        """The public item of a call with these (parsed) ``arguments``."""
        args = arguments if isinstance(arguments, dict) else {}
        item: dict[str, Any] = {"type": self.item_type, "id": item_id, "call_id": call_id, "status": status}
        if self.tool_type == "shell":
            item["action"] = {
                "commands": _string_list(args.get("commands")),
                "timeout_ms": _optional_int(args.get("timeout_ms")),
                "max_output_length": _optional_int(args.get("max_output_length")),
            }
        elif self.tool_type == "local_shell":
            env = args.get("env")
            action: dict[str, Any] = {
                "type": "exec",
                "command": _string_list(args.get("command")),
                "env": {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
            }
            for key in ("timeout_ms", "working_directory", "user"):
                if args.get(key) is not None:
                    action[key] = args[key]
            item["action"] = action
        elif self.tool_type == "apply_patch":
            given = args.get("operation")
            op: dict[str, Any] = given if isinstance(given, dict) else args
            kind = op.get("type") if op.get("type") in ("create_file", "update_file", "delete_file") else "update_file"
            operation: dict[str, Any] = {"type": kind, "path": str(op.get("path", ""))}
            if kind != "delete_file":
                operation["diff"] = str(op.get("diff", ""))
            item["operation"] = operation
            if status == "incomplete":
                item["status"] = "in_progress"  # apply_patch_call knows no "incomplete"
        else:  # tool_search
            item["arguments"] = args
            item["execution"] = "client"
        return item

    def arguments(self, item: dict[str, Any]) -> dict[str, Any]:
        """The function arguments that would have produced this public item (continuations)."""
        given = item.get("action")
        action: dict[str, Any] = given if isinstance(given, dict) else {}
        if self.tool_type == "shell":
            return {k: v for k, v in action.items() if k in ("commands", "timeout_ms", "max_output_length") and v is not None}
        if self.tool_type == "local_shell":
            return {k: v for k, v in action.items() if k != "type" and v is not None}
        if self.tool_type == "apply_patch":
            return {"operation": item.get("operation") or {}}
        arguments = item.get("arguments")
        return arguments if isinstance(arguments, dict) else {}


_COMMANDS = {"type": "array", "items": {"type": "string"}}
CLIENT_BUILTINS: dict[str, BuiltinKind] = {
    kind.tool_type: kind
    for kind in (
        BuiltinKind(
            "shell",
            "shell",
            "shell_call",
            "sh_",
            "shell_call_output",
            {
                "type": "object",
                "properties": {
                    "commands": {**_COMMANDS, "description": "Shell commands to run, in order."},
                    "timeout_ms": {"type": "integer"},
                    "max_output_length": {"type": "integer"},
                },
                "required": ["commands"],
            },
            "Run shell commands on the user's machine.",
        ),
        BuiltinKind(
            "local_shell",
            "local_shell",
            "local_shell_call",
            "lsh_",
            "local_shell_call_output",
            {
                "type": "object",
                "properties": {
                    "command": {**_COMMANDS, "description": "The command and its arguments."},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "timeout_ms": {"type": "integer"},
                    "working_directory": {"type": "string"},
                },
                "required": ["command"],
            },
            "Run a command in the user's local shell.",
        ),
        BuiltinKind(
            "apply_patch",
            "apply_patch",
            "apply_patch_call",
            "apc_",
            "apply_patch_call_output",
            {
                "type": "object",
                "properties": {
                    "operation": {
                        "type": "object",
                        "properties": {
                            "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
                            "path": {"type": "string"},
                            "diff": {"type": "string"},
                        },
                        "required": ["type", "path"],
                    }
                },
                "required": ["operation"],
            },
            "Create, update or delete a file with a V4A diff.",
        ),
        BuiltinKind(
            "tool_search",
            "tool_search",
            "tool_search_call",
            "tsc_",
            "tool_search_output",
            {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
            "Search the available tools; the client answers with the tools it found.",
        ),
    )
}
BUILTIN_ITEMS = {kind.item_type: kind for kind in CLIENT_BUILTINS.values()}
BUILTIN_OUTPUTS = {kind.output_type: kind for kind in CLIENT_BUILTINS.values()}

CLIENT_TYPES = frozenset({"function", "custom", "namespace", *CLIENT_BUILTINS})
GATEWAY_TYPES = frozenset({"mcp"})
"""Types the gateway expands itself (MCP servers: their tools are listed and run by it)."""


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
        hosted: Iterable[str] | None = None,
        hosted_policy: HostedPolicy = "drop",
    ) -> None:
        """Build the routes.

        Args:
            tools: the request's ``tools`` array as the client sent it.
            gateway_functions: function declarations of tools the embedding gateway runs
                itself (registered Python callables, MCP members, hosted executors); calls to
                them are withheld from the client.
            hosted: the hosted tool types this gateway has an executor for (their
                declarations come in ``gateway_functions``); None outside a gateway (fold,
                relay: hosted types keep their upstream route, withheld).
            hosted_policy: a hosted type with no executor is dropped (``"drop"``: not
                advertised upstream, echoed in ``response.tools``) or refused (``"reject"``).

        Raises:
            TranslateError: a malformed declaration, two tools with one model-visible name
                (``tool_name_collision``), a tool this gateway refuses (``unsupported_tool``).
        """
        if hosted_policy not in ("drop", "reject"):
            raise ValueError(f"hosted_policy must be 'drop' or 'reject', not {hosted_policy!r}")
        self.declared: list[Any] = list(tools or [])
        """The tools array exactly as the client sent it."""
        self.public_tools: list[Any] = [_public_declaration(t) for t in self.declared]
        """The same, with fields clients require filled in: what ``response.tools`` echoes."""
        self.dropped: list[str] = []
        """Hosted tool types declared but not advertised upstream (no executor here)."""
        self.unavailable: set[str] = set()
        """Model-visible names of dropped hosted tools: a call to one is a failed tool output."""
        self._routes: dict[str, ToolRoute] = {}
        self._upstream: list[dict[str, Any]] = []
        available = set(hosted) if hosted is not None else None
        for position, decl in enumerate(self.declared):
            if not isinstance(decl, dict) or not isinstance(decl.get("type"), str):
                raise TranslateError("each tool must be an object with a string 'type'", code="bad_tools")
            kind = decl["type"]
            if available is not None and kind in HOSTED_TYPES:
                if kind in available:
                    continue  # its executor's function comes in gateway_functions
                if hosted_policy == "reject":
                    raise TranslateError(
                        f"tools[{position}] is a {kind!r} tool, which this gateway cannot run (no executor "
                        "is configured for it); remove it from the request",
                        code="unsupported_tool",
                    )
                if kind not in self.dropped:
                    self.dropped.append(kind)
                name = GATEWAY_BUILTINS[kind]
                self.unavailable.add(name)
                self._routes.setdefault(name, ToolRoute(ToolKind.GATEWAY, name, None, decl))
                continue
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
            elif kind in CLIENT_BUILTINS:
                builtin = CLIENT_BUILTINS[kind]
                self._add(builtin.function, ToolRoute(ToolKind.BUILTIN, builtin.function, None, builtin), builtin_function(decl, builtin))
            elif kind in GATEWAY_BUILTINS:
                name = GATEWAY_BUILTINS[kind]
                if name not in self._routes:  # web_search and web_search_preview: one function
                    self._add(name, ToolRoute(ToolKind.GATEWAY, name, None, decl), _builtin_function(name, kind))
            elif kind in GATEWAY_TYPES:
                pass  # expanded by the gateway: its tools come in gateway_functions
            elif available is not None:
                raise TranslateError(
                    f"tools[{position}] has type {kind!r}, which this gateway does not support "
                    f"(supported: {', '.join(sorted(CLIENT_TYPES | HOSTED_TYPES | GATEWAY_TYPES))})",
                    code="unsupported_tool",
                )
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
            elif kind in ("web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call"):
                hosted = hosted_call_input(item)
                assert hosted is not None
                function, hosted_args, hosted_output = hosted
                call_id = str(item.get("id") or "")
                out.append({"type": "function_call", "call_id": call_id, "name": function, "arguments": orjson.dumps(hosted_args).decode()})
                out.append({"type": "function_call_output", "call_id": call_id, "output": hosted_output})
            elif kind in BUILTIN_ITEMS:
                builtin = BUILTIN_ITEMS[kind]
                arguments = orjson.dumps(builtin.arguments(item)).decode()
                out.append({"type": "function_call", "call_id": item.get("call_id", ""), "name": builtin.function, "arguments": arguments})
            elif kind in BUILTIN_OUTPUTS:
                output = item.get("output")
                if kind == "tool_search_output":
                    output = item.get("tools", output)
                text = output if isinstance(output, str) else orjson.dumps(output).decode()
                out.append({"type": "function_call_output", "call_id": item.get("call_id", ""), "output": text})
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
        if route.kind is ToolKind.BUILTIN:
            return builtin_item(route.declaration, item)
        public = {
            "type": "custom_tool_call",
            "id": custom_id(str(item.get("id", ""))),
            "call_id": item.get("call_id", ""),
            "name": route.name,
            "input": input_from_arguments(str(item.get("arguments", ""))),
            "status": item.get("status", "completed"),
        }
        return public


def builtin_function(decl: dict[str, Any], builtin: BuiltinKind) -> dict[str, Any]:
    """A client-run built-in as the function upstream sees (a client-run tool_search may
    declare its own parameters and description)."""
    parameters = decl.get("parameters") if builtin.tool_type == "tool_search" and isinstance(decl.get("parameters"), dict) else None
    description = decl.get("description") if isinstance(decl.get("description"), str) else builtin.description
    return {"type": "function", "name": builtin.function, "description": description, "parameters": parameters or builtin.parameters}


def builtin_item(builtin: BuiltinKind, call: dict[str, Any], status: str | None = None) -> dict[str, Any]:
    """The public item of a client built-in's function call (its id ``<prefix><hash>``)."""
    try:
        arguments = orjson.loads(str(call.get("arguments") or "{}"))
    except orjson.JSONDecodeError:
        arguments = {}
    upstream_id = str(call.get("id") or call.get("call_id") or "")
    item_status = status or ("completed" if call.get("status", "completed") == "completed" else "incomplete")
    return builtin.item(
        arguments, item_id=builtin.id_prefix + fnv1a_hex(upstream_id), call_id=str(call.get("call_id", "")), status=item_status
    )


def tool_fate(decl: Any, *, hosted: Iterable[str], hosted_policy: HostedPolicy) -> str:
    """One declared tool's fate: ``client``, ``client_builtin``, ``gateway``, ``dropped`` or
    ``refused`` (the README's table of tool types is this function)."""
    kind = decl.get("type") if isinstance(decl, dict) else None
    if kind in ("function", "custom", "namespace"):
        return "client"
    if kind in CLIENT_BUILTINS:
        return "client_builtin"
    if kind in GATEWAY_TYPES:
        return "gateway"
    if kind in HOSTED_TYPES:
        if kind in set(hosted):
            return "gateway"
        return "dropped" if hosted_policy == "drop" else "refused"
    return "refused"


def _public_declaration(decl: Any) -> Any:
    if isinstance(decl, dict) and decl.get("type") == "code_interpreter" and "container" not in decl:
        return {**decl, "container": {"type": "auto"}}
    return decl


def _name(decl: dict[str, Any]) -> str:
    name = decl.get("name")
    if not isinstance(name, str) or not name:
        raise TranslateError(f"a {decl.get('type', 'tool')} tool needs a non-empty 'name'", code="bad_tools")
    return name


_HOSTED_PARAMETERS: dict[str, tuple[str, str]] = {
    # function name: (its one string parameter, what the model is told)
    "web_search": ("query", "Search the web; returns the results' text and their sources."),
    "file_search": ("query", "Search the user's files; returns the matching passages."),
    "code_interpreter": ("code", "Run Python code; returns what it printed."),
    "image_generation": ("prompt", "Generate an image from a description."),
}


def hosted_function(kind: str, description: str | None = None) -> dict[str, Any]:
    """A hosted tool type as the function the model sees (one string parameter)."""
    name = GATEWAY_BUILTINS[kind]
    param, default = _HOSTED_PARAMETERS[name]
    return {
        "type": "function",
        "name": name,
        "description": description or default,
        "parameters": {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]},
    }


def _builtin_function(name: str, kind: str) -> dict[str, Any]:
    return hosted_function(kind)


def hosted_call_input(item: dict[str, Any]) -> tuple[str, dict[str, Any], str] | None:
    """A public hosted-tool item of an earlier turn as ``(function, arguments, output)`` for
    the upstream (a continuation): the model sees what it called and what came back."""
    kind = item.get("type")
    if kind == "web_search_call":
        given = item.get("action")
        action: dict[str, Any] = given if isinstance(given, dict) else {}
        sources = [s.get("url") for s in action.get("sources") or [] if isinstance(s, dict)]
        return "web_search", {"query": action.get("query") or ""}, "sources: " + ", ".join(str(u) for u in sources)
    if kind == "file_search_call":
        queries = item.get("queries") or [""]
        results = [r.get("text") for r in item.get("results") or [] if isinstance(r, dict) and r.get("text")]
        return "file_search", {"query": str(queries[0])}, "\n".join(str(r) for r in results)
    if kind == "code_interpreter_call":
        logs = [o.get("logs") for o in item.get("outputs") or [] if isinstance(o, dict) and o.get("type") == "logs"]
        return "code_interpreter", {"code": item.get("code") or ""}, "\n".join(str(x) for x in logs)
    if kind == "image_generation_call":
        return "image_generation", {"prompt": item.get("revised_prompt") or ""}, "an image was generated"
    return None


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
