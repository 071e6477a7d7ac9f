"""Fixtures shared by the integration tests: a throwaway PostgreSQL cluster (one per session)."""

from __future__ import annotations

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
