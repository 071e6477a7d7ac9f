"""Output items: the public pydantic types, and the ONE table of per-kind fold behaviour.

Each item kind has a `KindSpec` (a descriptor): ``from_added`` builds the item being streamed,
``appends`` names the buffer each ``*.delta`` sub-event's text goes to and ``deltas`` folds
every other sub-event into it, ``apply_done`` merges the authoritative done item over it (with
the per-kind fallbacks for empty fields) and ``finalize`` turns a still-active item into its
final shape at the end of the stream (or drops it). Adding an item kind means adding one entry
to `KINDS`; nothing else in the pipeline names kinds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Discriminator, JsonValue, Tag, TypeAdapter

# ---- public item types (boundary types: validated once per item, never per token) ---------


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class OutputTextPart(_Open):
    type: Literal["output_text"]
    text: str
    annotations: list[JsonValue] = []


class RefusalPart(_Open):
    type: Literal["refusal"]
    refusal: str


class MessageItem(_Open):
    type: Literal["message"]
    id: str
    role: Literal["assistant"] = "assistant"
    status: str = "completed"
    content: list[JsonValue]


class ReasoningItem(_Open):
    type: Literal["reasoning"]
    id: str
    summary: list[JsonValue] = []


class FunctionCallItem(_Open):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str


class CustomToolCallItem(_Open):
    type: Literal["custom_tool_call"]
    id: str
    call_id: str
    name: str
    input: str


class RawItem(_Open):
    """Any other item kind: kept as received, unknown fields included."""

    type: str
    id: str | None = None


def _item_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) and kind in _TYPED else "raw"


_TYPED = {"message", "reasoning", "function_call", "custom_tool_call"}

OutputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[RawItem, Tag("raw")],
    Discriminator(_item_tag),
]
"""One element of ``Response.output``."""

OUTPUT_ITEM: TypeAdapter[OutputItem] = TypeAdapter(OutputItem)


# ---- the fold state of one item -----------------------------------------------------------


class Building:
    """An item while it streams: the item dict plus its delta buffers."""

    __slots__ = ("chunks", "item", "parts", "summary")

    def __init__(self, item: dict[str, Any]) -> None:
        self.item = item
        self.chunks: list[str] = []  # arguments / input / code deltas
        self.parts: dict[int, _Part] = {}  # message content / reasoning content by index
        self.summary: dict[int, _Part] = {}  # reasoning summary by index

    def buffered(self) -> str:
        """The concatenated argument/input/code deltas."""
        if len(self.chunks) > 1:
            self.chunks = ["".join(self.chunks)]
        return self.chunks[0] if self.chunks else ""


class _Part:
    __slots__ = ("chunks", "complete", "part", "streamed")

    def __init__(self, part: dict[str, Any]) -> None:
        self.part = part
        self.chunks: list[str] = []
        self.streamed = False
        self.complete = False

    def text(self) -> str:
        if len(self.chunks) > 1:
            self.chunks = ["".join(self.chunks)]
        return self.chunks[0] if self.chunks else ""


def new_id(prefix: str) -> str:
    """A fresh public item id with the kind's customary prefix."""
    return f"{prefix}{uuid.uuid4().hex}"


# ---- per-kind behaviour ---------------------------------------------------------------------


DeltaFn = Callable[["Building", dict[str, Any]], int]
"""Folds one sub-event into the building item; returns the characters it newly retained."""

BufferFn = Callable[["Building", dict[str, Any]], list[str]]
"""Where the text of a ``*.delta`` sub-event goes: the chunk list of its part (which it marks
streamed) or of the item. The fold appends a whole run of deltas to one buffer."""


@dataclass(frozen=True, slots=True)
class KindSpec:
    """How one item kind is folded.

    ``appends`` maps each ``*.delta`` sub-event type of the kind to the buffer its text goes
    to; ``deltas`` maps every other sub-event type that changes the item (done texts, parts,
    annotations) to the function that folds it. Sub-events in neither are status only. Both are
    dicts: one lookup per token instead of a chain of comparisons.
    """

    kind: str
    id_prefix: str
    from_added: Callable[[dict[str, Any]], Building]
    deltas: Mapping[str, DeltaFn]
    apply_done: Callable[[Building, dict[str, Any]], dict[str, Any]]
    finalize: Callable[[Building], dict[str, Any] | None]
    call_like: bool = False  # carries a call_id that must stay stable
    appends: Mapping[str, BufferFn] = field(default_factory=dict)


def _copy_added(item: dict[str, Any]) -> Building:
    return Building(dict(item))


_NO_DELTAS: Mapping[str, DeltaFn] = {}


def _replace(b: Building, done: dict[str, Any]) -> dict[str, Any]:
    merged = dict(done)
    if not merged.get("id") and b.item.get("id"):
        merged["id"] = b.item["id"]
    return merged


def _as_added(b: Building) -> dict[str, Any]:
    return b.item


def _drop(b: Building) -> dict[str, Any] | None:
    return None


# message ---------------------------------------------------------------------------------


def _message_added(item: dict[str, Any]) -> Building:
    b = Building(dict(item))
    b.item.pop("content", None)
    return b


def _part_at(parts: dict[int, _Part], index: Any, default_type: str) -> _Part:
    key = index if isinstance(index, int) else 0
    part = parts.get(key)
    if part is None:
        part = parts[key] = _Part({"type": default_type})
    return part


def _text_buffer(b: Building, data: dict[str, Any]) -> list[str]:
    p = b.parts.get(data.get("content_index", 0))
    if p is None:
        p = _part_at(b.parts, data.get("content_index"), "output_text")
    p.streamed = True
    return p.chunks


def _text_done(b: Building, data: dict[str, Any]) -> int:
    p = _part_at(b.parts, data.get("content_index"), "output_text")
    if not p.streamed:
        p.chunks = [data.get("text") or ""]
    return 0


def _refusal_buffer(b: Building, data: dict[str, Any]) -> list[str]:
    p = _part_at(b.parts, data.get("content_index"), "refusal")
    p.part["type"] = "refusal"
    p.streamed = True
    return p.chunks


def _refusal_done(b: Building, data: dict[str, Any]) -> int:
    p = _part_at(b.parts, data.get("content_index"), "refusal")
    p.part["type"] = "refusal"
    if not p.streamed:
        p.chunks = [data.get("refusal") or ""]
    return 0


def _part_event(done: bool) -> DeltaFn:
    def apply(b: Building, data: dict[str, Any]) -> int:
        part = data.get("part")
        p = _part_at(b.parts, data.get("content_index"), "output_text")
        if isinstance(part, dict):
            text = part.get("text", part.get("refusal"))
            p.part = {k: v for k, v in part.items() if k not in ("text", "refusal")}
            if done:
                p.complete = True
                if not p.streamed and isinstance(text, str):
                    p.chunks = [text]
        return 0

    return apply


def _annotation(b: Building, data: dict[str, Any]) -> int:
    p = _part_at(b.parts, data.get("content_index"), "output_text")
    annotations = p.part.setdefault("annotations", [])
    if isinstance(annotations, list) and "annotation" in data:
        annotations.append(data["annotation"])
    return 0


_MESSAGE_APPENDS: Mapping[str, BufferFn] = {
    "response.output_text.delta": _text_buffer,
    "response.refusal.delta": _refusal_buffer,
}
_MESSAGE_DELTAS: Mapping[str, DeltaFn] = {
    "response.output_text.done": _text_done,
    "response.refusal.done": _refusal_done,
    "response.content_part.added": _part_event(False),
    "response.content_part.done": _part_event(True),
    "response.output_text.annotation.added": _annotation,
}


def _message_parts(b: Building) -> list[dict[str, Any]]:
    content = []
    for _, p in sorted(b.parts.items()):
        part = dict(p.part)
        text = p.text()
        if part.get("type") == "refusal":
            part["refusal"] = text
        else:
            part.setdefault("type", "output_text")
            part["text"] = text
            if part["type"] == "output_text":
                part.setdefault("annotations", [])
                if part.get("logprobs") is None:
                    part.pop("logprobs", None)
        content.append(part)
    return content


def _message_done(b: Building, done: dict[str, Any]) -> dict[str, Any]:
    merged = _replace(b, done)
    if "content" not in done:
        merged["content"] = _message_parts(b)
    return merged


def _message_finalize(b: Building) -> dict[str, Any] | None:
    item = dict(b.item)
    item["content"] = [p for p in _message_parts(b) if p.get("text") or p.get("refusal")]
    item["status"] = "completed"
    item.setdefault("role", "assistant")
    return item


# reasoning -------------------------------------------------------------------------------


def _reasoning_added(item: dict[str, Any]) -> Building:
    b = Building(dict(item))
    b.item.pop("content", None)
    b.item.pop("summary", None)
    return b


def _reasoning_buffer(summary: bool) -> BufferFn:
    index_key, kind = ("summary_index", "summary_text") if summary else ("content_index", "reasoning_text")

    def buffer(b: Building, data: dict[str, Any]) -> list[str]:
        parts = b.summary if summary else b.parts
        p = parts.get(data.get(index_key, 0))
        if p is None:
            p = _part_at(parts, data.get(index_key), kind)
        p.streamed = True
        return p.chunks

    return buffer


def _reasoning_text_done(summary: bool) -> DeltaFn:
    index_key, kind = ("summary_index", "summary_text") if summary else ("content_index", "reasoning_text")

    def done(b: Building, data: dict[str, Any]) -> int:
        p = _part_at(b.summary if summary else b.parts, data.get(index_key), kind)
        text = data.get("text")
        if isinstance(text, str) and (text or not p.streamed):
            p.chunks = [text]
        return 0

    return done


def _reasoning_part_done(summary: bool) -> DeltaFn:
    index_key = "summary_index" if summary else "content_index"

    def apply(b: Building, data: dict[str, Any]) -> int:
        p = _part_at(b.summary if summary else b.parts, data.get(index_key), "")
        part = data.get("part")
        if isinstance(part, dict) and isinstance(part.get("text"), str) and not p.streamed:
            p.chunks = [part["text"]]
        return 0

    return apply


_REASONING_APPENDS: Mapping[str, BufferFn] = {
    "response.reasoning_text.delta": _reasoning_buffer(False),
    "response.reasoning_summary_text.delta": _reasoning_buffer(True),
}
_REASONING_DELTAS: Mapping[str, DeltaFn] = {
    "response.reasoning_text.done": _reasoning_text_done(False),
    "response.reasoning_summary_text.done": _reasoning_text_done(True),
    "response.content_part.done": _reasoning_part_done(False),
    "response.reasoning_summary_part.done": _reasoning_part_done(True),
}


def _reasoning_lists(b: Building) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    content = [
        {"type": "reasoning_text", "text": p.text()} for _, p in sorted(b.parts.items()) if p.text()
    ]
    summary = [
        {"type": "summary_text", "text": p.text()} for _, p in sorted(b.summary.items()) if p.text()
    ]
    return content, summary


def _reasoning_done(b: Building, done: dict[str, Any]) -> dict[str, Any]:
    merged = _replace(b, done)
    content, summary = _reasoning_lists(b)
    if merged.get("content") is None:
        if content:
            merged["content"] = content
        else:
            merged.pop("content", None)
    if merged.get("summary") is None:
        merged["summary"] = summary
    if "encrypted_content" in merged and merged["encrypted_content"] is None:
        del merged["encrypted_content"]
    return merged


def _reasoning_finalize(b: Building) -> dict[str, Any] | None:
    item = dict(b.item)
    content, summary = _reasoning_lists(b)
    if content:
        item["content"] = content
    item["summary"] = summary
    item["status"] = "completed"
    return item


# calls (function, custom, mcp) -------------------------------------------------------------


def _call_added(field: str) -> Callable[[dict[str, Any]], Building]:
    def added(item: dict[str, Any]) -> Building:
        b = Building(dict(item))
        b.item.setdefault("call_id", "")
        b.item.setdefault("name", "")
        # vLLM (one revision) repeats the first chunk in the added item: deltas are the truth.
        b.item[field] = ""
        return b

    return added


def _own_chunks(b: Building, data: dict[str, Any]) -> list[str]:
    """The item's own buffer: call arguments / custom input / code."""
    return b.chunks


def _call_deltas(field: str, done_type: str) -> Mapping[str, DeltaFn]:
    def done(b: Building, data: dict[str, Any]) -> int:
        value = data.get(field)
        if isinstance(value, str) and value:
            b.item[field] = value
        for key in ("call_id", "name"):
            v = data.get(key)
            if isinstance(v, str) and v:
                b.item[key] = v
        return 0

    return {done_type: done}


def _call_value(b: Building, field: str) -> str:
    own = b.item.get(field)
    return own if isinstance(own, str) and own else b.buffered()


def _call_done(field: str) -> Callable[[Building, dict[str, Any]], dict[str, Any]]:
    def done_(b: Building, done: dict[str, Any]) -> dict[str, Any]:
        merged = dict(done)
        for key in ("id", "call_id", "name"):
            if not merged.get(key) and b.item.get(key):
                merged[key] = b.item[key]
        if "namespace" not in merged and "namespace" in b.item:
            merged["namespace"] = b.item["namespace"]
        value = merged.get(field)
        if not (isinstance(value, str) and value):
            merged[field] = _call_value(b, field)
        return merged

    return done_


def _call_finalize(field: str) -> Callable[[Building], dict[str, Any] | None]:
    def finalize(b: Building) -> dict[str, Any] | None:
        item = dict(b.item)
        item[field] = _call_value(b, field)
        item["status"] = "completed"
        return item

    return finalize


def _call_spec(kind: str, prefix: str, field: str, delta_type: str, done_type: str) -> KindSpec:
    return KindSpec(
        kind,
        prefix,
        _call_added(field),
        _call_deltas(field, done_type),
        _call_done(field),
        _call_finalize(field),
        call_like=kind != "mcp_call",
        appends={delta_type: _own_chunks},
    )


# code interpreter ---------------------------------------------------------------------------


def _code_code_done(b: Building, data: dict[str, Any]) -> int:
    if isinstance(data.get("code"), str):
        b.chunks = [data["code"]]
    return 0


_CODE_DELTAS: Mapping[str, DeltaFn] = {
    "response.code_interpreter_call_code.done": _code_code_done,
}


def _code_done(b: Building, done: dict[str, Any]) -> dict[str, Any]:
    merged = _replace(b, done)
    if not merged.get("code") and b.buffered():
        merged["code"] = b.buffered()
    return merged


def _web_search_done(b: Building, done: dict[str, Any]) -> dict[str, Any]:
    merged = _replace(b, done)
    action = merged.get("action")
    sources = action.get("sources") if isinstance(action, dict) else None
    if isinstance(sources, list) and any(isinstance(s, dict) and "type" not in s for s in sources):
        # gpt-oss omits the source type; the public shape requires it
        merged["action"] = dict(action, sources=[_url_source(s) for s in sources])  # type: ignore[arg-type]
    return merged


def _url_source(source: Any) -> Any:
    if isinstance(source, dict) and "type" not in source and "url" in source:
        return {"type": "url", **source}
    return source


def _passive(kind: str, prefix: str, *, keep_unfinished: bool) -> KindSpec:
    """Items whose sub-events are status only; the done item is the item."""
    return KindSpec(
        kind, prefix, _copy_added, _NO_DELTAS, _replace, _as_added if keep_unfinished else _drop
    )


KINDS: dict[str, KindSpec] = {
    spec.kind: spec
    for spec in (
        KindSpec(
            "message",
            "msg_",
            _message_added,
            _MESSAGE_DELTAS,
            _message_done,
            _message_finalize,
            appends=_MESSAGE_APPENDS,
        ),
        KindSpec(
            "reasoning",
            "rs_",
            _reasoning_added,
            _REASONING_DELTAS,
            _reasoning_done,
            _reasoning_finalize,
            appends=_REASONING_APPENDS,
        ),
        _call_spec(
            "function_call",
            "fc_",
            "arguments",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
        ),
        _call_spec(
            "custom_tool_call",
            "ctc_",
            "input",
            "response.custom_tool_call_input.delta",
            "response.custom_tool_call_input.done",
        ),
        _call_spec(
            "mcp_call",
            "mcp_",
            "arguments",
            "response.mcp_call_arguments.delta",
            "response.mcp_call_arguments.done",
        ),
        KindSpec(
            "code_interpreter_call",
            "ci_",
            _copy_added,
            _CODE_DELTAS,
            _code_done,
            _drop,
            appends={"response.code_interpreter_call_code.delta": _own_chunks},
        ),
        KindSpec("web_search_call", "ws_", _copy_added, _NO_DELTAS, _web_search_done, _drop),
        _passive("file_search_call", "fs_", keep_unfinished=False),
        _passive("image_generation_call", "ig_", keep_unfinished=False),
        _passive("mcp_list_tools", "mcpl_", keep_unfinished=True),
        _passive("mcp_approval_request", "mcpr_", keep_unfinished=True),
        _passive("tool_search_call", "tsc_", keep_unfinished=True),
        _passive("shell_call", "sh_", keep_unfinished=True),
        _passive("local_shell_call", "lsh_", keep_unfinished=True),
        _passive("computer_call", "cu_", keep_unfinished=True),
        _passive("apply_patch_call", "apc_", keep_unfinished=True),
        _passive("compaction", "cmp_", keep_unfinished=True),
    )
}
"""The per-kind descriptor table. Unknown kinds (lenient only) fold with `RAW_KIND`."""

RAW_KIND = _passive("", "item_", keep_unfinished=True)

_CALL_IDS = frozenset({"function_call", "custom_tool_call", "shell_call", "local_shell_call", "computer_call", "apply_patch_call"})
ITEM_DEFAULTS: dict[str, dict[str, Any]] = {
    "message": {"content": [], "role": "assistant"},
    "reasoning": {"summary": []},
    "function_call": {"arguments": "", "name": ""},
    "custom_tool_call": {"input": "", "name": ""},
    "mcp_call": {"arguments": "", "name": "", "server_label": ""},
    "mcp_list_tools": {"server_label": "", "tools": []},
    "mcp_approval_request": {"arguments": "", "name": "", "server_label": ""},
    "web_search_call": {"action": {"type": "search"}},
    "file_search_call": {"queries": []},
    "code_interpreter_call": {"container_id": "auto"},
    "tool_search_call": {"arguments": {}, "execution": "client"},
    "shell_call": {"action": {"commands": []}},
    "local_shell_call": {"action": {"type": "exec", "command": [], "env": {}}},
    "computer_call": {"pending_safety_checks": []},
    "apply_patch_call": {"operation": {"type": "update_file", "path": "", "diff": ""}},
    "compaction": {"encrypted_content": ""},
}
"""Per kind: the value a field clients require takes when an upstream item lacks it, or has it
of a type no client takes (an empty one: nothing is invented). ``status`` is filled too, and a
call's ``call_id`` from its id."""
_NO_STATUS = frozenset({"reasoning", "function_call", "custom_tool_call", "mcp_call", "mcp_list_tools", "mcp_approval_request", "compaction"})
_STATUSES: dict[str, frozenset[str]] = {
    "web_search_call": frozenset({"in_progress", "searching", "completed", "failed", "incomplete"}),
    "file_search_call": frozenset({"in_progress", "searching", "completed", "failed", "incomplete"}),
    "code_interpreter_call": frozenset({"in_progress", "interpreting", "completed", "failed", "incomplete"}),
    "image_generation_call": frozenset({"in_progress", "generating", "completed", "failed"}),
    "mcp_call": frozenset({"in_progress", "calling", "completed", "failed", "incomplete"}),
    "apply_patch_call": frozenset({"in_progress", "completed"}),
}
_STATUS = frozenset({"in_progress", "completed", "incomplete"})
_TEXT_KEY = {"output_text": "text", "refusal": "refusal", "reasoning_text": "text", "summary_text": "text"}


def _parts(value: list[Any], allowed: tuple[str, ...]) -> list[Any]:
    """The parts of a list clients can take: objects of an allowed type, their text a string
    (an absent one empty), an output_text's annotations a list of objects."""
    out = []
    for part in value:
        if not isinstance(part, dict) or part.get("type") not in allowed:
            continue
        key = _TEXT_KEY[part["type"]]
        if part.get(key) is None:
            part[key] = ""
        if type(part[key]) is not str:
            continue
        if part["type"] == "output_text":
            annotations = part.get("annotations")
            part["annotations"] = [a for a in annotations if isinstance(a, dict)] if isinstance(annotations, list) else []
            logprobs = part.get("logprobs")
            if logprobs is not None and not (isinstance(logprobs, list) and all(isinstance(x, dict) for x in logprobs)):
                part.pop("logprobs")
        out.append(part)
    return out


def complete_item(item: dict[str, Any], *, done: bool, derive_call_id: bool = True) -> dict[str, Any]:
    """Fill, in place, what clients require of an item of a known kind and the upstream left
    out (`ITEM_DEFAULTS`, ``status``, a call's ``call_id``); returns the item."""
    kind = item.get("type")
    defaults = ITEM_DEFAULTS.get(kind) if type(kind) is str else None
    if defaults is None:
        return item
    for key, value in defaults.items():
        if type(item.get(key)) is not type(value):  # absent, null, or of a type nothing can take
            item[key] = orjson.loads(orjson.dumps(value)) if isinstance(value, dict | list) else value
    status = item.get("status")
    if (kind not in _NO_STATUS or status is not None) and status not in _STATUSES.get(str(kind), _STATUS):
        item["status"] = "completed" if done else "in_progress"
    if kind == "message":
        item["content"] = _parts(item["content"], ("output_text", "refusal"))
        item["role"] = "assistant"  # an output message is the assistant's, whatever was sent
    elif kind == "reasoning":
        item["summary"] = _parts(item["summary"], ("summary_text",))
        if isinstance(item.get("content"), list):
            item["content"] = _parts(item["content"], ("reasoning_text",))
        elif "content" in item and item["content"] is not None:
            del item["content"]
    if kind in _CALL_IDS and (not item.get("call_id") or type(item["call_id"]) is not str) and (derive_call_id or item.get("call_id")):
        given = item.get("call_id")
        if type(given) in (int, float) and not isinstance(given, bool):
            item["call_id"] = str(given)  # a number: the same key, as the string clients need
        else:
            item_id = str(item.get("id") or "")
            item["call_id"] = "call_" + (item_id.split("_", 1)[1] if "_" in item_id else item_id)
    return item

KNOWN_KINDS = frozenset(KINDS)

CLIENT_ITEM_KINDS = frozenset(
    {
        *KINDS,
        "function_call_output",
        "computer_call_output",
        "program",
        "program_output",
        "tool_search_output",
        "additional_tools",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "mcp_approval_response",
        "custom_tool_call_output",
    }
)
"""Output item types the official client knows (its ``ResponseOutputItem`` union): an item of
another type is forwarded or dropped by the relay's ``unknown_events`` policy."""


def known_kind(kind: object) -> bool:
    """Is ``kind`` (any JSON value) an item type we know?"""
    return type(kind) is str and kind in KNOWN_KINDS


def kind_spec(kind: object) -> KindSpec:
    """The descriptor of ``kind``; the raw fallback for kinds we do not know."""
    return KINDS.get(kind, RAW_KIND) if type(kind) is str else RAW_KIND
