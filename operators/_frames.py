"""The frame that flows between the stages, the validation policy, and the event catalogue.

A `Frame` is one upstream event after normalize: its wire JSON (``data``, a dict that later
stages may rewrite in place: the resolved ``output_index``, restored tool shapes), its type,
and what the catalogue knows about that type (`EventSpec`). It is deliberately not a pydantic
model: it is made once per token, and validating each token with pydantic costs more than the
whole pipeline. pydantic types sit at the boundaries (items at done, the Response).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any


class Validation(enum.Enum):
    """How the validate stage treats a stream that breaks the protocol.

    ``STRICT`` rejects every violation with a `ProtocolError`; ``LENIENT`` recovers where the
    rules allow it (missing indexes, orphan or late deltas, identical repeats, EOF without a
    terminal) and rejects only what cannot be recovered without guessing.
    """

    STRICT = "strict"
    LENIENT = "lenient"


class Action(enum.Enum):
    """What an event does to the item lifecycle."""

    CREATED = "created"
    IN_PROGRESS = "in_progress"
    QUEUED = "queued"
    TERMINAL = "terminal"
    OPEN = "open"  # output_item.added
    MUTATE = "mutate"  # deltas, parts, status sub-events
    COMPLETE = "complete"  # output_item.done
    OTHER = "other"  # error, keepalive, audio, unknown types: passed through, folds nothing


INT = "int"  # an unsigned 32-bit integer
STR = "str"
OBJECT = "object"


@dataclass(frozen=True, slots=True)
class EventSpec:
    """What the catalogue knows of one event type."""

    type: str
    action: Action
    kinds: frozenset[str] = frozenset()  # item kinds a MUTATE may target
    payload: str | None = None  # the string field strict requires (delta, text, arguments…)
    index_field: str | None = None  # content_index / summary_index / command_index
    needs_part: bool = False
    needs_item_id: bool = True
    status: str | None = None  # the response.status a lifecycle event must carry
    extra: tuple[tuple[str, str], ...] = ()  # more fields every client requires (name, JSON type)

    @property
    def required(self) -> tuple[str, ...]:
        """The sub-event fields every client requires to be present (types checked too)."""
        return tuple(name for name, _ in self.fields)

    @property
    def fields(self) -> tuple[tuple[str, str], ...]:
        """``(name, JSON type)`` of the fields a client-bound sub-event of this type must
        carry, beyond ``type``, ``sequence_number`` and its identity (``output_index``,
        ``item_id``: resolved by validate) — the table the official client's event models
        require (``tests/operators/test_event_fields.py`` checks it against them)."""
        out: list[tuple[str, str]] = []
        if self.index_field is not None:
            out.append((self.index_field, INT))
        if self.payload is not None:
            out.append((self.payload, STR))
        if self.needs_part:
            out.append(("part", OBJECT))
        return (*out, *self.extra)


class Frame:
    """One normalized upstream event."""

    __slots__ = ("data", "line", "malformed", "spec", "type")

    def __init__(
        self,
        type: str,
        data: dict[str, Any],
        spec: EventSpec,
        line: int = 0,
        malformed: str | None = None,
    ) -> None:
        self.type = type
        self.data = data
        self.spec = spec
        self.line = line
        self.malformed = malformed
        """None, or why the payload could not be read: ``"json"`` or ``"utf8"``."""

    @classmethod
    def new(cls, type: str, data: dict[str, Any], line: int = 0) -> Frame:
        """A frame made by a stage (not parsed from upstream): its spec from the catalogue."""
        return cls(type, data, CATALOGUE.get(type, OTHER), line)

    @property
    def output_index(self) -> int | None:
        value = self.data.get("output_index")
        return value if isinstance(value, int) else None

    def __repr__(self) -> str:
        return f"Frame({self.type!r}, line={self.line}, output_index={self.output_index})"


class ParsedFrame(Frame):
    """A frame as normalize's hot path makes it: `Frame`'s slots filled in place after a call
    to object's C ``__init__`` — no Python-level ``__init__`` call, ~25 ns less per token."""

    __slots__ = ()
    __init__ = object.__init__


# ---- the catalogue ------------------------------------------------------------------------

MESSAGE = "message"
REASONING = "reasoning"

TERMINAL_TYPES = frozenset({"response.completed", "response.failed", "response.incomplete"})

_SPECS: list[EventSpec] = [
    EventSpec("response.created", Action.CREATED, status="in_progress"),
    EventSpec("response.in_progress", Action.IN_PROGRESS, status="in_progress"),
    EventSpec("response.queued", Action.QUEUED, status="queued"),
    EventSpec("response.completed", Action.TERMINAL, status="completed"),
    EventSpec("response.failed", Action.TERMINAL, status="failed"),
    EventSpec("response.incomplete", Action.TERMINAL, status="incomplete"),
    EventSpec("response.output_item.added", Action.OPEN),
    EventSpec("response.output_item.done", Action.COMPLETE),
]


def _mutate(
    type: str,
    kinds: set[str],
    payload: str | None = None,
    index_field: str | None = None,
    needs_part: bool = False,
    needs_item_id: bool = True,
    extra: tuple[tuple[str, str], ...] = (),
) -> None:
    _SPECS.append(
        EventSpec(
            type,
            Action.MUTATE,
            frozenset(kinds),
            payload,
            index_field,
            needs_part,
            needs_item_id,
            extra=extra,
        )
    )


_TEXT_PARTS = {MESSAGE, REASONING}  # vLLM revisions open reasoning_text parts with content_part.*
_mutate("response.content_part.added", _TEXT_PARTS, None, "content_index", needs_part=True)
_mutate("response.content_part.done", _TEXT_PARTS, None, "content_index", needs_part=True)
_mutate("response.output_text.delta", {MESSAGE}, "delta", "content_index")
_mutate("response.output_text.done", {MESSAGE}, "text", "content_index")
_mutate("response.output_text.annotation.added", {MESSAGE}, None, "content_index", extra=(("annotation_index", INT),))
_mutate("response.refusal.delta", {MESSAGE}, "delta", "content_index")
_mutate("response.refusal.done", {MESSAGE}, "refusal", "content_index")
_mutate("response.reasoning_text.delta", {REASONING}, "delta", "content_index")
_mutate("response.reasoning_text.done", {REASONING}, "text", "content_index")
_mutate("response.reasoning_summary_part.added", {REASONING}, None, "summary_index", True)
_mutate("response.reasoning_summary_part.done", {REASONING}, None, "summary_index", True)
_mutate("response.reasoning_summary_text.delta", {REASONING}, "delta", "summary_index")
_mutate("response.reasoning_summary_text.done", {REASONING}, "text", "summary_index")
_mutate("response.function_call_arguments.delta", {"function_call"}, "delta")
_mutate("response.function_call_arguments.done", {"function_call"}, "arguments")
_mutate("response.custom_tool_call_input.delta", {"custom_tool_call"}, "delta")
_mutate("response.custom_tool_call_input.done", {"custom_tool_call"}, "input")
for _s in ("in_progress", "searching", "completed"):
    _mutate(f"response.web_search_call.{_s}", {"web_search_call"})
    _mutate(f"response.file_search_call.{_s}", {"file_search_call"})
for _s in ("in_progress", "interpreting", "completed"):
    _mutate(f"response.code_interpreter_call.{_s}", {"code_interpreter_call"})
_mutate("response.code_interpreter_call_code.delta", {"code_interpreter_call"}, "delta")
_mutate("response.code_interpreter_call_code.done", {"code_interpreter_call"}, "code")
for _s in ("in_progress", "completed", "failed"):
    _mutate(f"response.mcp_call.{_s}", {"mcp_call"})
    _mutate(f"response.mcp_list_tools.{_s}", {"mcp_list_tools"})
_mutate("response.mcp_call_arguments.delta", {"mcp_call"}, "delta")
_mutate("response.mcp_call_arguments.done", {"mcp_call"}, "arguments")
for _s in ("in_progress", "generating", "completed"):
    _mutate(f"response.image_generation_call.{_s}", {"image_generation_call"})
_mutate(
    "response.image_generation_call.partial_image",
    {"image_generation_call"},
    "partial_image_b64",
    "partial_image_index",
)
_mutate("response.shell_call_command.added", {"shell_call"}, "command", "command_index", needs_item_id=False)
_mutate("response.shell_call_command.delta", {"shell_call"}, "delta", "command_index", needs_item_id=False)
_mutate("response.shell_call_command.done", {"shell_call"}, "command", "command_index", needs_item_id=False)
_mutate("response.compaction.compacting", {"compaction"})

# events that fold nothing but that clients know, and the fields they require
_SPECS.append(EventSpec("error", Action.OTHER, extra=(("message", STR),)))
for _s in ("audio", "audio.transcript"):
    _SPECS.append(EventSpec(f"response.{_s}.delta", Action.OTHER, extra=(("delta", STR),)))
    _SPECS.append(EventSpec(f"response.{_s}.done", Action.OTHER))

CATALOGUE: dict[str, EventSpec] = {spec.type: spec for spec in _SPECS}
OTHER = EventSpec("", Action.OTHER)

PART_TYPES: dict[str, frozenset[str]] = {
    "response.content_part.added": frozenset({"output_text", "refusal", "reasoning_text"}),
    "response.content_part.done": frozenset({"output_text", "refusal", "reasoning_text"}),
    "response.reasoning_summary_part.added": frozenset({"summary_text"}),
    "response.reasoning_summary_part.done": frozenset({"summary_text"}),
}
"""The part types each part event may carry (what clients accept)."""

_PART_TEXT = {"output_text": "text", "reasoning_text": "text", "summary_text": "text", "refusal": "refusal"}


def part_problem(event_type: str, part: dict[str, Any]) -> str | None:
    """Why ``part`` cannot go to a client with this event (None: it can). A part of an allowed
    type whose text field is absent, or an output_text without ``annotations``, is completed
    in place with the empty default (nothing is lost); one of another type cannot be."""
    kind = part.get("type")
    if type(kind) is not str or kind not in PART_TYPES.get(event_type, ()):
        return "part.type"
    field = _PART_TEXT[kind]
    text = part.get(field)
    if text is None:
        part[field] = ""
    elif type(text) is not str:
        return f"part.{field}"
    if kind == "output_text":
        annotations = part.get("annotations")
        if annotations is None:
            part["annotations"] = []
        elif type(annotations) is not list:
            return "part.annotations"
        elif not all(type(a) is dict for a in annotations):
            part["annotations"] = [a for a in annotations if type(a) is dict]
        logprobs = part.get("logprobs")
        if logprobs is not None and not (type(logprobs) is list and all(type(x) is dict for x in logprobs)):
            del part["logprobs"]
    return None


_NAME = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*")


def well_formed_type(kind: object) -> bool:
    """A type name a client could know: dot-separated lower-case words (``response.x.y``)."""
    return isinstance(kind, str) and len(kind) <= 128 and _NAME.fullmatch(kind) is not None

# vLLM names → the OpenAI names clients know.
RENAMES: dict[str, str] = {
    "response.done": "response.completed",
    "response.reasoning_part.added": "response.content_part.added",
    "response.reasoning_part.done": "response.content_part.done",
}
