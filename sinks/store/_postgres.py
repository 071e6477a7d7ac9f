"""The shared store: PostgreSQL through asyncpg, with a connection pool.

For more than one process or machine. The schema is created and migrated at start under a
PostgreSQL advisory lock, so replicas that start at once do it once. A conversation's appends
take their positions with one ``UPDATE … RETURNING`` (a row lock), so concurrent turns never
interleave.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg

from respflow.sinks.store._protocol import StoreError
from respflow.sinks.store._sql import Connection, SqlStore

_MIGRATION_LOCK = 0x72657370  # "resp": the advisory lock that serializes migrations
_MARK = re.compile(r"\?")


def numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL's ``$1, $2, …``."""
    count = 0

    def next_mark(_: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return f"${count}"

    return _MARK.sub(next_mark, sql)


class _Conn:
    def __init__(self, db: asyncpg.pool.PoolConnectionProxy[asyncpg.Record]) -> None:
        self._db = db

    async def execute(self, sql: str, *args: Any) -> None:
        await self._db.execute(numbered(sql), *args)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._db.executemany(numbered(sql), rows)

    async def fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return [tuple(row) for row in await self._db.fetch(numbered(sql), *args)]


async def _reset(connection: asyncpg.Connection[asyncpg.Record]) -> None:
    """What a connection needs when it goes back to the pool: no open transaction. (asyncpg's
    default also resets session settings, listeners and advisory locks — state this store never
    sets — at the cost of one round trip per query.)"""
    if connection.is_in_transaction():
        await connection.execute("ROLLBACK")


class PostgresStore(SqlStore):
    """The store in a PostgreSQL database (``postgresql://user:pass@host:port/db``)."""

    backend = "postgresql"

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.dsn = dsn
        self.where = re.sub(r"//[^@/]*@", "//", dsn)  # never log the credentials
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._min, self._max = min_size, max_size
        self._listener: asyncpg.Connection[asyncpg.Record] | None = None

    async def open(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(self.dsn, min_size=self._min, max_size=self._max, reset=_reset)
        except Exception as exc:
            raise StoreError(f"could not connect to the PostgreSQL store at {self.where}: {type(exc).__name__}") from None
        async with self.transaction() as db:
            await db.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
            await self._migrate(db)

    async def aclose(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
            self._listener = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> asyncpg.Pool[asyncpg.Record]:
        if self._pool is None:
            raise StoreError("the store is not open")
        return self._pool

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[Connection]:
        async with self._connection() as connection:
            yield _Conn(connection)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        async with self._connection() as connection, connection.transaction():
            yield _Conn(connection)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy[asyncpg.Record]]:
        """A pooled connection; its failures as `StoreError`."""
        try:
            connection = await self.pool.acquire()
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"the PostgreSQL store is unreachable: {type(exc).__name__}") from None
        try:
            yield connection
        except (asyncpg.PostgresError, OSError) as exc:
            raise StoreError(f"the PostgreSQL store failed: {type(exc).__name__}: {str(exc)[:200]}") from None
        finally:
            await self.pool.release(connection)

    # -- background runs: NOTIFY wakes readers and owners on other replicas --------------------

    _APPEND_NOTIFY = (
        "WITH logged AS (" + SqlStore._APPEND + ") SELECT pg_notify('respflow_events', CAST(? AS TEXT)) FROM logged"
    )

    async def append_events(self, tenant: str, response_id: str, owner: str, first: int, last: int, frames: str) -> bool:
        """One statement: the batch, and a notification for readers elsewhere (sent when the
        write commits; a notification that gets lost costs latency, never an event)."""
        async with self.read() as db:
            rows = await db.fetch(self._APPEND_NOTIFY, tenant, response_id, first, last, frames, tenant, response_id, owner, response_id)
        return bool(rows)

    _APPEND_MANY_NOTIFY = (
        "WITH logged AS (INSERT INTO events (tenant, response_id, first_seq, last_seq, frames) "
        "SELECT v.t, v.r, v.f, v.l, v.fr FROM unnest(CAST(? AS TEXT[]), CAST(? AS TEXT[]), CAST(? AS BIGINT[]), "
        "CAST(? AS BIGINT[]), CAST(? AS TEXT[])) AS v(t, r, f, l, fr) "
        "WHERE EXISTS (SELECT 1 FROM responses x WHERE x.tenant = v.t AND x.id = v.r AND x.owner = ?) "
        "RETURNING tenant, response_id, first_seq), "
        "told AS (SELECT pg_notify('respflow_events', coalesce(string_agg(DISTINCT response_id, ','), '')) FROM logged) "
        "SELECT tenant, response_id, first_seq FROM logged, told"
    )
    """One statement (one prepared plan) whatever the number of batches: the batches as arrays,
    and one notification (the ids, comma-separated) for readers elsewhere."""

    async def append_many(self, owner: str, entries: Sequence[tuple[str, str, int, int, str]]) -> set[tuple[str, str, int]]:
        columns = [list(column) for column in zip(*entries, strict=True)] if entries else [[], [], [], [], []]
        async with self.read() as db:
            rows = await db.fetch(self._APPEND_MANY_NOTIFY, *columns, owner)
        return {(str(t), str(r), int(f)) for t, r, f in rows}

    async def _notify(self, channel: str, payload: str) -> None:
        async with self.read() as db:
            await db.execute("SELECT pg_notify(CAST(? AS TEXT), CAST(? AS TEXT))", channel, payload)

    async def listen(self, on_event: Callable[[str], None], on_cancel: Callable[[str], None]) -> bool:
        """LISTEN on a connection of its own (outside the pool); call again after it was lost."""
        if self._listener is not None and not self._listener.is_closed():
            return True
        try:
            listener = await asyncpg.connect(self.dsn)
            await listener.add_listener("respflow_events", lambda _c, _p, _ch, payload: on_event(payload))
            await listener.add_listener("respflow_cancel", lambda _c, _p, _ch, payload: on_cancel(payload))
        except Exception as exc:
            raise StoreError(f"the PostgreSQL store cannot LISTEN: {type(exc).__name__}") from None
        self._listener = listener
        return True
