"""Fixtures shared by the integration tests: a throwaway PostgreSQL cluster (one per session),
the stores a test runs on."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest

from tests.integration.postgres import cluster, fresh_database


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[str]:
    with cluster() as dsn:
        yield dsn


@pytest.fixture
def postgres_dsn(postgres_cluster: str) -> str:
    """A fresh, empty database on the session's cluster."""
    return fresh_database(postgres_cluster)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each store a test runs on: an SQLite file in a temporary directory, a fresh PostgreSQL
    database."""
    if request.param == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/store.db"
    else:
        yield request.getfixturevalue("postgres_dsn")
