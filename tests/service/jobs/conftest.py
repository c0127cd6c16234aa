"""The job tests' stores: SQLite in a temporary directory, and PostgreSQL (a real server, started
once per session; slow, skipped where PostgreSQL or psycopg is absent)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.jobs.store import Store
from tests.service.jobs.postgres_server import postgres_server, reset


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


StoreFactory = Callable[[], Store]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Opens stores on one database (each call a new connection, as another process would)."""
    opened: list[Store] = []
    if request.param == "sqlite":
        from app.jobs.sqlite import SqliteStore

        def make() -> Store:
            opened.append(SqliteStore(tmp_path / "data"))
            return opened[-1]
    else:
        url = request.getfixturevalue("postgres_url")
        reset(url)
        from app.jobs.postgres import PostgresStore

        def make() -> Store:
            opened.append(PostgresStore(url))
            return opened[-1]

    yield make
    for store in opened:
        store.close()
