"""relay: the one emit funnel between the pipeline and a client (the non-linear part).

Two doors, one funnel:

* `Relay.emit_upstream` takes a `Translation` (the frames of one upstream read, already in
  public tool shapes) and rewrites what only the gateway knows: the response id (and the
  request's ``previous_response_id``), the ``output_index`` offset of later rounds, the
  Response shape of lifecycle snapshots. Upstream terminals are withheld: the relay's owner
  sends the one terminal (`Relay.complete`) or an error (`Relay.fail`).
* `Relay.emit_local` takes frames the gateway made (tool lifecycle events): already public,
  absolute indexes, no rewriting.

The one terminal is `Relay.complete` (built from the final Response) or `Relay.fail` (an
``error`` event, then ``response.failed`` with the same code and message).

Both stamp ``sequence_number`` 0..N with no gaps across local frames and rounds, and both
commit it (and the created/in_progress flags, and the removal of released deferred frames)
only after the sink's ``send`` returned: a send that fails or is cancelled consumes nothing.

The defer window: while a round has a boundary ``B`` (a gateway-owned or still-unnamed call
at ``B``), frames at index ≥ B and index-less frames wait, bounded in entries and bytes. When
the boundary moves they are released; at the end of a round `Relay.drain` emits, per index,
the gateway's tool events and then that index's deferred frames; index-less frames last. Both
use the one ordering function `defer_order`.

SSE out: ``event: <type>`` + one ``data:`` line + blank line; keep-alives only as comments;
never ``id:`` or ``retry:``.
"""

from __future__ import annotations

import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, Protocol

import orjson
from aiostream import pipable_operator, streamcontext

from respflow.operators import (
    Frame,
    LimitExceededError,
    Limits,
    RelayError,
    RespflowError,
    Response,
    Translation,
)
from respflow.operators._fold import response_error
from respflow.operators._frames import CATALOGUE, well_formed_type
from respflow.operators._items import CLIENT_ITEM_KINDS

_TERMINALS = frozenset({"response.completed", "response.failed", "response.incomplete"})
_LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_TEXT_EVENTS = frozenset({"response.output_text.delta", "response.output_text.done"})
_KEEPALIVES = frozenset({"keepalive", "response.keepalive"})
_NOT_RELAYED = _TERMINALS | _KEEPALIVES | {""}
_TEXT_DELTA = "response.output_text.delta"
_NO_UPDATES: list[tuple[int, str | None, int]] = []  # `_contract`'s fast path: no ledger change (never appended to)
_DROPPED = "\x00dropped"  # the ledger's item type for an index whose item the client was not sent
_LEDGER_KINDS = frozenset(
    {
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.function_call_arguments.delta",
    }
)


class Sink(Protocol):
    """Where relayed bytes go. Awaiting ``send`` IS the backpressure."""

    async def send(self, data: bytes) -> None: ...

    async def aclose(self) -> None: ...


_HEADS: dict[str, bytes] = {}
_END = b"\n\n"


def _head(kind: Any) -> bytes:
    """What comes before the JSON: the ``event:`` line (when the type can be one) and ``data: ``."""
    head = _HEADS.get(kind) if isinstance(kind, str) else b"data: "
    if head is None:
        event = b"event: " + kind.encode() + b"\n" if kind and "\n" not in kind and "\r" not in kind else b""
        head = event + b"data: "
        if len(_HEADS) < 512:
            _HEADS[kind] = head
    return head


def sse_frame(event: Mapping[str, Any]) -> bytes:
    """One SSE frame: ``event:`` line, one ``data:`` line, blank line."""
    return _head(event.get("type")) + orjson.dumps(event) + _END


def keepalive(comment: str = "keep-alive") -> bytes:
    """A keep-alive: an SSE comment, which every client ignores."""
    return b": " + comment.replace("\n", " ").encode() + b"\n\n"


def _relayable(data: Mapping[str, Any]) -> bool:
    """Typeless frames cannot be relayed; terminals are the owner's; keep-alives are comments."""
    kind = data.get("type")
    return isinstance(kind, str) and bool(kind) and kind not in _TERMINALS and kind not in _KEEPALIVES


def _logprobs_ok(value: Any) -> bool:
    """A list of logprob objects (usually empty: one type test on the per-token path)."""
    return type(value) is list and (not value or all(type(x) is dict for x in value))


def _index_of(data: Mapping[str, Any]) -> int | None:
    index = data.get("output_index")
    return index if isinstance(index, int) else None


def defer_order(index: int | None) -> tuple[bool, int]:
    """The one order of deferred frames: indexed ones by index, index-less ones last."""
    return (index is None, index if index is not None else 0)


class _Deferred:
    __slots__ = ("data", "index", "size")

    def __init__(self, data: dict[str, Any], index: int | None, size: int) -> None:
        self.data = data
        self.index = index
        self.size = size


class Relay:
    """Sequence, defer and emit one response's client stream."""

    def __init__(
        self,
        sink: Sink,
        *,
        response_id: str,
        model: str | None = None,
        previous_response_id: str | None = None,
        limits: Limits | None = None,
        base: Mapping[str, Any] | None = None,
        unknown_events: str = "forward",
    ) -> None:
        """Args:
            sink: where the SSE bytes go.
            response_id: the public response id every snapshot carries.
            model: the public model name (upstream's when None).
            previous_response_id: echoed in snapshots when the request had one.
            limits: the defer-window and event-size bounds.
            base: request fields for lifecycle snapshots (tools, instructions, metadata…);
                upstream's snapshot fields win over them.
            unknown_events: an upstream event of a type the protocol catalogue does not know
                but with a well-formed name (``response.something_new``) is forwarded
                (``"forward"``: forward compatibility — a client that knows it gets it; a
                strict client that does not may refuse the stream) or dropped (``"drop"``).
                A type that is not a well-formed name is always dropped. Both are counted
                (`dropped_unknown`, `dropped_malformed`).
        """
        if unknown_events not in ("forward", "drop"):
            raise ValueError(f"unknown_events must be 'forward' or 'drop', not {unknown_events!r}")
        self._forward_unknown = unknown_events == "forward"
        self.dropped_unknown = 0
        """Upstream events of a well-formed but unknown type dropped (``unknown_events="drop"``)."""
        self.dropped_malformed = 0
        """Upstream events whose type is not a well-formed name, dropped."""
        self.dropped_contract = 0
        """Events a strict client's accumulator could not take (see `_contract`), dropped."""
        self._items: dict[int, str] = {}  # client output_index → item type, once its added is sent
        self._parts: dict[int, list[bool]] = {}  # message index → its parts (True: output_text)
        self._pending_parts: dict[int, list[bool]] = {}
        self._sink = sink
        self._base = dict(base or {})
        self.response_id = response_id
        self._model = model
        self._previous = previous_response_id
        limits = limits or Limits()
        self._max_entries = limits.max_deferred_entries
        self._max_bytes = limits.max_deferred_bytes
        self._max_event = limits.max_event_bytes
        self.sequence = 0
        """The next sequence number (= frames sent so far)."""
        self._sent_types: set[str] = set()
        self._snapshot: dict[str, Any] = {}
        self._deferred: list[_Deferred] = []
        self._deferred_bytes = 0
        self._boundary: int | None = None
        self._offset = 0
        self.finished = False

    # -- rounds ------------------------------------------------------------------------------

    def start_round(self, offset: int) -> None:
        """A new upstream round: its item indexes start at ``offset`` for the client."""
        if self._deferred:
            raise RelayError("start_round with deferred frames left: drain the round first", code="relay_state")
        self._offset = offset
        self._boundary = None

    @property
    def deferred(self) -> list[dict[str, Any]]:
        """The frames waiting in the defer window (round-local indexes)."""
        return [d.data for d in self._deferred]

    @property
    def deferred_bytes(self) -> int:
        return self._deferred_bytes

    # -- door 1: upstream ----------------------------------------------------------------------

    async def emit_upstream(self, translation: Translation | Sequence[Frame | Mapping[str, Any]]) -> None:
        """Relay the frames of one upstream read (rewritten, deferred or withheld)."""
        frames: Sequence[Frame | Mapping[str, Any]]
        if isinstance(translation, Translation):
            frames, boundary = translation.frames, translation.defer_from
        else:
            frames, boundary = translation, self._boundary
        if boundary is None and self._boundary is None and not self._deferred:
            # nothing waits and nothing must wait: every frame goes now, in one send. The
            # per-token path: `_relayable` and `_rewrite`'s common case, inline.
            ready: list[dict[str, Any]] = []
            offset = self._offset
            for frame in frames:
                data = frame.data if isinstance(frame, Frame) else dict(frame)
                kind = data.get("type")
                if type(kind) is not str or kind in _NOT_RELAYED:
                    continue  # as `_relayable` says
                if kind not in CATALOGUE and not self._admit_unknown(kind):
                    continue
                # a text event's usual ``logprobs: []`` needs no rewrite (no call, no list made)
                if (
                    offset
                    or kind in _LIFECYCLE
                    or "response" in data
                    or (kind in _TEXT_EVENTS and (type(logprobs := data.get("logprobs")) is not list or logprobs))
                ):
                    data = self._rewrite(data)
                ready.append(data)
            await self._send(ready)
            return
        now: list[dict[str, Any]] = []
        new_deferred: list[_Deferred] = []
        extra_bytes = 0
        for frame in frames:
            data = frame.data if isinstance(frame, Frame) else dict(frame)
            if not _relayable(data) or (data["type"] not in CATALOGUE and not self._admit_unknown(data["type"])):
                continue
            index = data.get("output_index")
            index = index if isinstance(index, int) else None
            if boundary is not None and (index is None or index >= boundary):
                size = len(orjson.dumps(data))
                new_deferred.append(_Deferred(data, index, size))
                extra_bytes += size
                self._check_defer_bounds(len(new_deferred), extra_bytes)
                continue
            now.append(data)
        released: list[_Deferred] = []
        if self._deferred and boundary != self._boundary:
            released = [
                d
                for d in sorted(self._deferred, key=lambda d: defer_order(d.index))
                if boundary is None or (d.index is not None and d.index < boundary)
            ]
        if released:
            # frames released now and this read's frames, merged by the one ordering: an item
            # that waited goes out before this read's later frames of the same item (a stable
            # sort keeps each item's own order, released ones first)
            merged = [(d.index, d.data) for d in released] + [(_index_of(d), d) for d in now]
            merged.sort(key=lambda pair: defer_order(pair[0]))
            await self._send([self._rewrite(data) for _, data in merged])
        else:
            await self._send([self._rewrite(d) for d in now])
        if released:
            gone = {id(d) for d in released}
            self._deferred = [d for d in self._deferred if id(d) not in gone]
            self._deferred_bytes -= sum(d.size for d in released)
        self._deferred += new_deferred
        self._deferred_bytes += extra_bytes
        self._boundary = boundary

    def _admit_unknown(self, kind: str) -> bool:
        """Whether an event of a type the catalogue does not know is relayed (counted if not)."""
        if not well_formed_type(kind):
            self.dropped_malformed += 1
            return False
        if not self._forward_unknown:
            self.dropped_unknown += 1
            return False
        return True

    def _check_defer_bounds(self, new_entries: int, new_bytes: int) -> None:
        if len(self._deferred) + new_entries > self._max_entries:
            raise LimitExceededError(
                f"deferred stream exceeded {self._max_entries} buffered events; raise "
                "max_deferred_entries if gateway tools legitimately precede long outputs",
                code="deferred_entries",
                stage="relay",
            )
        if self._deferred_bytes + new_bytes > self._max_bytes:
            raise LimitExceededError(
                f"deferred stream exceeded {self._max_bytes} buffered bytes; raise "
                "max_deferred_bytes if gateway tools legitimately precede long outputs",
                code="deferred_bytes",
                stage="relay",
            )

    def _rewrite(self, data: dict[str, Any]) -> dict[str, Any]:
        """An upstream frame as the client gets it: the funnel's own copy where something must
        change (so a send that failed can be retried: nothing was applied twice); the frame
        itself where nothing does — its ``sequence_number`` is stamped at each send anyway."""
        kind = data["type"]
        if kind in _LIFECYCLE:
            out = data.copy()
            out["response"] = self._lifecycle_snapshot(data.get("response"))
            return out
        offset = self._offset and type(data.get("output_index")) is int
        response = "response" in data and isinstance(data["response"], dict)
        logprobs = kind in _TEXT_EVENTS and not _logprobs_ok(data.get("logprobs"))
        if not (offset or response or logprobs):
            return data
        out = data.copy()
        if offset:
            out["output_index"] += self._offset
        if response:
            out["response"] = dict(out["response"], id=self.response_id)
        if logprobs:
            out["logprobs"] = []
        return out

    def _lifecycle_snapshot(self, response: Any) -> dict[str, Any]:
        if isinstance(response, dict):
            if not self._snapshot:
                self._snapshot = dict(response)
            merged = {**self._base, **self._snapshot, **response}
        else:
            merged = {**self._base, **self._snapshot}
        return self.snapshot(merged, status="in_progress", output=[])

    def snapshot(self, base: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
        """A Response snapshot with the gateway's id and every field clients require."""
        out: dict[str, Any] = dict(base)
        out.update(fields)
        out["id"] = self.response_id
        out["object"] = "response"
        if self._model:
            out["model"] = self._model
        out.setdefault("model", "unknown")
        if not isinstance(out.get("created_at"), int | float):
            out["created_at"] = int(time.time())
        if self._previous is not None:
            out["previous_response_id"] = self._previous
        for key, default in (
            ("output", []),
            ("error", None),
            ("incomplete_details", None),
            ("instructions", None),
            ("parallel_tool_calls", True),
            ("tool_choice", "auto"),
            ("tools", []),
            ("usage", None),
            ("metadata", {}),
        ):
            if key not in out or (out[key] is None and key in ("output", "tools", "metadata")):
                out[key] = default
        return out

    # -- door 2: local -------------------------------------------------------------------------

    async def emit_local(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Relay frames the gateway made: public already, absolute indexes, no rewriting."""
        await self._send([dict(e) for e in events])

    async def comment(self, text: str = "keep-alive") -> None:
        """A keep-alive comment (consumes no sequence number)."""
        await self._sink.send(keepalive(text))

    # -- the end of a round, the end of the response -----------------------------------------

    async def drain(self, tool_events: Mapping[int, Sequence[Mapping[str, Any]]] | None = None) -> None:
        """End of a round: per index the gateway's tool events, then that index's deferred
        frames (arrival order); index-less frames last. Indexes of ``tool_events`` are the
        client's (absolute); deferred frames carry round-local indexes."""
        tool_events = tool_events or {}
        buckets: dict[int | None, list[_Deferred]] = {}
        for d in self._deferred:
            key = None if d.index is None else d.index + self._offset
            buckets.setdefault(key, []).append(d)
        order = sorted(set(buckets) | set(tool_events), key=defer_order)
        batch: list[dict[str, Any]] = []
        for key in order:
            if key is not None:
                batch += [dict(e) for e in tool_events.get(key, ())]
            batch += [self._rewrite(d.data) for d in buckets.get(key, ())]
        await self._send(batch)
        self._deferred = []
        self._deferred_bytes = 0
        self._boundary = None

    async def complete(self, response: Response | Mapping[str, Any]) -> None:
        """Send the one terminal event, built from the final Response."""
        body = response.to_dict() if isinstance(response, Response) else dict(response)
        body = self.snapshot({**self._base, **body})
        output = body.get("output")
        if isinstance(output, list):  # the items the client could not be sent are not in it either
            body["output"] = [i for i in output if self._item_fate(i, count=False) is None]
        status = body.get("status")
        kind = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(str(status), "response.completed")
        await self._ensure_created()
        await self._send([{"type": kind, "response": body}])
        self.finished = True

    async def fail(self, error: BaseException, *, status: int = 502, output: Sequence[Mapping[str, Any]] = ()) -> None:
        """End the stream on an error (after every frame produced before it): an ``error``
        event, then a ``response.failed`` terminal carrying the same message and code (as
        ``error.code`` when clients know the code, else ``server_error`` with the code in
        ``error.type``) — so clients that raise at ``error`` and clients that wait for a
        terminal both show it.
        ``output``: the items the response holds so far, if the caller knows them."""
        if isinstance(error, RespflowError):
            code, message = error.code, error.message
            kind = "invalid_request_error" if status < 500 else "server_error"
        else:
            code, message, kind = "server_error", f"stream task failed: {type(error).__name__}", "server_error"
        sendable = [dict(i) for i in output if self._item_fate(i, count=False) is None]
        failed = self.snapshot({**self._base, **self._snapshot}, status="failed", output=sendable)
        failed["error"] = response_error(code, message)
        failed["incomplete_details"] = None
        await self._send(
            [
                {
                    "type": "error",
                    "code": code,
                    "message": message,
                    "param": None,
                    "status": status,
                    "error": {"message": message, "type": kind, "code": code},
                },
                {"type": "response.failed", "response": failed},
            ]
        )
        self.finished = True

    async def cancel(self, *, output: Sequence[Mapping[str, Any]] = ()) -> None:
        """End a cancelled response (after every frame produced before it): a
        ``response.failed`` terminal whose Response has ``status: "cancelled"`` and no error —
        the protocol has no cancelled event, and this one every client's model accepts.
        ``output``: the items the response holds so far, if the caller knows them."""
        sendable = [dict(i) for i in output if self._item_fate(i, count=False) is None]
        cancelled = self.snapshot({**self._base, **self._snapshot}, status="cancelled", output=sendable)
        cancelled["error"] = None
        cancelled["incomplete_details"] = None
        await self._ensure_created()
        await self._send([{"type": "response.failed", "response": cancelled}])
        self.finished = True

    async def _ensure_created(self) -> None:
        if "response.created" not in self._sent_types:
            await self._send([], start=True)

    # -- the one funnel ----------------------------------------------------------------------

    def _contract(self, events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[int, str | None, int]]]:
        """The events a strict client's accumulator can take, in order; and the ledger
        updates to commit once they are sent.

        The client (openai's stream helper) appends an item per ``output_item.added`` and a
        part per ``content_part.added``, and indexes them: a second added item at an index, a
        text event for a part that was not added (or is not text), an argument delta for an
        item that is not a function call, would crash it. Such events are dropped (counted in
        `dropped_contract`); a text event for a part not added yet opens it first (a
        synthetic ``content_part.added``, empty ``output_text`` parts for any gap), as the
        fold opened it.
        """
        if len(events) == 1:  # one event per read, the trickle: its common cases at once
            event = events[0]
            kind = event["type"]
            if kind not in _LEDGER_KINDS:
                return events, _NO_UPDATES
            index = event.get("output_index")
            if type(index) is not int:
                return events, _NO_UPDATES  # as below: an index-less event passes as it is
            if kind is _TEXT_DELTA or kind == _TEXT_DELTA:
                opened = self._parts.get(index)
                at = event.get("content_index")
                if opened is not None and type(at) is int and at < len(opened) and opened[at]:
                    return events, _NO_UPDATES
        out: list[dict[str, Any]] = []
        updates: list[tuple[int, str | None, int]] = []  # (index, item type | None, parts)
        items, parts = self._items, self._parts
        pending_items: dict[int, str] = {}
        pending_parts: dict[int, list[bool]] = {}
        append = out.append
        for event in events:
            kind = event["type"]
            if kind not in _LEDGER_KINDS:
                append(event)
                continue
            index = event.get("output_index")
            if type(index) is not int:
                append(event)
                continue
            if kind is _TEXT_DELTA or kind == _TEXT_DELTA:  # the per-token case, first
                opened = pending_parts.get(index) or parts.get(index)
                at = event.get("content_index")
                if opened is not None and type(at) is int and at < len(opened) and opened[at]:
                    append(event)  # a text part of a message (only messages have parts here)
                    continue
            item_type = pending_items.get(index) or items.get(index)
            if item_type == _DROPPED:
                self.dropped_contract += 1  # an event of an item the client was not sent
                continue
            if kind == "response.output_item.added" or kind == "response.output_item.done":
                item = event.get("item")
                fate = self._item_fate(item)
                if fate is not None:  # malformed or (by policy) unknown: the item's events go too
                    if item_type is None:
                        pending_items[index] = _DROPPED
                        updates.append((index, _DROPPED, 0))
                    continue
                if kind == "response.output_item.done":
                    append(event)
                    continue
            if kind == "response.output_item.added":
                assert isinstance(item, dict)
                if item_type is not None:
                    self.dropped_contract += 1
                    continue
                pending_items[index] = str(item.get("type"))
                content = item.get("content")
                pending_parts[index] = [
                    isinstance(p, dict) and p.get("type") == "output_text" for p in (content if isinstance(content, list) else ())
                ]
                updates.append((index, pending_items[index], 0))
                out.append(event)
                continue
            if item_type is None:
                self.dropped_contract += 1  # a content event before its item: never relayed
                continue
            if kind == "response.function_call_arguments.delta":
                if item_type == "function_call":
                    out.append(event)
                else:
                    self.dropped_contract += 1
                continue
            if item_type != "message":
                out.append(event)  # parts of other items: the client does not index them
                continue
            opened = pending_parts.get(index)
            if opened is None:
                opened = pending_parts[index] = list(parts.get(index, ()))
            at = event.get("content_index")
            if type(at) is not int:
                self.dropped_contract += 1
                continue
            if kind == "response.content_part.added":
                if at < len(opened):
                    self.dropped_contract += 1  # a repeat: the client would append it again
                    continue
                out += self._open_parts(index, event.get("item_id"), opened, at)
                part = event.get("part")
                opened.append(isinstance(part, dict) and part.get("type") == "output_text")
                out.append(event)
            else:  # output_text.delta / .done
                if at >= len(opened):
                    out += self._open_parts(index, event.get("item_id"), opened, at + 1)
                if not opened[at]:
                    self.dropped_contract += 1  # text for a part that is not text
                    continue
                out.append(event)
            updates.append((index, None, len(opened)))
        self._pending_parts = pending_parts
        return out, updates

    def _item_fate(self, item: Any, *, count: bool = True) -> str | None:
        """None if a client can be sent this item; else why not (counted)."""
        kind = item.get("type") if isinstance(item, dict) else None
        if not isinstance(kind, str) or not well_formed_type(kind):
            self.dropped_malformed += count
            return "malformed"
        if kind not in CLIENT_ITEM_KINDS and not self._forward_unknown:
            self.dropped_unknown += count
            return "unknown"
        return None

    def _open_parts(self, index: int, item_id: Any, opened: list[bool], upto: int) -> list[dict[str, Any]]:
        """Synthetic ``content_part.added`` events for parts ``len(opened)..upto-1``."""
        made = []
        while len(opened) < upto:
            made.append(
                {
                    "type": "response.content_part.added",
                    "output_index": index,
                    "item_id": item_id if isinstance(item_id, str) else "",
                    "content_index": len(opened),
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                }
            )
            opened.append(True)
        return made

    def _commit_ledger(self, updates: list[tuple[int, str | None, int]]) -> None:
        for index, item_type, _ in updates:
            if item_type is not None:
                self._items[index] = item_type
        for index, opened in self._pending_parts.items():
            self._parts[index] = opened

    async def _send(self, events: list[dict[str, Any]], *, start: bool = False) -> None:
        """Stamp, serialize and send a batch in one write; commit only after it was sent."""
        events, ledger = self._contract(events)
        seq = self.sequence
        sent = self._sent_types  # copied before a lifecycle event changes it (commit after send)
        copied = False
        if "response.created" not in sent and (events or start):
            # every client needs response.created first: make one if upstream sent none yet
            first = events[0]["type"] if events else ""
            if first != "response.created":
                made = [
                    {"type": kind, "response": self._lifecycle_snapshot(None)}
                    for kind in ("response.created", "response.in_progress")
                ]
                events = made + events
        out: list[bytes] = []
        append = out.append
        dumps = orjson.dumps
        heads = _HEADS
        limit = self._max_event
        for event in events:  # every event here is the funnel's own copy
            kind = event["type"]
            if kind in _LIFECYCLE:
                if kind in sent:
                    continue  # once per response
                if kind == "response.in_progress" and "response.created" not in sent:
                    continue
                if not copied:
                    sent, copied = set(sent), True
                sent.add(kind)
            event["sequence_number"] = seq
            head = heads.get(kind) or _head(kind)
            body = dumps(event)
            if len(head) + len(body) + 2 > limit:
                raise LimitExceededError(
                    f"stream event exceeded {limit} bytes; raise max_event_bytes if this is expected",
                    code="event_bytes",
                    stage="relay",
                )
            append(head)
            append(body)
            append(_END)
            seq += 1
        if not out:
            return
        await self._sink.send(b"".join(out))
        self.sequence = seq
        self._sent_types = sent
        if ledger:
            self._commit_ledger(ledger)


@pipable_operator
async def relayed(source: AsyncIterable[Translation], relay: Relay) -> AsyncIterator[int]:
    """The relay sink as an aiostream operator: each batch goes through ``relay`` (awaited, so
    a slow client parks the source); yields the next sequence number after each batch.

    On early exit, error or cancellation the source is closed at once — which is what closes
    the upstream response. An async generator (the runner's ``batches``) is iterated as it is,
    closed by ``aclose``: `streamcontext`'s checks and indirection would cost three Python
    calls per read; any other source goes through ``streamcontext``.
    """
    if isinstance(source, AsyncGenerator):
        try:
            async for translation in source:
                await relay.emit_upstream(translation)
                yield relay.sequence
        finally:
            await source.aclose()
        return
    async with streamcontext(source) as batches:
        async for translation in batches:
            await relay.emit_upstream(translation)
            yield relay.sequence
