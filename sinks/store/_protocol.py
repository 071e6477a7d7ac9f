"""The store's protocol, its errors, its values, and what every backend shares.

A `Store` keeps, per tenant (a hash of the caller's credential — never the credential):

* **items** — every input and output item, stored once, keyed by its id;
* **responses** — the final Response (the snapshot ``GET`` returns), the ids of the turn's
  input items, and ``context``: the ordered ids of the whole conversation up to and including
  its output — what a continuation (``previous_response_id``) sends upstream, read in one
  query, with no walk up the chain and no copy of item bodies;
* **conversations** — metadata, and the ordered ids of their items (a position per item).

Reading what another tenant wrote answers exactly as reading what does not exist: ``None``.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

ID = re.compile(r"[A-Za-z0-9_\-]{1,128}")
"""What an id the store accepts looks like (checked before any query)."""

ANONYMOUS = "anonymous"


def tenant_of(authorization: str | None) -> str:
    """The tenant of a request: a SHA-256 of its ``Authorization`` header (one anonymous tenant
    without one). The store never holds the credential itself."""
    if not authorization:
        return ANONYMOUS
    return hashlib.sha256(authorization.strip().encode()).hexdigest()


def valid_id(value: object) -> bool:
    return isinstance(value, str) and ID.fullmatch(value) is not None


class StoreError(Exception):
    """The store failed (unreachable, a query failed): the caller must not report success."""


@dataclass
class StoredResponse:
    id: str
    body: dict[str, Any]
    """The final Response as the client got it."""
    input_ids: list[str]
    context: list[str]
    """Ordered ids of every item up to and including this response's output."""
    background: bool = False
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "completed"
    running: bool = False
    """A background response some replica is still producing (it has an owner)."""


@dataclass
class Conversation:
    id: str
    metadata: dict[str, Any]
    created_at: int

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


@dataclass
class Page:
    """One page of items in cursor order."""

    items: list[dict[str, Any]]
    has_more: bool


class Store(Protocol):
    """Where stored responses and conversations live (SQLite embedded, or PostgreSQL)."""

    backend: str
    """``sqlite`` or ``postgresql``: a label for logs and metrics."""
    where: str
    """Where the data is (a file path, or the server without credentials)."""

    async def open(self) -> None:
        """Connect, and create or migrate the schema (safe when replicas start at once)."""

    async def aclose(self) -> None: ...

    # -- responses ---------------------------------------------------------------------------

    async def save_response(
        self,
        tenant: str,
        response: StoredResponse,
        items: list[dict[str, Any]],
        *,
        conversation: str | None = None,
        conversation_items: list[str] | None = None,
        ttl: float | None = None,
    ) -> None:
        """Store a finished turn in one transaction: its new ``items`` (each once), the
        response, and — with ``conversation`` — the turn's items appended to it, in order,
        after whatever another turn appended meanwhile."""

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def delete_response(self, tenant: str, response_id: str) -> bool: ...

    async def items(self, tenant: str, ids: list[str]) -> list[dict[str, Any]]:
        """The items of ``ids``, in that order (missing ones left out)."""

    async def page(self, tenant: str, ids: list[str], *, after: str | None, limit: int, order: str) -> Page:
        """A cursor page over the items of ``ids`` (``order`` asc or desc, after an item id)."""

    # -- conversations -----------------------------------------------------------------------

    async def create_conversation(self, tenant: str, conversation: Conversation, items: list[dict[str, Any]], ttl: float | None = None) -> None: ...

    async def get_conversation(self, tenant: str, conversation_id: str) -> Conversation | None: ...

    async def update_conversation(self, tenant: str, conversation_id: str, metadata: dict[str, Any]) -> Conversation | None: ...

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool: ...

    async def conversation_ids(self, tenant: str, conversation_id: str) -> list[str] | None:
        """The ordered item ids of a conversation (None: no such conversation)."""

    async def add_conversation_items(self, tenant: str, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        """Append items (stored once) to a conversation; False if it does not exist."""

    async def delete_conversation_item(self, tenant: str, conversation_id: str, item_id: str) -> bool: ...

    # -- background runs ---------------------------------------------------------------------
    # A background response's row has an ``owner`` (the replica producing it) while it runs;
    # the owner renews its lease, appends the frames it relays (only while it still owns the
    # row), and clears the owner when it ends. A row whose lease ran out can be claimed.

    async def start_background(
        self, tenant: str, response: StoredResponse, items: list[dict[str, Any]], *, owner: str, lease_until: float, ttl: float | None = None
    ) -> None:
        """Keep a background response as it starts (its input ``items`` too), owned by ``owner``."""

    async def append_events(self, tenant: str, response_id: str, owner: str, first: int, last: int, frames: str) -> bool:
        """Log one relayed batch (frames ``first``..``last``) in one write; False: ``owner``
        does not own the response (any more), nothing written. Wakes other processes' readers."""

    async def append_many(self, owner: str, entries: Sequence[tuple[str, str, int, int, str]]) -> set[tuple[str, str, int]]:
        """Log the batches of several runs in one write: ``(tenant, id, first, last, frames)``
        each; the ``(tenant, id, first)`` written (a run ``owner`` does not own is not)."""
        ...

    async def events_after(self, tenant: str, response_id: str, after: int) -> list[tuple[int, int, str]]:
        """The logged batches holding frames after ``after``: ``(first, last, frames)`` in order."""

    async def update_body(self, tenant: str, response_id: str, owner: str, body: dict[str, Any]) -> bool:
        """Replace the Response snapshot (and status) of a response ``owner`` runs."""

    async def finish_background(self, tenant: str, response_id: str, owner: str, retention: float) -> None:
        """``owner`` is done with it: clear the owner; its log expires after ``retention`` s."""

    async def renew_leases(self, owner: str, until: float) -> list[str]:
        """Extend every lease ``owner`` holds; the ids it still owns."""

    async def cancel_requests(self, owner: str) -> list[str]:
        """The responses ``owner`` runs that someone asked to cancel."""

    async def request_cancel(self, tenant: str, response_id: str) -> StoredResponse | None:
        """Ask the owner of a running background response to cancel it; the response as it
        was (None: not found)."""

    async def abandoned(self, now: float) -> list[tuple[str, str]]:
        """``(tenant, id)`` of running responses whose lease ran out before ``now``."""

    async def claim(self, tenant: str, response_id: str, owner: str, now: float, lease_until: float) -> bool:
        """Take over a response whose lease ran out (atomically: one claimer wins)."""

    async def listen(self, on_event: Callable[[str], None], on_cancel: Callable[[str], None]) -> bool:
        """Be told when another process logged events of, or asked to cancel, a response
        (False: no such notifications here; readers poll)."""

    # -- housekeeping ------------------------------------------------------------------------

    async def purge_expired(self) -> int:
        """Delete rows past their retention; how many."""
