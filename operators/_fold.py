"""fold: accepted `Frame`s → the final `Response`.

In: validated frames (their ``output_index`` and ``item_id`` resolved). Out: the same frames,
unchanged but for ids the fold had to make up (an item that arrives with an empty id gets
``<prefix><hex>``, written into its frames so the stream and the final Response agree);
`finish()` returns the Response.

State: one slot per ``output_index`` — ``Active(Building)`` until its done, then
``Done(item)`` — and the response-level fields: the id and snapshot from ``response.created``,
the terminal type, ``usage``, ``error`` and ``incomplete_details`` taken from EVERY terminal
type (completed, failed, incomplete). A repeated done cannot make a second item: an index has
exactly one slot. Per-kind behaviour comes from the `KINDS` descriptor table.

At `finish()` the slots are drained sorted by ``output_index``: done items as they are, active
items through their kind's ``finalize`` (a half-streamed call keeps its buffered arguments; an
unfinished web search is dropped) and, unless the response completed, marked ``incomplete``.
A stream that ends without a terminal event (cut, garbage, ``[DONE]`` too early, an upstream
``error`` event then EOF) folds what arrived and ends ``failed`` with
``error: {"code": "server_error", "message": …}`` — the upstream's own error when it sent one,
else `NO_TERMINAL` — never ``completed``: a client must be able to tell a cut answer from a
whole one (the lenient EOF recovery; the strict policy has already refused such a stream).
Raises `LimitExceededError` when the retained bytes pass ``max_retained_bytes``, and
`ProtocolError` (``invalid_response``) when an upstream field has a type the Response cannot
hold (an item id that is a list, a model that is a number) — under either policy.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from pydantic import ValidationError

from respflow.operators._errors import LimitExceededError, ProtocolError, RespflowError
from respflow.operators._frames import Action, EventSpec, Frame
from respflow.operators._items import Building, KindSpec, complete_item, kind_spec, new_id
from respflow.operators._response import Response

# enum members bound once: `Action.X` is a slow lookup on the per-token path
_COMPLETE = Action.COMPLETE
_CREATED = Action.CREATED
_MUTATE = Action.MUTATE
_OPEN = Action.OPEN
_TERMINAL = Action.TERMINAL

NO_TERMINAL = "the upstream ended the stream without a terminal event"
"""The error message of a response whose upstream stream ended without a terminal event."""

_OTHER = Action.OTHER

_STATUS = {
    "response.completed": "completed",
    "response.failed": "failed",
    "response.incomplete": "incomplete",
}


class Slot:
    """One output item: active while it streams, done once its done arrived."""

    __slots__ = ("appends", "building", "deltas", "done", "generated", "item", "spec")

    def __init__(
        self,
        spec: KindSpec,
        building: Building | None,
        item: dict[str, Any] | None,
        generated: bool = False,
    ) -> None:
        self.spec = spec
        self.deltas = spec.deltas
        self.appends = spec.appends
        self.building = building
        self.item = item
        self.done = item is not None
        self.generated = generated
        """The item id was made up here: frames that name no item get it written in."""

    def current(self) -> dict[str, Any]:
        """The item as far as it is known."""
        if self.item is not None:
            return self.item
        assert self.building is not None
        return self.building.item

    def arguments(self) -> str:
        """For calls: the arguments (or input) so far — the item's own, else the deltas."""
        item = self.current()
        field = "input" if item.get("type") == "custom_tool_call" else "arguments"
        own = item.get(field)
        if isinstance(own, str) and own:
            return own
        return self.building.buffered() if self.building is not None else ""


class Folder:
    """Fold accepted frames into one Response."""

    def __init__(
        self,
        *,
        response_id: str | None = None,
        model: str | None = None,
        max_retained_bytes: int = 8 << 20,
    ) -> None:
        self._response_id = response_id
        self._model = model
        self._max_retained = max_retained_bytes
        self._retained = 0
        self.slots: dict[int, Slot] = {}
        self._snapshot: dict[str, Any] = {}
        self._terminal: str | None = None
        self._metadata: dict[str, Any] = {}
        self._upstream_error: dict[str, Any] | None = None
        self._finished = False

    @property
    def response_id(self) -> str:
        """The public response id: the one given, else upstream's, else a new one — fixed
        from the first time it is read, so every emitter and the Response agree."""
        if self._response_id is None:
            upstream = self._snapshot.get("id")
            self._response_id = upstream if isinstance(upstream, str) and upstream else new_id("resp_")
        return self._response_id

    @property
    def terminal(self) -> str | None:
        """The terminal event type seen, if any."""
        return self._terminal

    @property
    def cut(self) -> bool:
        """The stream ended (or is read now) without a terminal event."""
        return self._terminal is None

    def outcome(self) -> dict[str, Any]:
        """``status``, ``error``, ``incomplete_details`` and ``usage`` as the Response carries them."""
        meta = self._metadata
        if self._terminal is None:
            error = self._upstream_error or {"code": "server_error", "message": NO_TERMINAL}
            return {"status": "failed", "error": error, "incomplete_details": None, "usage": complete_usage(meta.get("usage"))}
        return {
            "status": _STATUS[self._terminal],
            "error": meta.get("error"),
            "incomplete_details": meta.get("incomplete_details"),
            "usage": complete_usage(meta.get("usage")),
        }

    def feed(self, frame: Frame) -> list[Frame]:
        """Fold one accepted frame; pass it on."""
        return self.feed_all([frame])

    def apply(self, frame: Frame) -> None:
        """Fold one accepted frame."""
        self.feed_all([frame])

    def flush(self) -> list[Frame]:
        """Nothing is held back; the Response comes from `finish`."""
        return []

    def feed_all(self, frames: list[Frame]) -> list[Frame]:
        """Fold a batch; pass it on (``partial`` on an error).

        The one implementation: the per-item methods call it with one frame.
        """
        slots = self.slots
        retained = self._retained
        limit = self._max_retained
        mutate = _MUTATE
        # The run: consecutive deltas of one type for the same item and part append to one
        # buffer, found once (a delta changes nothing else; any other frame ends the run).
        run_spec: EventSpec | None = None
        run_index: Any = None
        run_field: str | None = None
        run_part: Any = None
        run_chunks: list[str] = []
        run_fill: str | None = None  # the id made up here, for the run's frames that name none
        frame: Frame | None = None
        try:
            for frame in frames:
                spec = frame.spec
                data = frame.data
                if (
                    spec is not run_spec
                    or data["output_index"] != run_index
                    or (run_field is not None and data.get(run_field, 0) != run_part)
                ):
                    run_spec = None
                    if spec.action is not mutate:
                        self._retained = retained
                        self._apply_item_or_response(frame)
                        retained = self._retained
                        continue
                    slot = slots.get(data["output_index"])
                    if slot is None or slot.done:
                        continue
                    building = slot.building
                    assert building is not None  # an active slot is building its item
                    buffer = slot.appends.get(spec.type)
                    if buffer is None:  # a done text, a part, an annotation, a status
                        fn = slot.deltas.get(spec.type)
                        if fn is not None:
                            retained += fn(building, data)
                            if retained > limit:
                                self._retained = retained
                                self._charge_bytes(0, frame)
                        if slot.generated and spec.needs_item_id and not data.get("item_id"):
                            data["item_id"] = slot.current().get("id", "")
                        continue
                    run_spec, run_index = spec, data["output_index"]
                    run_fill = slot.current().get("id", "") if slot.generated and spec.needs_item_id else None
                    run_field = spec.index_field
                    run_part = None if run_field is None else data.get(run_field, 0)
                    run_chunks = buffer(building, data)
                text = data.get("delta") or ""
                run_chunks.append(text)
                retained += len(text)
                if retained > limit:
                    self._retained = retained
                    self._charge_bytes(0, frame)
                if run_fill is not None and not data.get("item_id"):
                    data["item_id"] = run_fill  # frames name the made-up id
        except RespflowError as exc:
            exc.partial = frames[: frames.index(frame)] if frame is not None else []
            raise
        self._retained = retained
        return frames

    def _apply_item_or_response(self, frame: Frame) -> None:
        action = frame.spec.action
        data = frame.data
        if action is _OPEN:
            item = data["item"]
            spec = kind_spec(item.get("type", ""))
            if type(item.get("id")) in (int, float) and not isinstance(item["id"], bool):
                item["id"] = str(item["id"])  # a number: the same id, as the string clients need
            generated = not item.get("id") or type(item["id"]) is not str
            if generated:
                given = item.get("item_id")
                item["id"] = given if type(given) is str and given else new_id(spec.id_prefix)
            # what clients require and upstream left out (a function call's call_id may come
            # with its done: translate holds the call until then)
            complete_item(item, done=False, derive_call_id=item.get("type") != "function_call")
            self._charge_item(item, frame)
            self.slots[data["output_index"]] = Slot(spec, spec.from_added(item), None, generated)
        elif action is _COMPLETE:
            self._complete(frame)
        elif action is _CREATED:
            response = data.get("response")
            if isinstance(response, dict) and not self._snapshot:
                self._snapshot = response
        elif action is _TERMINAL and self._terminal is None:
            self._terminal = frame.type
            response = data.get("response")
            if isinstance(response, dict):
                self._metadata = response
        elif action is _OTHER and frame.type == "error" and self._upstream_error is None:
            self._upstream_error = upstream_error(data)

    def _complete(self, frame: Frame) -> None:
        data = frame.data
        item = data["item"]
        index = data["output_index"]
        slot = self.slots.get(index)
        if slot is None:  # done-only
            spec = kind_spec(item.get("type", ""))
            if not item.get("id") or type(item["id"]) is not str:
                given = item.get("item_id")
                item["id"] = given if type(given) is str and given else new_id(spec.id_prefix)
            self._charge_item(item, frame)
            final = complete_item(spec.apply_done(Building({}), item), done=True)
            self.slots[index] = Slot(spec, None, final)
            data["item"] = final
            return
        if slot.done or slot.building is None:
            return
        merged = complete_item(slot.spec.apply_done(slot.building, item), done=True)
        # the client saw the item's identity in its added event: the done keeps it (a client
        # refuses a done whose id or call_id differs from its added's)
        added = slot.building.item
        merged["id"] = added["id"]
        merged["type"] = added.get("type")
        if type(added.get("call_id")) is str and added["call_id"] and "call_id" in merged:
            merged["call_id"] = added["call_id"]
        slot.item = merged
        slot.done = True
        # the client's done item is the final item: fallbacks and made-up ids included
        data["item"] = merged

    def _charge_bytes(self, size: int, frame: Frame) -> None:
        self._retained += size
        if self._retained > self._max_retained:
            raise LimitExceededError(
                f"the response retained more than {self._max_retained} bytes; "
                "raise max_retained_bytes if this is expected",
                code="retained_bytes",
                stage="fold",
                line=frame.line,
            )

    def _charge_item(self, item: dict[str, Any], frame: Frame) -> None:
        self._charge_bytes(len(orjson.dumps(item)), frame)

    # -- the end ---------------------------------------------------------------------------------

    def output(self) -> list[dict[str, Any]]:
        """The output items so far, sorted by output_index (active ones finalized)."""
        return [item for _, item in self.output_indexed()]

    def output_indexed(self) -> list[tuple[int, dict[str, Any]]]:
        """``(output_index, item)`` for every item, in index order (upstream shapes)."""
        out: list[tuple[int, dict[str, Any]]] = []
        unfinished = self._terminal != "response.completed"
        for index, slot in sorted(self.slots.items()):
            if slot.item is not None:
                out.append((index, slot.item))
            elif slot.building is not None:
                final = slot.spec.finalize(slot.building)
                if final is not None:
                    complete_item(final, done=True)
                    if unfinished and "status" in final:
                        final["status"] = "incomplete"  # it never got its done event
                    out.append((index, final))
        return out

    def finish(self) -> Response:
        """Build the final Response. Call once, at the end of the stream."""
        if self._finished:
            raise RuntimeError("fold.finish() was already called")
        self._finished = True
        base: dict[str, Any] = {}
        base.update(self._snapshot)
        base.update(self._metadata)
        outcome = self.outcome()
        if self._response_id is None and isinstance(base.get("id"), str) and base["id"]:
            self._response_id = base["id"]
        response_id = self.response_id
        created_at = base.get("created_at")
        indexed = self.output_indexed()
        body: dict[str, Any] = {
            key: value
            for key, value in base.items()
            if key not in ("output", "usage", "error", "incomplete_details", "status")
        }
        body.update(
            id=response_id,
            object="response",
            created_at=created_at if isinstance(created_at, int | float) else int(time.time()),
            model=self._model or base.get("model") or "unknown",
            output=[item for _, item in indexed],
            **outcome,
            parallel_tool_calls=base.get("parallel_tool_calls", True),
            tool_choice=base.get("tool_choice", "auto"),
            tools=base.get("tools") or [],
        )
        try:
            return Response.model_validate(body)
        except ValidationError as exc:
            raise unstorable(exc, [index for index, _ in indexed]) from None


def unstorable(exc: ValidationError, indexes: list[int]) -> ProtocolError:
    """Upstream fields of the wrong type (an id that is a list, a model that is a number):
    the Response cannot be built — a typed error, whatever the policy."""
    first = exc.errors()[0]
    loc = first.get("loc", ())
    output_index = None
    if len(loc) > 1 and loc[0] == "output" and isinstance(loc[1], int) and loc[1] < len(indexes):
        output_index = indexes[loc[1]]  # the output_index of that output position
    where = ".".join(str(part) for part in loc) or "response"
    return ProtocolError(
        f"upstream stream cannot be stored: {where}: {first.get('msg', 'invalid')}",
        code="invalid_response",
        stage="fold",
        output_index=output_index,
    )


RESPONSE_ERROR_CODES = frozenset(
    {
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "vector_store_timeout",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    }
)
"""The codes a Response's ``error.code`` may have (the official client's enum): any other code
is reported as ``server_error``, the original one kept in ``error.type``."""


def response_error(code: str, message: str) -> dict[str, Any]:
    """A Response's ``error`` for ``code``/``message``, in the shape strict clients accept."""
    if code in RESPONSE_ERROR_CODES:
        return {"code": code, "message": message}
    return {"code": "server_error", "message": message, "type": code}


def upstream_error(data: dict[str, Any]) -> dict[str, Any]:
    """The Response ``error`` for an upstream ``error`` event (either shape: flat, or an
    ``error`` object): its message (bounded), its code if clients know it (else
    ``server_error``, the code in ``type``)."""
    inner = data.get("error")
    inner = inner if isinstance(inner, dict) else {}
    code = data.get("code") if isinstance(data.get("code"), str) else inner.get("code")
    message = data.get("message") if isinstance(data.get("message"), str) else inner.get("message")
    text = str(message)[:1000] if message else "the upstream reported an error"
    return response_error(code if isinstance(code, str) and code else "server_error", text)


def complete_usage(usage: Any) -> Any:
    """Add the usage fields strict clients require and vLLM omits, as zeros.

    openai ≥ 2.54 requires ``input_tokens_details.cache_write_tokens``; vLLM sends neither
    detail object. Counts that were sent are never changed.
    """
    if not isinstance(usage, dict):
        return usage
    usage = dict(usage)
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        usage.setdefault(key, 0)
    details = usage.get("input_tokens_details")
    details = dict(details) if isinstance(details, dict) else {}
    details.setdefault("cached_tokens", 0)
    details.setdefault("cache_write_tokens", 0)
    usage["input_tokens_details"] = details
    out_details = usage.get("output_tokens_details")
    out_details = dict(out_details) if isinstance(out_details, dict) else {}
    out_details.setdefault("reasoning_tokens", 0)
    usage["output_tokens_details"] = out_details
    return usage
