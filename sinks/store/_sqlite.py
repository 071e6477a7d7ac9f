"""The embedded store: SQLite through aiosqlite (one connection, its own thread; WAL).

For one process: every operation runs on one connection, one transaction at a time (an asyncio
lock), so a conversation's appends are serialized. ``respflow serve`` uses it by default, in
a file it names at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiosqlite

from respflow.sinks.store._protocol import StoreError
from respflow.sinks.store._sql import Connection, SqlStore


class _Conn:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def execute(self, sql: str, *args: Any) -> None:
        await self._db.execute(sql, args)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._db.executemany(sql, rows)

    async def fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return list(await self._db.execute_fetchall(sql, args))  # one trip to the thread


class SqliteStore(SqlStore):
    """The store in one SQLite file."""

    backend = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        self.where = os.path.abspath(path) if path != ":memory:" else path
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(self.where) or ".", exist_ok=True)
        try:
            self._db = await aiosqlite.connect(self.path, isolation_level=None)
            await self._db.execute("PRAGMA journal_mode=WAL")
            await self._db.execute("PRAGMA synchronous=NORMAL")
            await self._db.execute("PRAGMA busy_timeout=5000")
        except Exception as exc:
            raise StoreError(f"could not open the SQLite store at {self.where}: {type(exc).__name__}: {exc}") from None
        await self.migrate()

    async def aclose(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[Connection]:
        db = self._db
        if db is None:
            raise StoreError("the store is not open")
        async with self._lock:  # never between the statements of a write
            try:
                yield _Conn(db)
            except (sqlite3.Error, OSError) as exc:
                raise StoreError(f"the SQLite store failed: {type(exc).__name__}: {exc}") from None

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        db = self._db
        if db is None:
            raise StoreError("the store is not open")
        async with self._lock:
            try:
                await db.execute("BEGIN IMMEDIATE")
            except Exception as exc:
                raise StoreError(f"the SQLite store failed: {type(exc).__name__}: {exc}") from None
            try:
                yield _Conn(db)
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await db.execute("ROLLBACK")
                if isinstance(exc, (sqlite3.Error, OSError)):
                    raise StoreError(f"the SQLite store failed: {type(exc).__name__}: {exc}") from None
                raise
            try:
                await db.execute("COMMIT")
            except Exception as exc:
                raise StoreError(f"the SQLite store failed to commit: {type(exc).__name__}: {exc}") from None
