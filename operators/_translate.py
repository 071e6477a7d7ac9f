"""translate: folded upstream frames → the frames the client may see, in public tool shapes.

In: frames accepted by validate and folded by fold (translate reads the fold's slot for a
call's authoritative arguments). Out: zero or more public frames per frame, and the defer
boundary (`defer_from`): frames at or beyond it must wait in the relay.

Per call (keyed by output_index), by the route of its name (`ToolRegistry`):

* client function — every frame passes through untouched;
* custom tool — ``custom_tool_call`` frames: a synthetic added, input deltas decoded
  incrementally from the streamed argument JSON (`InputDecoder`: waits on split escapes and
  surrogate pairs, O(n) overall), ``custom_tool_call_input.done`` and a synthetic item done.
  The authoritative input at done must extend what was streamed, or `TranslateError`;
* namespace member — ``namespace`` + member ``name`` restored in every frame that names it;
* client-run built-in (shell, local_shell, apply_patch, tool_search) — its argument frames are
  withheld; at its done, the built-in's public item (``shell_call``, …) is added and done at
  once, built from the authoritative arguments; until then its index holds the defer boundary
  (an item with no valid shape before its arguments are whole cannot be shown earlier);
* gateway-owned — withheld from the client; the lowest such index is the defer boundary;
* unnamed (added without a name) — every frame of it buffered (bounded) until a done names
  it, then replayed through the route it resolves to; it holds the defer boundary meanwhile.

Everything else (messages, reasoning, built-in items, response events, ``error``) passes
through. State: one record per call, the pending-bytes budget, the gateway boundary.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from respflow.operators._config import Limits
from respflow.operators._errors import LimitExceededError, RespflowError, TranslateError
from respflow.operators._fold import Folder
from respflow.operators._frames import Frame
from respflow.operators._response import Response
from respflow.operators._tools import (
    ToolKind,
    ToolRegistry,
    ToolRoute,
    builtin_item,
    custom_id,
    input_from_arguments,
)

_ADDED = "response.output_item.added"
_DONE = "response.output_item.done"
_ARGS_DELTA = "response.function_call_arguments.delta"
_ARGS_DONE = "response.function_call_arguments.done"
_RESPONSE_EVENTS = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.completed",
        "response.failed",
        "response.incomplete",
    }
)

# the prefix of `{"input":"` (after an optional `{}` some models emit first)
_PREFIX = re.compile(r'\s*(?:\{\s*\}\s*)?\{\s*"input"\s*:\s*"')
_PREFIX_STRING = re.compile(r'\s*"')  # the arguments are a bare JSON string
_SPECIAL = re.compile(r'["\\]')
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_PREFIX_MAX = 64


class InputDecoder:
    """Decode a custom tool's ``input`` from argument JSON that arrives in pieces.

    Feed it each argument delta; it returns the newly completed part of the ``input`` string
    (possibly empty). Only undecoded text is kept, so the total work is linear.
    """

    __slots__ = ("_raw", "_started", "finished", "unusable")

    def __init__(self) -> None:
        self._raw = ""
        self._started = False
        self.finished = False
        self.unusable = False
        """True when the arguments are not ``{"input": "…`` — the input comes only at done."""

    def feed(self, delta: str) -> str:
        if self.finished or self.unusable:
            return ""
        raw = self._raw + delta
        if not self._started:
            match = _PREFIX.match(raw) or _PREFIX_STRING.match(raw)
            if match is None:
                if len(raw) > _PREFIX_MAX or not _could_start(raw):
                    self.unusable = True
                    self._raw = ""
                else:
                    self._raw = raw
                return ""
            self._started = True
            raw = raw[match.end() :]
        out: list[str] = []
        pos = 0
        n = len(raw)
        while True:
            special = _SPECIAL.search(raw, pos)
            end = special.start() if special else n
            if end > pos:
                out.append(raw[pos:end])
            if special is None:
                pos = n
                break
            if raw[end] == '"':
                self.finished = True
                pos = n
                break
            size = _escape_size(raw, end)
            if size == 0:  # incomplete escape: wait for more
                pos = end
                break
            out.append(json.loads('"' + raw[end : end + size] + '"'))
            pos = end + size
        self._raw = raw[pos:]
        return "".join(out)


def _could_start(raw: str) -> bool:
    """Could more text still turn ``raw`` into the ``{"input":"`` prefix?"""
    probe = raw.lstrip()
    if not probe:
        return True
    for target in ('{"input":"', '{}{"input":"', '"'):
        compact = re.sub(r"\s+", "", probe)
        if target.startswith(compact) or compact.startswith(target):
            return True
    return False


def _escape_size(raw: str, at: int) -> int:
    """Length of the escape at ``raw[at]`` (a backslash); 0 if it is not complete yet."""
    if at + 1 >= len(raw):
        return 0
    kind = raw[at + 1]
    if kind in '"\\/bfnrt':
        return 2
    if kind != "u":
        raise TranslateError(
            f"invalid custom tool input string: bad escape \\{kind[:1]!s}", code="invalid_custom_input"
        )
    if at + 6 > len(raw):
        return 0 if _HEX4.fullmatch(raw[at + 2 : at + 6].ljust(4, "0")) else _bad_unicode()
    hex4 = raw[at + 2 : at + 6]
    if not _HEX4.fullmatch(hex4):
        return _bad_unicode()
    code = int(hex4, 16)
    if 0xD800 <= code < 0xDC00:  # a high surrogate: its low half must follow
        if at + 12 > len(raw):
            tail = raw[at + 6 : at + 12]
            if "\\u".startswith(tail[:2]) or tail[:2] == "\\u":
                return 0
            return _bad_unicode()
        if raw[at + 6 : at + 8] != "\\u" or not _HEX4.fullmatch(raw[at + 8 : at + 12]):
            return _bad_unicode()
        low = int(raw[at + 8 : at + 12], 16)
        if not 0xDC00 <= low < 0xE000:
            return _bad_unicode()
        return 12
    if 0xDC00 <= code < 0xE000:  # a low surrogate with no high half before it
        return _bad_unicode()
    return 6


def _bad_unicode() -> int:
    raise TranslateError(
        "invalid custom tool input string: bad \\u escape or unpaired surrogate",
        code="invalid_custom_input",
    )


class _Call:
    __slots__ = ("arg_bytes", "decoder", "emitted", "input_done", "pending", "pending_bytes", "public_id", "route")

    def __init__(self) -> None:
        self.route: ToolRoute | None = None
        self.pending: list[Frame] = []
        self.pending_bytes = 0
        self.public_id = ""
        self.decoder: InputDecoder | None = None
        self.emitted: list[str] = []
        self.input_done = False
        self.arg_bytes = 0


class Translator:
    """Give tool calls back their public shape; withhold and defer gateway-owned ones."""

    def __init__(self, registry: ToolRegistry | None, folder: Folder, limits: Limits | None = None) -> None:
        self.registry = registry or ToolRegistry()
        self._folder = folder
        limits = limits or Limits()
        self._max_pending = limits.max_pending_unnamed_bytes
        self._max_args = limits.max_argument_bytes
        self._pending_bytes = 0
        self._calls: dict[int, _Call] = {}
        self._gateway_first: int | None = None
        self._active = self.registry.rewrites

    @property
    def defer_from(self) -> int | None:
        """The lowest output_index whose frames must wait: a gateway or still-unnamed call."""
        low = self._gateway_first
        if not self._calls:  # the usual case: no call open
            return low
        for index, call in self._calls.items():
            route = call.route
            if (route is None or (route.kind is ToolKind.BUILTIN and not call.input_done)) and (low is None or index < low):
                low = index
        return low

    def gateway_indexes(self) -> list[int]:
        """Output indexes of the gateway-owned calls seen so far."""
        return sorted(i for i, c in self._calls.items() if c.route is not None and c.route.kind is ToolKind.GATEWAY)

    def feed(self, frame: Frame) -> list[Frame]:
        """One folded frame in; its public frames out."""
        ftype = frame.type
        data = frame.data
        if ftype in (_ADDED, _DONE):
            item = data.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                return self._call_frame(frame)
            return [frame]
        if ftype in (_ARGS_DELTA, _ARGS_DONE):
            return self._call_frame(frame)
        if self._active and ftype in _RESPONSE_EVENTS:
            self._restore_snapshot(data)
        return [frame]

    def feed_all(self, frames: list[Frame]) -> list[Frame]:
        """A batch of folded frames in; their public frames out (``partial`` on an error)."""
        if not self._active:
            # no tool needs restoring: every frame is public already — unless a call arrives
            # without its name or call_id (it waits for its done), or one is waiting
            if not self._calls:
                for frame in frames:  # a loop, not any(genexpr): two calls fewer per read
                    if frame.type == _ADDED and _unnamed_call(frame):
                        break
                else:
                    return frames
            self._active = True
        out: list[Frame] = []
        feed = self.feed
        try:
            for frame in frames:
                out += feed(frame)
        except RespflowError as exc:
            exc.partial = out
            raise
        return out

    def flush(self) -> list[Frame]:
        """End of stream: calls that never got a name are released as client functions; a
        client built-in cut before its done is shown as it stands, ``incomplete``."""
        out: list[Frame] = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if call.route is None:
                out += self._start(index, call, self.registry.route(""))
            elif call.route.kind is ToolKind.BUILTIN and not call.input_done:
                origin = Frame.new(_DONE, {"type": _DONE, "output_index": index})
                out += self._builtin_item(index, call, call.route, origin, "incomplete")
        return out

    # -- calls ---------------------------------------------------------------------------------

    def _call_frame(self, frame: Frame) -> list[Frame]:
        data = frame.data
        index = data.get("output_index")
        if not isinstance(index, int):
            return [frame]
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _Call()
            name = _name_of(frame)
            if not name or (frame.type == _ADDED and _unnamed_call(frame)):
                return self._buffer(call, frame)  # unnamed (or no call_id yet): until a done
            return self._start(index, call, self.registry.route(name), frame)
        if call.route is None:
            name = _name_of(frame) if frame.type in (_ARGS_DONE, _DONE) else ""
            if not name and frame.type != _ARGS_DONE:
                return self._buffer(call, frame)
            # a done resolves it (an arguments.done without a name: a client function)
            self._pending_bytes -= call.pending_bytes
            return self._start(index, call, self.registry.route(name), frame)
        return self._route(index, call, frame)

    def _buffer(self, call: _Call, frame: Frame) -> list[Frame]:
        size = len(orjson.dumps(frame.data))
        self._pending_bytes += size
        call.pending_bytes += size
        if self._pending_bytes > self._max_pending:
            raise LimitExceededError(
                f"unnamed function-call SSE exceeded {self._max_pending} buffered bytes; raise "
                "max_pending_unnamed_bytes if calls legitimately stream long before their name",
                code="pending_unnamed_bytes",
                stage="translate",
                line=frame.line,
            )
        call.pending.append(frame)
        return []

    def _start(self, index: int, call: _Call, route: ToolRoute, frame: Frame | None = None) -> list[Frame]:
        call.route = route
        replay, call.pending = call.pending, []
        slot = self._folder.slots.get(index)
        if slot is not None:  # what the done told: the buffered added shows it too
            known = slot.current()
            for f in replay:
                item = f.data.get("item") if f.type == _ADDED else None
                if isinstance(item, dict):
                    for key in ("name", "call_id"):
                        if not item.get(key) and isinstance(known.get(key), str):
                            item[key] = known[key]
        call.pending_bytes = 0
        if route.kind is ToolKind.GATEWAY and (self._gateway_first is None or index < self._gateway_first):
            self._gateway_first = index
        out: list[Frame] = []
        for f in replay:
            out += self._route(index, call, f)
        if frame is not None:
            out += self._route(index, call, frame)
        return out

    def _route(self, index: int, call: _Call, frame: Frame) -> list[Frame]:
        route = call.route
        assert route is not None
        kind = route.kind
        if kind is ToolKind.FUNCTION:
            return [frame]
        if kind is ToolKind.GATEWAY:
            return []
        if kind is ToolKind.NAMESPACE:
            return [_restore_namespace(frame, route)]
        if kind is ToolKind.BUILTIN:
            return self._builtin(index, call, route, frame)
        return self._custom(index, call, route, frame)

    def _builtin(self, index: int, call: _Call, route: ToolRoute, frame: Frame) -> list[Frame]:
        ftype = frame.type
        if ftype == _ARGS_DELTA:
            delta = frame.data.get("delta")
            call.arg_bytes += len(delta) if isinstance(delta, str) else 0
            if call.arg_bytes > self._max_args:
                raise LimitExceededError(
                    f"function-call SSE exceeded {self._max_args} buffered bytes; raise "
                    "max_argument_bytes if tools legitimately take larger input",
                    code="argument_bytes",
                    stage="translate",
                    line=frame.line,
                )
            return []
        if ftype != _DONE or call.input_done:
            return []
        return self._builtin_item(index, call, route, frame, None)

    def _builtin_item(self, index: int, call: _Call, route: ToolRoute, frame: Frame, status: str | None) -> list[Frame]:
        """The built-in's public item, added and done at once (its arguments are whole now)."""
        call.input_done = True
        slot = self._folder.slots.get(index)
        upstream = slot.current() if slot is not None else frame.data.get("item") or {}
        done = builtin_item(route.declaration, upstream, status)
        added = dict(done, status="in_progress")
        return [
            _synthetic(frame, _ADDED, {"output_index": index, "item": added}),
            _synthetic(frame, _DONE, {"output_index": index, "item": done}),
        ]

    def _custom(self, index: int, call: _Call, route: ToolRoute, frame: Frame) -> list[Frame]:
        data = frame.data
        ftype = frame.type
        if ftype == _ADDED:
            item = data["item"]
            call.public_id = custom_id(str(item.get("id", "")))
            call.decoder = InputDecoder()
            public = {
                "id": call.public_id,
                "type": "custom_tool_call",
                "status": "in_progress",
                "call_id": item.get("call_id", ""),
                "input": "",
                "name": route.name,
            }
            return [_synthetic(frame, _ADDED, {"output_index": index, "item": public})]
        if not call.public_id:  # a done-only custom call
            slot = self._folder.slots.get(index)
            item_id = slot.current().get("id", "") if slot is not None else ""
            call.public_id = custom_id(str(data.get("item_id") or item_id))
        if ftype == _ARGS_DELTA:
            delta = data.get("delta")
            if not isinstance(delta, str) or call.input_done:
                return []
            call.arg_bytes += len(delta)
            if call.arg_bytes > self._max_args:
                raise LimitExceededError(
                    f"function-call SSE exceeded {self._max_args} buffered bytes; raise "
                    "max_argument_bytes if tools legitimately take larger input",
                    code="argument_bytes",
                    stage="translate",
                    line=frame.line,
                )
            if call.decoder is None:
                call.decoder = InputDecoder()
            text = call.decoder.feed(delta)
            if not text:
                return []
            call.emitted.append(text)
            return [self._input_delta(frame, index, call, text)]
        out: list[Frame] = []
        if not call.input_done:
            out += self._finish_input(index, call, frame)
        if ftype == _DONE:
            slot = self._folder.slots.get(index)
            done_item = data["item"]
            merged = slot.current() if slot is not None else done_item
            public = {
                "id": call.public_id,
                "type": "custom_tool_call",
                "status": "completed",
                "call_id": merged.get("call_id") or done_item.get("call_id", ""),
                "input": "".join(call.emitted),
                "name": route.name,
            }
            out.append(_synthetic(frame, _DONE, {"output_index": index, "item": public}))
        return out

    def _finish_input(self, index: int, call: _Call, frame: Frame) -> list[Frame]:
        slot = self._folder.slots.get(index)
        if slot is not None:
            arguments = slot.arguments()
        else:
            item = frame.data.get("item") or {}
            arguments = str(frame.data.get("arguments") or item.get("arguments") or "")
        final = input_from_arguments(arguments)
        streamed = "".join(call.emitted)
        if not final.startswith(streamed):
            raise TranslateError(
                "authoritative custom tool input contradicts streamed custom tool input "
                f"(output[{index}])",
                code="custom_input_conflict",
                stage="translate",
                line=frame.line,
                output_index=index,
            )
        call.input_done = True
        out: list[Frame] = []
        rest = final[len(streamed) :]
        if rest:
            call.emitted.append(rest)
            out.append(self._input_delta(frame, index, call, rest))
        out.append(
            _synthetic(
                frame,
                "response.custom_tool_call_input.done",
                {"item_id": call.public_id, "output_index": index, "input": final},
            )
        )
        return out

    def _input_delta(self, frame: Frame, index: int, call: _Call, text: str) -> Frame:
        return _synthetic(
            frame,
            "response.custom_tool_call_input.delta",
            {"item_id": call.public_id, "output_index": index, "delta": text},
        )

    # -- snapshots and the final Response ------------------------------------------------------

    def _restore_snapshot(self, data: dict[str, Any]) -> None:
        response = data.get("response")
        if not isinstance(response, dict):
            return
        response["tools"] = list(self.registry.public_tools)
        output = response.get("output")
        if isinstance(output, list):
            restored = [self.registry.restore_item(i) if isinstance(i, dict) else i for i in output]
            response["output"] = [i for i in restored if i is not None]

    def restore_response(self, response: Response) -> Response:
        """The final Response with every call in its public shape; gateway calls withheld."""
        if not self._active:
            return response
        body = response.to_dict()
        restored = [self.registry.restore_item(item) for item in body["output"]]
        body["output"] = [item for item in restored if item is not None]
        body["tools"] = list(self.registry.public_tools)
        return Response.model_validate(body)


def _unnamed_call(frame: Frame) -> bool:
    """An added function call whose name or call_id is not known yet."""
    item = frame.data.get("item")
    return isinstance(item, dict) and item.get("type") == "function_call" and not (item.get("name") and item.get("call_id"))


def _name_of(frame: Frame) -> str:
    data = frame.data
    item = data.get("item")
    name = item.get("name") if isinstance(item, dict) else data.get("name")
    return name if isinstance(name, str) else ""


def _synthetic(origin: Frame, type: str, fields: dict[str, Any]) -> Frame:
    return Frame.new(type, {"type": type, **fields}, origin.line)


def _restore_namespace(frame: Frame, route: ToolRoute) -> Frame:
    data = frame.data
    item = data.get("item")
    if isinstance(item, dict):
        if item.get("namespace") is None:
            data["item"] = dict(item, name=route.name, namespace=route.namespace)
    elif "name" in data:
        data["name"] = route.name
    return frame
