"""validate: `Frame` → accepted `Frame` (or nothing), under one policy field.

In: normalized frames. Out: each frame that is accepted, with its ``output_index`` (and, for a
sub-event that named no item, its ``item_id``) resolved and written into the wire JSON; ignored frames produce nothing, so nothing
downstream folds, translates or emits them.

Both policies run the same traversal; `Validation.STRICT` only adds checks and chooses
reject over ignore (``reference/upstream-behaviour.md`` §3):

* strict: stateless frame checks (type, response object/id/status, item id and kind,
  required payload and index fields), lifecycle order created → in_progress → terminal with a
  stable response id, nothing after the terminal, no active item at the terminal, the
  terminal ``output`` matching the done items, a stable ``call_id`` (not checked on failed),
  EOF without a terminal is an error;
* both: index/id/kind identity of every item event, a reused index, a conflicting repeated
  done, an ambiguous missing index;
* lenient: a sub-event whose index, payload or part is present with the wrong type (a
  ``delta`` of 5, a ``content_index`` of "x") is ignored; a missing index is recovered from
  the bound id, or the lowest free index for an
  added or done-only item; orphan, late and wrong-kind deltas are ignored; an identical
  repeated done is ignored; malformed payloads are counted and skipped; events after the
  terminal are ignored.

State: the lifecycle phase, the response id, one identity record per output_index (kind, id,
active/done, the retained done item), the id → index map, call_ids. Raises `ProtocolError`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from respflow.operators._errors import ProtocolError
from respflow.operators._frames import INT, STR, Action, EventSpec, Frame, Validation, part_problem
from respflow.operators._items import KINDS, OUTPUT_ITEM, known_kind

# enum members bound once: `Action.X` is a slow lookup on the per-token path
_A_COMPLETE = Action.COMPLETE
_A_CREATED = Action.CREATED
_A_IN_PROGRESS = Action.IN_PROGRESS
_A_MUTATE = Action.MUTATE
_A_OPEN = Action.OPEN
_A_OTHER = Action.OTHER
_A_QUEUED = Action.QUEUED
_A_TERMINAL = Action.TERMINAL

_AWAITING, _CREATED, _IN_PROGRESS, _TERMINAL = range(4)
_U32_MAX = 0xFFFFFFFF


class _Slot:
    __slots__ = ("call_id", "done", "done_item", "item_id", "kind")

    def __init__(self, kind: str, item_id: str) -> None:
        self.kind = kind
        self.item_id = item_id
        self.done = False
        self.done_item: dict[str, Any] | None = None
        self.call_id = ""


def _kept(frames: list[Frame], dropped: set[int] | None) -> list[Frame]:
    if not dropped:
        return frames
    return [frame for frame in frames if id(frame) not in dropped]


class Validator:
    """Check each frame against the protocol rules; resolve its output_index."""

    def __init__(self, validation: Validation = Validation.LENIENT) -> None:
        self.validation = validation
        self._strict = validation is Validation.STRICT
        # phases in which a delta for a bound, active item needs no lifecycle check
        self._fast_phases = frozenset({_IN_PROGRESS} if self._strict else {_AWAITING, _CREATED, _IN_PROGRESS})
        self._phase = _AWAITING
        self._response_id: str | None = None
        self._slots: dict[int, _Slot] = {}
        self._by_id: dict[str, int] = {}
        self._call_id_changed: int | None = None
        self.skipped = 0
        """Malformed payloads skipped (lenient)."""
        self.ignored = 0
        """Well-formed events ignored by a lenient recovery (orphan, late, repeated)."""

    @property
    def terminated(self) -> bool:
        """True once a terminal event was accepted."""
        return self._phase == _TERMINAL

    def feed(self, frame: Frame) -> list[Frame]:
        """Accept (``[frame]``) or ignore (``[]``) one frame, or raise."""
        return self.feed_all([frame])

    def accept(self, frame: Frame) -> bool:
        """True if the frame is accepted, False if it is ignored; raises on a violation."""
        return bool(self.feed_all([frame]))

    def feed_all(self, frames: list[Frame]) -> list[Frame]:
        """The accepted frames of a batch, in order (``partial`` on an error).

        The one implementation: the per-item methods call it with one frame.
        """
        dropped: set[int] | None = None  # ids of ignored frames; usually there are none
        slots = self._slots
        strict = self._strict
        fast_phases = self._fast_phases
        fast = self._phase in fast_phases
        mutate = _A_MUTATE
        # The run: the sub-event type, index and id of the last frame the fast path bound.
        # A frame of the same type for the same index and id needs no slot lookup: nothing
        # on the fast path changes state, and the slow path ends the run.
        run_spec: EventSpec | None = None
        run_index: Any = None
        run_item_id: Any = None
        run_field: str | None = None  # the run's index field and payload, for the type test
        run_payload: str | None = None
        frame: Frame | None = None
        try:
            for frame in frames:
                spec = frame.spec
                data = frame.data
                if (
                    spec is not run_spec
                    or data.get("output_index") != run_index
                    or data.get("item_id") != run_item_id
                ):
                    run_spec = None
                    if fast and spec.action is mutate and not spec.needs_part:
                        # a sub-event for a bound, active item at its own index starts a run
                        index = data.get("output_index")
                        slot = slots.get(index)  # type: ignore[arg-type]
                        item_id = data.get("item_id")
                        if (
                            slot is not None
                            and not slot.done
                            and slot.kind in spec.kinds
                            and item_id
                            and item_id == slot.item_id
                            and not spec.extra
                        ):
                            run_spec, run_index, run_item_id = spec, index, item_id
                            run_field, run_payload = spec.index_field, spec.payload
                if spec is run_spec and "call_id" not in data:
                    if strict:
                        self._check_frame(frame)
                        continue
                    # lenient: the field tests of _ill_typed, inline (same tests; parts and
                    # extra fields never run): present, and of the type clients require
                    value = 0 if run_field is None else data.get(run_field)
                    payload_ok = run_payload is None or type(data.get(run_payload)) is str
                    if type(value) is int and not value >> 32 and payload_ok:
                        continue
                run_spec = None
                if not self._accept(frame):
                    if dropped is None:
                        dropped = set()
                    dropped.add(id(frame))
                fast = self._phase in fast_phases
        except ProtocolError as exc:
            before = frames[: frames.index(frame)] if frame is not None else []
            exc.partial = _kept(before, dropped)
            raise exc.at(line=frame.line if frame is not None else None, stage="validate") from None
        return frames if dropped is None else _kept(frames, dropped)

    def flush(self) -> list[Frame]:
        """End of input: strict requires that a terminal event was seen."""
        if self._strict and self._phase != _TERMINAL:
            raise ProtocolError(
                "upstream stream ended without a terminal event (response.completed, "
                "response.failed or response.incomplete)",
                code="eof_without_terminal",
                stage="validate",
            )
        return []

    # -- the traversal -----------------------------------------------------------------------

    def _accept(self, frame: Frame) -> bool:
        if frame.malformed:
            if self._strict:
                if frame.malformed == "utf8":
                    raise ProtocolError(
                        "upstream stream contains a data frame that is not valid UTF-8",
                        code="invalid_utf8",
                    )
                raise ProtocolError(
                    "upstream stream contains a malformed data frame (not a JSON object with a "
                    "string 'type')",
                    code="malformed_frame",
                )
            self.skipped += 1
            return False
        if self._phase == _TERMINAL:
            if self._strict:
                raise ProtocolError(
                    f"upstream stream contains an event after its terminal event ({frame.type or 'untyped'})",
                    code="event_after_terminal",
                )
            self.ignored += 1
            return False
        action = frame.spec.action
        if self._strict:
            self._check_frame(frame)
            self._check_lifecycle(frame)
        elif (action is _A_MUTATE or frame.spec.extra) and _ill_typed(frame.data, frame.spec) is not None:
            self.ignored += 1  # a field a client cannot take: a delta of 5, no delta at all
            return False
        if action is _A_OPEN or action is _A_COMPLETE or action is _A_MUTATE:
            return self._resolve(frame, action)
        if action is _A_CREATED:
            if self._phase == _AWAITING:
                self._phase = _CREATED
                response = frame.data.get("response")
                if isinstance(response, dict):
                    self._response_id = response.get("id")
            return True
        if action is _A_IN_PROGRESS or action is _A_QUEUED:
            if self._phase < _IN_PROGRESS:
                self._phase = _IN_PROGRESS
            return True
        if action is _A_TERMINAL:
            if self._strict:
                self._check_terminal(frame)
            self._phase = _TERMINAL
        return True

    # -- strict: stateless checks --------------------------------------------------------------

    def _check_frame(self, frame: Frame) -> None:
        data = frame.data
        spec = frame.spec
        if not frame.type:
            raise ProtocolError("streaming event has no valid 'type'", code="missing_type")
        action = spec.action
        if action is _A_OTHER:
            wrong = _ill_typed(data, spec) if spec.extra else None
            if wrong is not None:
                raise _missing(frame.type, wrong)
            return
        if spec.status is not None:
            response = data.get("response")
            if type(response) is not dict:
                raise _missing(frame.type, "response")
            if not _nonempty(response.get("id")):
                raise _missing(frame.type, "response.id")
            status = response.get("status")
            if not _nonempty(status):
                raise _missing(frame.type, "response.status")
            if status != spec.status:
                raise ProtocolError(
                    f"upstream stream event '{frame.type}' has status '{str(status)[:32]}', "
                    f"expected '{spec.status}'",
                    code="status_mismatch",
                )
            return
        if "output_index" not in data:
            raise _missing(frame.type, "output_index", code="identity_required")
        if action is _A_OPEN or action is _A_COMPLETE:
            item = data.get("item")
            if type(item) is not dict:
                raise _missing(frame.type, "item")
            if not _nonempty(_item_id(item)):
                raise _missing(frame.type, "item.id", code="identity_required")
            kind = item.get("type")
            if not known_kind(kind):
                raise ProtocolError(
                    f"upstream stream has an unsupported output item type {str(kind)[:40]!r}",
                    code="unknown_item_type",
                )
            if action is _A_COMPLETE:
                _check_item(item, "upstream stream output item is invalid")
            return
        if spec.needs_item_id and not _nonempty(data.get("item_id")):
            raise _missing(frame.type, "item_id")
        wrong = _ill_typed(data, spec)
        if wrong is not None:
            raise _missing(frame.type, wrong)

    # -- strict: lifecycle --------------------------------------------------------------------

    def _check_lifecycle(self, frame: Frame) -> None:
        action = frame.spec.action
        if action is _A_CREATED:
            if self._phase != _AWAITING:
                raise ProtocolError(
                    "upstream stream event 'response.created' is out of lifecycle order "
                    "(a response is created once, first)",
                    code="lifecycle_order",
                )
            return
        if action is _A_IN_PROGRESS or action is _A_QUEUED:
            if self._phase not in (_CREATED, _IN_PROGRESS) or (
                action is _A_IN_PROGRESS and self._phase != _CREATED
            ):
                raise ProtocolError(
                    f"upstream stream event '{frame.type}' is out of lifecycle order",
                    code="lifecycle_order",
                )
            self._check_same_id(frame)
            return
        if action is _A_TERMINAL:
            if self._phase != _IN_PROGRESS:
                raise ProtocolError(
                    f"upstream stream event '{frame.type}' is out of lifecycle order "
                    "(a terminal needs response.created and response.in_progress first)",
                    code="lifecycle_order",
                )
            self._check_same_id(frame)
            return
        if self._phase != _IN_PROGRESS:
            raise ProtocolError(
                f"upstream stream event '{frame.type or 'untyped'}' is out of lifecycle order "
                "(item and other events need response.in_progress first)",
                code="lifecycle_order",
            )

    def _check_same_id(self, frame: Frame) -> None:
        if frame.data["response"].get("id") != self._response_id:
            raise ProtocolError(
                f"upstream stream event '{frame.type}' changes the response id",
                code="response_id_changed",
            )

    def _check_terminal(self, frame: Frame) -> None:
        failed = frame.type == "response.failed"
        # a failed response may leave items open (the protocol allows it); others may not
        active = [] if failed else sorted(i for i, s in self._slots.items() if not s.done)
        if active:
            raise ProtocolError(
                f"upstream stream ended with unfinished output items (output[{active[0]}])",
                code="unfinished_items",
                output_index=active[0],
            )
        response = frame.data["response"]
        output = None if failed else response.get("output")
        if output is not None:
            if type(output) is not list or len(output) != len(self._slots):
                raise _terminal_mismatch()
            seen: set[str] = set()
            for position, (index, slot) in enumerate(sorted(self._slots.items())):
                item = output[position]
                if type(item) is not dict:
                    raise _terminal_mismatch()
                item_id = _item_id(item)
                if not _nonempty(item_id) or not known_kind(item.get("type")):
                    raise _terminal_mismatch()
                if item_id in seen:
                    raise ProtocolError(
                        f"terminal upstream response repeats output item at output[{position}]",
                        code="terminal_repeats_item",
                        output_index=position,
                    )
                seen.add(item_id)
                if (not slot.done and not failed) or slot.kind != item.get("type"):
                    raise _terminal_mismatch()
                _check_item(item, "terminal upstream response output item is invalid")
                self._see_call_id(index, item.get("call_id"))
        if not failed and self._call_id_changed is not None:
            n = self._call_id_changed
            raise ProtocolError(
                f"upstream stream changes 'call_id' for output[{n}]",
                code="call_id_changed",
                output_index=n,
            )

    # -- identity: both policies ---------------------------------------------------------------

    def _resolve(self, frame: Frame, action: Action) -> bool:
        data = frame.data
        if action is _A_MUTATE:
            raw_id = data.get("item_id")
            kinds = frame.spec.kinds
            item: dict[str, Any] | None = None
        else:
            item = data.get("item")
            if type(item) is not dict:
                if self._strict:
                    raise _missing(frame.type, "item")
                self.skipped += 1
                return False
            raw_id = _item_id(item)
            kind = item.get("type")
            if type(kind) is not str or not kind:
                if self._strict:
                    raise _missing(frame.type, "item.type")
                kind = "message" if action is _A_COMPLETE and "content" in item else ""
                if not kind:
                    self.skipped += 1
                    return False
            kinds = frozenset((kind,))
        item_id = raw_id if type(raw_id) is str else ""
        index: int | None = data.get("output_index")
        if index is None and self._strict and frame.spec.needs_item_id:
            raise ProtocolError(
                "upstream item requires 'output_index' and a non-empty item ID",
                code="identity_required",
            )
        if item_id:
            bound = self._by_id.get(item_id)
            if bound is not None and index is not None and bound != index:
                raise _mismatch(index)
        else:
            bound = None
        if index is None:
            if bound is not None:
                index = bound
            else:
                if action is not _A_OPEN:
                    if not item_id or any(
                        not s.item_id and not s.done and s.kind in kinds for s in self._slots.values()
                    ):
                        raise ProtocolError(
                            "upstream item has ambiguous identity without 'output_index'",
                            code="ambiguous_identity",
                        )
                    if action is _A_MUTATE:
                        self.ignored += 1
                        return False
                index = self._lowest_free()
            data["output_index"] = index
        slot = self._slots.get(index)

        if action is _A_OPEN:
            if slot is not None:
                raise ProtocolError(
                    f"upstream stream repeats output item or reuses its output_index ({index})",
                    code="repeated_item",
                    output_index=index,
                )
            slot = self._slots[index] = _Slot(next(iter(kinds)), item_id)
            if item_id:
                self._by_id[item_id] = index
            assert item is not None
            self._see_call_id(index, item.get("call_id"))
            return True

        if slot is None:
            if self._strict:
                raise _no_active(frame, index)
            if action is _A_MUTATE:
                self.ignored += 1
                return False
            # a done-only item: materialized at its (recovered) index
            assert item is not None
            slot = self._slots[index] = _Slot(next(iter(kinds)), item_id)
            slot.done = True
            slot.done_item = item
            if item_id:
                self._by_id[item_id] = index
            self._see_call_id(index, item.get("call_id"))
            return True

        if item_id and slot.item_id and item_id != slot.item_id:
            raise _mismatch(index)
        if slot.kind not in kinds:
            if action is _A_MUTATE and not self._strict:
                self.ignored += 1
                return False
            raise _mismatch(index)
        if slot.done:
            if self._strict or action is _A_MUTATE:
                if self._strict:
                    raise _no_active(frame, index)
                self.ignored += 1
                return False
            assert item is not None
            if _same_done(slot, item):
                self.ignored += 1
                return False
            raise ProtocolError(
                f"upstream stream contains conflicting repeated output_item.done for output[{index}]",
                code="conflicting_repeat",
                output_index=index,
            )
        if item_id and not slot.item_id:
            slot.item_id = item_id
            self._by_id[item_id] = index
        if action is _A_COMPLETE:
            assert item is not None
            slot.done = True
            slot.done_item = item
            self._see_call_id(index, item.get("call_id"))
        else:
            if "call_id" in data:
                self._see_call_id(index, data.get("call_id"))
            if not item_id and slot.item_id and frame.spec.needs_item_id:
                data["item_id"] = slot.item_id  # resolved like the index: frames name their item
        return True

    def _lowest_free(self) -> int:
        index = 0
        slots = self._slots
        while index in slots:
            index += 1
        if index > _U32_MAX:
            raise ProtocolError("no free output_index left", code="identity_required")
        return index

    def _see_call_id(self, index: int, call_id: Any) -> None:
        if type(call_id) is not str or not call_id:
            return
        slot = self._slots.get(index)
        if slot is None:
            return
        if not slot.call_id:
            slot.call_id = call_id
        elif slot.call_id != call_id and (
            self._call_id_changed is None or index < self._call_id_changed
        ):
            self._call_id_changed = index


# ---- helpers --------------------------------------------------------------------------------


def _item_id(item: dict[str, Any]) -> Any:
    value = item.get("id")
    return value if value else item.get("item_id")


def _nonempty(value: Any) -> bool:
    return type(value) is str and value != ""


def _ill_typed(data: dict[str, Any], spec: EventSpec) -> str | None:
    """The first field a client requires of this sub-event that is missing or of the wrong
    type, or None (`EventSpec.fields`: index fields unsigned 32-bit integers, payloads
    strings, ``part`` an object). Strict rejects such an event (``missing_field``); lenient
    ignores it and counts it — it is never relayed for a client to choke on."""
    for name, kind in spec.fields:
        value = data.get(name)
        if kind is INT:
            if type(value) is not int or value >> 32:  # not 0 <= value <= 0xFFFFFFFF
                return name
        elif kind is STR:
            if type(value) is not str:
                return name
        elif type(value) is not dict:
            return name
        elif name == "part":
            problem = part_problem(spec.type, value)
            if problem is not None:
                return problem
    return None


_EMPTY: dict[str, Any] = {}


def _missing(owner: str, field: str, code: str = "missing_field") -> ProtocolError:
    return ProtocolError(f"{owner} has no valid '{field}'", code=code)


def _mismatch(index: int) -> ProtocolError:
    return ProtocolError(
        f"upstream stream event does not match its active output item at output[{index}]: "
        "inconsistent item ID, output_index, or kind",
        code="identity_mismatch",
        output_index=index,
    )


def _no_active(frame: Frame, index: int) -> ProtocolError:
    return ProtocolError(
        f"upstream stream event '{frame.type}' has no active output item at output[{index}]",
        code="no_active_item",
        output_index=index,
    )


def _terminal_mismatch() -> ProtocolError:
    return ProtocolError(
        "terminal upstream response output does not match completed item events",
        code="terminal_output_mismatch",
    )


def _check_item(item: dict[str, Any], what: str) -> None:
    try:
        OUTPUT_ITEM.validate_python(item)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "item"
        raise ProtocolError(f"{what}: {where}: {first['msg']}", code="invalid_item") from None
    spec = KINDS.get(item["type"]) if known_kind(item.get("type")) else None
    if spec is not None and spec.call_like and not _nonempty(item.get("call_id")):
        raise ProtocolError(f"{what}: a tool call needs a non-empty 'call_id'", code="invalid_item")


_FALLBACK_FIELDS = ("id", "call_id", "name", "arguments", "input")


def _same_done(slot: _Slot, item: dict[str, Any]) -> bool:
    """Is a repeated done the same item as the retained one (empty fields fall back)?"""
    retained = slot.done_item or {}
    if item == retained:
        return True
    candidate = dict(item)
    for key in _FALLBACK_FIELDS:
        if key in retained and not candidate.get(key):
            candidate[key] = retained[key]
    if "item_id" in candidate and "item_id" not in retained:
        candidate.pop("item_id")
    return candidate == retained
