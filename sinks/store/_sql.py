"""The store over SQL: one implementation, two drivers (aiosqlite, asyncpg).

Tables (every row keyed by tenant first):

| table | what |
|---|---|
| ``respflow_schema`` | the schema version (migrations run once, in order, under a lock) |
| ``items`` | every item once: ``(tenant, id) → body`` |
| ``responses`` | the final Response, the turn's input ids, its ``context`` (ordered ids) |
| ``conversations`` | metadata, and the next free item position |
| ``conversation_items`` | ``(tenant, conversation, position) → item id`` |
| ``events`` | a background response's client-bound frames, one row per logged batch: ``(tenant, response, first_seq) → last_seq, frames`` (kept until the response's ``log_expires_at``) |

A background response's row also holds its ``status``, the replica that runs it (``owner``,
cleared when it ends), the owner's ``lease_until`` and ``cancel_requested``.

Bodies and id lists are JSON text (orjson): both databases store and return them as they are,
and nothing queries inside them. SQL is written with ``?`` placeholders; the PostgreSQL driver
numbers them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson

from respflow.sinks.store._protocol import Conversation, Page, StoredResponse

MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            "CREATE TABLE IF NOT EXISTS items (tenant TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL, "
            "expires_at DOUBLE PRECISION, PRIMARY KEY (tenant, id))",
            "CREATE TABLE IF NOT EXISTS responses (tenant TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL, "
            "input_ids TEXT NOT NULL, context TEXT NOT NULL, background INTEGER NOT NULL DEFAULT 0, "
            "created_at BIGINT NOT NULL, expires_at DOUBLE PRECISION, PRIMARY KEY (tenant, id))",
            "CREATE TABLE IF NOT EXISTS conversations (tenant TEXT NOT NULL, id TEXT NOT NULL, metadata TEXT NOT NULL, "
            "created_at BIGINT NOT NULL, next_position BIGINT NOT NULL DEFAULT 0, expires_at DOUBLE PRECISION, "
            "PRIMARY KEY (tenant, id))",
            "CREATE TABLE IF NOT EXISTS conversation_items (tenant TEXT NOT NULL, conversation_id TEXT NOT NULL, "
            "position BIGINT NOT NULL, item_id TEXT NOT NULL, PRIMARY KEY (tenant, conversation_id, position))",
            "CREATE INDEX IF NOT EXISTS items_expiry ON items (expires_at)",
            "CREATE INDEX IF NOT EXISTS responses_expiry ON responses (expires_at)",
            "CREATE INDEX IF NOT EXISTS conversations_expiry ON conversations (expires_at)",
        ],
    ),
    (
        2,
        [
            "ALTER TABLE responses ADD COLUMN status TEXT NOT NULL DEFAULT 'completed'",
            "ALTER TABLE responses ADD COLUMN owner TEXT",
            "ALTER TABLE responses ADD COLUMN lease_until DOUBLE PRECISION",
            "ALTER TABLE responses ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0",
            "CREATE INDEX IF NOT EXISTS responses_owner ON responses (owner)",
            "CREATE TABLE IF NOT EXISTS events (tenant TEXT NOT NULL, response_id TEXT NOT NULL, first_seq BIGINT NOT NULL, "
            "last_seq BIGINT NOT NULL, frames TEXT NOT NULL, expires_at DOUBLE PRECISION, PRIMARY KEY (tenant, response_id, first_seq))",
            "CREATE INDEX IF NOT EXISTS events_expiry ON events (expires_at)",
        ],
    ),
    (
        3,
        [
            # a log expires with its response's log_expires_at (one column written when the run
            # ends), not per event row: no second index to maintain per logged batch
            "ALTER TABLE responses ADD COLUMN log_expires_at DOUBLE PRECISION",
            "CREATE INDEX IF NOT EXISTS responses_log_expiry ON responses (log_expires_at)",
            "DROP INDEX IF EXISTS events_expiry",
        ],
    ),
]
"""Schema migrations, in order: ``(version, statements)``. Add a version; never edit one."""

RUNNING = ("queued", "in_progress")
"""The statuses of a response that has not ended."""


class Connection(Protocol):
    """What the store needs of a database connection (inside a transaction or not)."""

    async def execute(self, sql: str, *args: Any) -> None: ...

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    async def fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]: ...


class SqlStore:
    """The `Store` protocol over a SQL database (see the module docstring)."""

    backend = "sql"
    where = ""

    # -- what a driver provides --------------------------------------------------------------

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        raise NotImplementedError

    def read(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        """A connection for reads that need no transaction (each statement sees committed
        rows): no BEGIN/COMMIT round trips. The drivers' own; by default a transaction."""
        return self.transaction()

    async def migrate(self) -> None:
        """Run the migrations this database has not had, each once."""
        async with self.transaction() as db:
            await self._migrate(db)

    async def _migrate(self, db: Connection) -> None:
        await db.execute("CREATE TABLE IF NOT EXISTS respflow_schema (version INTEGER NOT NULL)")
        rows = await db.fetch("SELECT max(version) FROM respflow_schema")
        current = rows[0][0] if rows and rows[0][0] is not None else 0
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            for statement in statements:
                await db.execute(statement)
            await db.execute("INSERT INTO respflow_schema (version) VALUES (?)", version)

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
        expires = time.time() + ttl if ttl else None
        async with self.transaction() as db:
            await self._put_items(db, tenant, items, expires)
            await db.execute(
                "INSERT INTO responses (tenant, id, body, input_ids, context, background, created_at, expires_at, status) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, id) DO UPDATE SET body = excluded.body, "
                "input_ids = excluded.input_ids, context = excluded.context, expires_at = excluded.expires_at, "
                "status = excluded.status",
                tenant,
                response.id,
                orjson.dumps(response.body).decode(),
                orjson.dumps(response.input_ids).decode(),
                orjson.dumps(response.context).decode(),
                1 if response.background else 0,
                response.created_at,
                expires,
                str(response.body.get("status") or "completed"),
            )
            if conversation is not None and conversation_items:
                await self._append(db, tenant, conversation, conversation_items)

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        async with self.read() as db:
            rows = await db.fetch(
                "SELECT body, input_ids, context, background, created_at, status, owner FROM responses WHERE tenant = ? AND id = ? "
                "AND (expires_at IS NULL OR expires_at > ?)",
                tenant,
                response_id,
                time.time(),
            )
        if not rows:
            return None
        body, input_ids, context, background, created_at, status, owner = rows[0]
        return StoredResponse(
            response_id,
            orjson.loads(body),
            orjson.loads(input_ids),
            orjson.loads(context),
            bool(background),
            int(created_at),
            status=str(status),
            running=owner is not None,
        )

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        async with self.transaction() as db:
            rows = await db.fetch("SELECT 1 FROM responses WHERE tenant = ? AND id = ?", tenant, response_id)
            if not rows:
                return False
            await db.execute("DELETE FROM responses WHERE tenant = ? AND id = ?", tenant, response_id)
            await db.execute("DELETE FROM events WHERE tenant = ? AND response_id = ?", tenant, response_id)
        return True

    async def items(self, tenant: str, ids: list[str]) -> list[dict[str, Any]]:
        if not ids:
            return []
        found: dict[str, dict[str, Any]] = {}
        async with self.read() as db:
            for start in range(0, len(ids), 500):  # bounded IN lists
                chunk = list(dict.fromkeys(ids[start : start + 500]))
                marks = ", ".join("?" for _ in chunk)
                for item_id, body in await db.fetch(f"SELECT id, body FROM items WHERE tenant = ? AND id IN ({marks})", tenant, *chunk):
                    found[item_id] = orjson.loads(body)
        return [found[i] for i in ids if i in found]

    async def page(self, tenant: str, ids: list[str], *, after: str | None, limit: int, order: str) -> Page:
        ordered = list(reversed(ids)) if order == "desc" else list(ids)
        if after is not None:
            ordered = ordered[ordered.index(after) + 1 :] if after in ordered else []
        chosen = ordered[:limit]
        return Page(await self.items(tenant, chosen), len(ordered) > limit)

    # -- conversations -----------------------------------------------------------------------

    async def create_conversation(self, tenant: str, conversation: Conversation, items: list[dict[str, Any]], ttl: float | None = None) -> None:
        expires = time.time() + ttl if ttl else None
        async with self.transaction() as db:
            await db.execute(
                "INSERT INTO conversations (tenant, id, metadata, created_at, next_position, expires_at) VALUES (?, ?, ?, ?, 0, ?)",
                tenant,
                conversation.id,
                orjson.dumps(conversation.metadata).decode(),
                conversation.created_at,
                expires,
            )
            if items:
                await self._put_items(db, tenant, items, expires)
                await self._append(db, tenant, conversation.id, [str(i["id"]) for i in items])

    async def get_conversation(self, tenant: str, conversation_id: str) -> Conversation | None:
        async with self.read() as db:
            rows = await db.fetch(
                "SELECT metadata, created_at FROM conversations WHERE tenant = ? AND id = ? AND (expires_at IS NULL OR expires_at > ?)",
                tenant,
                conversation_id,
                time.time(),
            )
        if not rows:
            return None
        return Conversation(conversation_id, orjson.loads(rows[0][0]), int(rows[0][1]))

    async def update_conversation(self, tenant: str, conversation_id: str, metadata: dict[str, Any]) -> Conversation | None:
        async with self.transaction() as db:
            rows = await db.fetch("SELECT created_at FROM conversations WHERE tenant = ? AND id = ?", tenant, conversation_id)
            if not rows:
                return None
            await db.execute(
                "UPDATE conversations SET metadata = ? WHERE tenant = ? AND id = ?", orjson.dumps(metadata).decode(), tenant, conversation_id
            )
        return Conversation(conversation_id, metadata, int(rows[0][0]))

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        async with self.transaction() as db:
            rows = await db.fetch("SELECT 1 FROM conversations WHERE tenant = ? AND id = ?", tenant, conversation_id)
            if not rows:
                return False
            await db.execute("DELETE FROM conversation_items WHERE tenant = ? AND conversation_id = ?", tenant, conversation_id)
            await db.execute("DELETE FROM conversations WHERE tenant = ? AND id = ?", tenant, conversation_id)
        return True

    async def conversation_ids(self, tenant: str, conversation_id: str) -> list[str] | None:
        async with self.transaction() as db:
            exists = await db.fetch(
                "SELECT 1 FROM conversations WHERE tenant = ? AND id = ? AND (expires_at IS NULL OR expires_at > ?)",
                tenant,
                conversation_id,
                time.time(),
            )
            if not exists:
                return None
            rows = await db.fetch(
                "SELECT item_id FROM conversation_items WHERE tenant = ? AND conversation_id = ? ORDER BY position",
                tenant,
                conversation_id,
            )
        return [str(r[0]) for r in rows]

    async def add_conversation_items(self, tenant: str, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        async with self.transaction() as db:
            exists = await db.fetch("SELECT expires_at FROM conversations WHERE tenant = ? AND id = ?", tenant, conversation_id)
            if not exists:
                return False
            await self._put_items(db, tenant, items, exists[0][0])
            await self._append(db, tenant, conversation_id, [str(i["id"]) for i in items])
        return True

    async def delete_conversation_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        async with self.transaction() as db:
            rows = await db.fetch(
                "SELECT position FROM conversation_items WHERE tenant = ? AND conversation_id = ? AND item_id = ?",
                tenant,
                conversation_id,
                item_id,
            )
            if not rows:
                return False
            await db.execute(
                "DELETE FROM conversation_items WHERE tenant = ? AND conversation_id = ? AND item_id = ?", tenant, conversation_id, item_id
            )
        return True

    # -- background runs ---------------------------------------------------------------------

    async def start_background(
        self, tenant: str, response: StoredResponse, items: list[dict[str, Any]], *, owner: str, lease_until: float, ttl: float | None = None
    ) -> None:
        expires = time.time() + ttl if ttl else None
        # no transaction (two statements, one trip each): items kept without their response
        # (a crash in between) are never read and expire with it
        async with self.read() as db:
            await self._put_items(db, tenant, items, expires)
            await db.execute(
                "INSERT INTO responses (tenant, id, body, input_ids, context, background, created_at, expires_at, status, owner, "
                "lease_until) VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?)",
                tenant,
                response.id,
                orjson.dumps(response.body).decode(),
                orjson.dumps(response.input_ids).decode(),
                orjson.dumps(response.context).decode(),
                response.created_at,
                expires,
                str(response.body.get("status") or "queued"),
                owner,
                lease_until,
            )

    _APPEND = (
        "INSERT INTO events (tenant, response_id, first_seq, last_seq, frames) SELECT ?, ?, CAST(? AS BIGINT), CAST(? AS BIGINT), ? "
        "WHERE EXISTS (SELECT 1 FROM responses WHERE tenant = ? AND id = ? AND owner = ?) RETURNING first_seq"
    )

    async def append_events(self, tenant: str, response_id: str, owner: str, first: int, last: int, frames: str) -> bool:
        async with self.read() as db:
            rows = await db.fetch(self._APPEND, tenant, response_id, first, last, frames, tenant, response_id, owner)
        return bool(rows)

    @staticmethod
    def _append_many_sql(count: int) -> str:
        values = ", ".join(["(?, ?, ?, ?, ?)"] * count)
        return (
            "INSERT INTO events (tenant, response_id, first_seq, last_seq, frames) "
            f"SELECT v.column1, v.column2, v.column3, v.column4, v.column5 FROM (VALUES {values}) AS v "
            "WHERE v.column1 IS NOT NULL AND EXISTS (SELECT 1 FROM responses r WHERE r.tenant = v.column1 "
            "AND r.id = v.column2 AND r.owner = ?) RETURNING tenant, response_id, first_seq"
        )

    async def append_many(self, owner: str, entries: Sequence[tuple[str, str, int, int, str]]) -> set[tuple[str, str, int]]:
        """One statement per write. Its row count is padded to a power of two (NULL rows, not
        written), so a handful of statement texts serve every write, each parsed once."""
        size = 1 << max(0, len(entries) - 1).bit_length()
        args: list[Any] = [value for entry in entries for value in entry]
        args += [None] * (5 * (size - len(entries)))
        async with self.read() as db:
            rows = await db.fetch(self._append_many_sql(size), *args, owner)
        return {(str(t), str(r), int(f)) for t, r, f in rows}

    async def events_after(self, tenant: str, response_id: str, after: int) -> list[tuple[int, int, str]]:
        async with self.read() as db:
            rows = await db.fetch(
                "SELECT first_seq, last_seq, frames FROM events WHERE tenant = ? AND response_id = ? AND last_seq > ? ORDER BY first_seq",
                tenant,
                response_id,
                after,
            )
        return [(int(a), int(b), str(f)) for a, b, f in rows]

    async def update_body(self, tenant: str, response_id: str, owner: str, body: dict[str, Any]) -> bool:
        async with self.read() as db:
            rows = await db.fetch(
                "UPDATE responses SET body = ?, status = ? WHERE tenant = ? AND id = ? AND owner = ? RETURNING id",
                orjson.dumps(body).decode(),
                str(body.get("status") or "failed"),
                tenant,
                response_id,
                owner,
            )
        return bool(rows)

    async def finish_background(self, tenant: str, response_id: str, owner: str, retention: float) -> None:
        async with self.read() as db:
            await db.execute(
                "UPDATE responses SET owner = NULL, lease_until = NULL, log_expires_at = ? WHERE tenant = ? AND id = ? AND owner = ?",
                time.time() + retention,
                tenant,
                response_id,
                owner,
            )

    async def renew_leases(self, owner: str, until: float) -> list[str]:
        async with self.read() as db:
            rows = await db.fetch("UPDATE responses SET lease_until = ? WHERE owner = ? RETURNING id", until, owner)
        return [str(r[0]) for r in rows]

    async def cancel_requests(self, owner: str) -> list[str]:
        async with self.read() as db:
            rows = await db.fetch("SELECT id FROM responses WHERE owner = ? AND cancel_requested = 1", owner)
        return [str(r[0]) for r in rows]

    async def request_cancel(self, tenant: str, response_id: str) -> StoredResponse | None:
        stored = await self.get_response(tenant, response_id)
        if stored is None or not stored.background or not stored.running:
            return stored
        async with self.read() as db:
            await db.execute(
                "UPDATE responses SET cancel_requested = 1 WHERE tenant = ? AND id = ? AND owner IS NOT NULL", tenant, response_id
            )
        await self._notify("respflow_cancel", response_id)
        return stored

    async def abandoned(self, now: float) -> list[tuple[str, str]]:
        async with self.read() as db:
            rows = await db.fetch("SELECT tenant, id FROM responses WHERE owner IS NOT NULL AND lease_until < ?", now)
        return [(str(t), str(i)) for t, i in rows]

    async def claim(self, tenant: str, response_id: str, owner: str, now: float, lease_until: float) -> bool:
        async with self.read() as db:
            rows = await db.fetch(
                "UPDATE responses SET owner = ?, lease_until = ? WHERE tenant = ? AND id = ? AND owner IS NOT NULL "
                "AND lease_until < ? RETURNING id",
                owner,
                lease_until,
                tenant,
                response_id,
                now,
            )
        return bool(rows)

    async def _notify(self, channel: str, payload: str) -> None:
        """Wake other processes' readers (PostgreSQL's NOTIFY; nothing on SQLite: one process)."""

    async def listen(self, on_event: Callable[[str], None], on_cancel: Callable[[str], None]) -> bool:
        """Call ``on_event(ids)`` (comma-separated response ids) when another process logged events,
        ``on_cancel(response_id)`` when one asked to cancel it. False: this store has no such
        notifications (readers poll)."""
        return False

    # -- housekeeping ------------------------------------------------------------------------

    async def purge_expired(self) -> int:
        now = time.time()
        removed = 0
        async with self.transaction() as db:
            # logs past their retention, and those of responses past their TTL
            logs = await db.fetch(
                "SELECT tenant, id FROM responses WHERE (log_expires_at IS NOT NULL AND log_expires_at < ?) "
                "OR (expires_at IS NOT NULL AND expires_at < ?)",
                now,
                now,
            )
            for tenant, response_id in logs:
                rows = await db.fetch("SELECT count(*) FROM events WHERE tenant = ? AND response_id = ?", tenant, response_id)
                removed += int(rows[0][0])
                await db.execute("DELETE FROM events WHERE tenant = ? AND response_id = ?", tenant, response_id)
            await db.execute("UPDATE responses SET log_expires_at = NULL WHERE log_expires_at IS NOT NULL AND log_expires_at < ?", now)
            for table in ("responses", "items", "conversations"):
                rows = await db.fetch(f"SELECT count(*) FROM {table} WHERE expires_at IS NOT NULL AND expires_at < ?", now)
                removed += int(rows[0][0])
                await db.execute(f"DELETE FROM {table} WHERE expires_at IS NOT NULL AND expires_at < ?", now)
            await db.execute(
                "DELETE FROM conversation_items WHERE NOT EXISTS (SELECT 1 FROM conversations c WHERE "
                "c.tenant = conversation_items.tenant AND c.id = conversation_items.conversation_id)"
            )
        return removed

    # -- shared steps ------------------------------------------------------------------------

    async def _put_items(self, db: Connection, tenant: str, items: list[dict[str, Any]], expires: float | None) -> None:
        if items:
            await db.executemany(
                "INSERT INTO items (tenant, id, body, expires_at) VALUES (?, ?, ?, ?) ON CONFLICT (tenant, id) DO NOTHING",
                [(tenant, str(i["id"]), orjson.dumps(i).decode(), expires) for i in items],
            )

    async def _append(self, db: Connection, tenant: str, conversation_id: str, ids: list[str]) -> None:
        """Append ``ids`` to a conversation at positions taken atomically (a concurrent turn
        gets the positions after these, or before: never the same, never interleaved)."""
        rows = await db.fetch(
            "UPDATE conversations SET next_position = next_position + ? WHERE tenant = ? AND id = ? RETURNING next_position",
            len(ids),
            tenant,
            conversation_id,
        )
        if not rows:
            return
        start = int(rows[0][0]) - len(ids)
        await db.executemany(
            "INSERT INTO conversation_items (tenant, conversation_id, position, item_id) VALUES (?, ?, ?, ?)",
            [(tenant, conversation_id, start + n, item_id) for n, item_id in enumerate(ids)],
        )
