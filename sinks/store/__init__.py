"""Where finished Responses, conversations (and, later, logged events) go: one protocol, two
backends — SQLite embedded (the default: one process, no server) and PostgreSQL (shared by
replicas).

``open_store("sqlite:///path/to/file.db" | "postgresql://…" | "none")``.
"""

from __future__ import annotations

from respflow.sinks.store._protocol import (
    ANONYMOUS,
    Conversation,
    Page,
    Store,
    StoredResponse,
    StoreError,
    tenant_of,
    valid_id,
)


def store_for(url: str) -> Store | None:
    """The store a URL names (not opened yet): ``sqlite:///PATH`` (``sqlite://`` alone: in
    memory), ``postgresql://…``, or ``none`` (no store: None).

    Raises:
        ValueError: an unknown scheme.
    """
    if url in ("", "none"):
        return None
    if url.startswith("sqlite://"):
        from respflow.sinks.store._sqlite import SqliteStore

        path = url.removeprefix("sqlite://")
        path = path.removeprefix("/") if path.startswith("//") else path  # sqlite:////abs → /abs
        return SqliteStore(path or ":memory:")
    if url.startswith(("postgresql://", "postgres://")):
        from respflow.sinks.store._postgres import PostgresStore

        return PostgresStore(url)
    raise ValueError(f"a store URL is sqlite:///PATH, postgresql://… or none, not {url.split(':', 1)[0]!r}")


__all__ = [
    "ANONYMOUS",
    "Conversation",
    "Page",
    "Store",
    "StoreError",
    "StoredResponse",
    "store_for",
    "tenant_of",
    "valid_id",
]
