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
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
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

_TERMINALS = frozenset({"response.completed", "response.failed", "response.incomplete"})
_LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_TEXT_EVENTS = frozenset({"response.output_text.delta", "response.output_text.done"})
_KEEPALIVES = frozenset({"keepalive", "response.keepalive"})
_NOT_RELAYED = _TERMINALS | _KEEPALIVES | {""}
_SPECIAL = _LIFECYCLE | _TEXT_EVENTS  # frames `_rewrite` may change when nothing is offset


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
    ) -> None:
        """Args:
            sink: where the SSE bytes go.
            response_id: the public response id every snapshot carries.
            model: the public model name (upstream's when None).
            previous_response_id: echoed in snapshots when the request had one.
            limits: the defer-window and event-size bounds.
            base: request fields for lifecycle snapshots (tools, instructions, metadata…);
                upstream's snapshot fields win over them.
        """
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
                if offset or kind in _SPECIAL or "response" in data:
                    data = self._rewrite(data)
                ready.append(data)
            await self._send(ready)
            return
        now: list[dict[str, Any]] = []
        new_deferred: list[_Deferred] = []
        extra_bytes = 0
        for frame in frames:
            data = frame.data if isinstance(frame, Frame) else dict(frame)
            if not _relayable(data):
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
        logprobs = kind in _TEXT_EVENTS and type(data.get("logprobs")) is not list
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
        status = body.get("status")
        kind = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(str(status), "response.completed")
        await self._ensure_created()
        await self._send([{"type": kind, "response": body}])
        self.finished = True

    async def fail(self, error: BaseException, *, status: int = 502, output: Sequence[Mapping[str, Any]] = ()) -> None:
        """End the stream on an error (after every frame produced before it): an ``error``
        event, then a ``response.failed`` terminal carrying the same code and message — so
        clients that raise at ``error`` and clients that wait for a terminal both show it.
        ``output``: the items the response holds so far, if the caller knows them."""
        if isinstance(error, RespflowError):
            code, message = error.code, error.message
            kind = "invalid_request_error" if status < 500 else "server_error"
        else:
            code, message, kind = "server_error", f"stream task failed: {type(error).__name__}", "server_error"
        failed = self.snapshot({**self._base, **self._snapshot}, status="failed", output=[dict(i) for i in output])
        failed["error"] = {"code": code, "message": message}
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

    async def _ensure_created(self) -> None:
        if "response.created" not in self._sent_types:
            await self._send([], start=True)

    # -- the one funnel ----------------------------------------------------------------------

    async def _send(self, events: list[dict[str, Any]], *, start: bool = False) -> None:
        """Stamp, serialize and send a batch in one write; commit only after it was sent."""
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


@pipable_operator
async def relayed(source: AsyncIterable[Translation], relay: Relay) -> AsyncIterator[int]:
    """The relay sink as an aiostream operator: each batch goes through ``relay`` (awaited, so
    a slow client parks the source); yields the next sequence number after each batch.

    The source is iterated inside ``streamcontext``: on early exit, error or cancellation it
    is closed at once — which is what closes the upstream response.
    """
    async with streamcontext(source) as batches:
        async for translation in batches:
            await relay.emit_upstream(translation)
            yield relay.sequence
