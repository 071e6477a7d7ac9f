"""A request's state: what it continues (``previous_response_id`` or ``conversation``), and the
turn the gateway keeps once it is done.

`State.resolve` runs before the first round: it checks the state fields (both at once: 400;
a malformed id: 400; one that is not the caller's, or does not exist: 404 — the same answer),
reads the history in one query per kind (a response's ``context`` ids, or a conversation's
items), bounds it (items and bytes: 400), and gives the upstream input: the history, then the
turn's own input. ``previous_response_id`` and ``conversation`` never go upstream.

`State.persist` runs after the last round and before the terminal event is sent: the turn's
input items (given ids where they had none) and output items are stored once, the Response is
stored with its context, and a conversation gets the turn appended in order. If it fails, the
caller reports an error instead of a ``completed`` that could not be retrieved.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from respflow.operators import RequestError, RespflowError
from respflow.sinks.store import Store, StoredResponse, StoreError, valid_id


class StateError(RespflowError):
    """The store failed while serving a request (HTTP 503)."""

    code = "store_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, stage="store")
        self.status = 503


def not_found(kind: str, value: str, param: str) -> RequestError:
    """The answer for an id that does not exist — or is not the caller's (the same answer)."""
    return RequestError(f"{kind} with id {value!r} not found", status=404, param=param, code="not_found")


def new_item_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


_PREFIX = {"message": "msg_", "function_call_output": "fco_", "custom_tool_call_output": "ctco_", "reasoning": "rs_"}


def stored_item(item: Any) -> dict[str, Any]:
    """An input item as it is stored and listed: a message's string content as ``input_text``
    parts, an id and a status where the item had none."""
    if not isinstance(item, dict):
        raise RequestError("each input item must be an object", param="input")
    out = dict(item)
    kind = out.get("type")
    if kind is None and "role" in out:
        kind = out["type"] = "message"
    if kind == "message":
        content = out.get("content")
        role = out.get("role")
        if isinstance(content, str):
            part = "output_text" if role == "assistant" else "input_text"
            out["content"] = [{"type": part, "text": content, **({"annotations": []} if part == "output_text" else {})}]
        out.setdefault("status", "completed")
    elif kind in ("function_call_output", "custom_tool_call_output", "function_call", "custom_tool_call"):
        out.setdefault("status", "completed")
    if not isinstance(out.get("id"), str) or not out["id"]:
        out["id"] = new_item_id(_PREFIX.get(str(kind), "item_"))
    return out


@dataclass
class Resolved:
    """What a request continues."""

    history: list[dict[str, Any]] = field(default_factory=list)
    context: list[str] = field(default_factory=list)
    previous_response_id: str | None = None
    conversation: str | None = None
    store: bool = True
    background: bool = False


class State:
    """The gateway's state keeping (None store: nothing is kept)."""

    def __init__(
        self,
        store: Store | None,
        *,
        ttl: float | None = None,
        max_history_items: int = 10_000,
        max_history_bytes: int = 32 << 20,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.max_history_items = max_history_items
        self.max_history_bytes = max_history_bytes

    async def resolve(self, body: Mapping[str, Any], tenant: str) -> Resolved:
        """The state a request continues (see the module docstring).

        Raises:
            RequestError: 400 (both fields, a malformed id, no store, a history too large),
                404 (not found, or not the caller's).
            StateError: the store failed.
        """
        want = body.get("store", True)
        if not isinstance(want, bool):
            raise RequestError("'store' must be a boolean", param="store")
        background = body.get("background", False)
        if background is None:
            background = False
        if not isinstance(background, bool):
            raise RequestError("'background' must be a boolean", param="background")
        if background and not want:
            raise RequestError("a background response is stored: 'background': true needs 'store' true", param="background")
        if background and self.store is None:
            raise RequestError(
                "this gateway keeps no state (it runs with --store none): background responses are not available",
                param="background",
            )
        previous = body.get("previous_response_id")
        conversation = body.get("conversation")
        if isinstance(conversation, dict):
            conversation = conversation.get("id")
        elif conversation is not None and not isinstance(conversation, str):
            raise RequestError("'conversation' must be an id or an object with an 'id'", param="conversation")
        if previous is not None and conversation is not None:
            raise RequestError(
                "'previous_response_id' and 'conversation' cannot both be given: a turn continues one or the other",
                param="previous_response_id",
            )
        resolved = Resolved(store=want and self.store is not None, background=background)
        if previous is None and conversation is None:
            return resolved
        if self.store is None:
            raise RequestError(
                "this gateway keeps no state (it runs with --store none): previous_response_id and conversation are "
                "not available",
                param="previous_response_id" if previous is not None else "conversation",
            )
        try:
            if previous is not None:
                if not valid_id(previous):
                    raise RequestError("'previous_response_id' is not a valid response id", param="previous_response_id")
                parent = await self.store.get_response(tenant, previous)
                if parent is None:
                    raise not_found("Previous response", previous, "previous_response_id")
                resolved.previous_response_id = previous
                resolved.context = list(parent.context)
            else:
                assert isinstance(conversation, str)
                if not valid_id(conversation):
                    raise RequestError("'conversation' is not a valid conversation id", param="conversation")
                ids = await self.store.conversation_ids(tenant, conversation)
                if ids is None:
                    raise not_found("Conversation", conversation, "conversation")
                resolved.conversation = conversation
                resolved.context = ids
            if len(resolved.context) > self.max_history_items:
                raise RequestError(
                    f"the conversation so far has {len(resolved.context)} items, over this gateway's limit of "
                    f"{self.max_history_items}",
                    param="previous_response_id" if previous is not None else "conversation",
                    code="history_too_large",
                )
            resolved.history = await self.store.items(tenant, resolved.context)
        except StoreError as exc:
            raise StateError(f"the store could not be read: {exc}") from None
        size = sum(len(orjson.dumps(i)) for i in resolved.history)
        if size > self.max_history_bytes:
            raise RequestError(
                f"the conversation so far is {size} bytes, over this gateway's limit of {self.max_history_bytes}",
                param="previous_response_id" if previous is not None else "conversation",
                code="history_too_large",
            )
        return resolved

    async def persist(
        self,
        tenant: str,
        resolved: Resolved,
        response: dict[str, Any],
        turn_input: list[dict[str, Any]],
        *,
        background: bool = False,
    ) -> None:
        """Keep the finished turn (nothing when the request said ``store: false``).

        Raises:
            StateError: the store failed (the caller must not report the turn as completed).
        """
        if not resolved.store or self.store is None:
            return
        output = [i for i in response.get("output") or [] if isinstance(i, dict) and isinstance(i.get("id"), str)]
        input_ids = [str(i["id"]) for i in turn_input]
        output_ids = [str(i["id"]) for i in output]
        record = StoredResponse(
            id=str(response["id"]),
            body=response,
            input_ids=input_ids,
            context=resolved.context + input_ids + output_ids,
            background=background or resolved.background,
            created_at=int(response.get("created_at") or time.time()),
        )
        try:
            await self.store.save_response(
                tenant,
                record,
                turn_input + output,
                conversation=resolved.conversation,
                conversation_items=input_ids + output_ids,
                ttl=self.ttl,
            )
        except StoreError as exc:
            raise StateError(f"the response could not be stored: {exc}") from None
