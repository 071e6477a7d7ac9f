"""The tests' PostgreSQL: the package's throwaway cluster (`respflow.flows._pgcluster`), a
fresh database per test.

Without the server binaries the tests that need them are skipped, saying why; CI has them and
runs those tests: with ``RESPFLOW_REQUIRE_POSTGRES=1`` (``.ci/run`` sets it) a missing binary
fails them instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator

import asyncpg
import pytest

from respflow.flows._pgcluster import ClusterUnavailable
from respflow.flows._pgcluster import cluster as _cluster


@contextlib.contextmanager
def cluster() -> Iterator[str]:
    """A running cluster (fsync off); yields the DSN of its ``postgres`` database."""
    try:
        with _cluster() as dsn:
            yield dsn
    except ClusterUnavailable as exc:
        if os.environ.get("RESPFLOW_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"RESPFLOW_REQUIRE_POSTGRES=1 but {exc}")
        pytest.skip(f"{exc}: the PostgreSQL store tests need them")


def fresh_database(dsn: str) -> str:
    """A new empty database on the cluster of ``dsn``; its DSN."""
    name = "t_" + uuid.uuid4().hex[:12]

    async def create() -> None:
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(f'CREATE DATABASE "{name}"')
        finally:
            await connection.close()

    asyncio.run(create())
    return dsn.rsplit("/", 1)[0] + "/" + name
