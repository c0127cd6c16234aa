"""The shared job store for several replicas (Ray Serve, or several servers): PostgreSQL, chosen by
``IDG_JOBS_DB_URL=postgresql://user:password@host/db``. Needs the ``postgres`` extra (psycopg 3).

Images are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED``: two replicas claiming at once take
different images, neither waits for the other, and an answer is stored only by the replica that
still holds the image's claim (:meth:`app.jobs.sql.SqlStore.finish`), so no image is answered twice.
Leases are compared with each replica's clock: keep the replicas' clocks in sync (NTP).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from app.jobs.sql import Cursor, SqlStore, schema

SCHEMA_LOCK = 0x1D6_0B5  # pg_advisory_xact_lock keys: creating the tables, creating a job
CREATE_LOCK = 0x1D6_0B6


class _Cursor:
    """A psycopg cursor that takes the store's ``?`` placeholders."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cur.execute(sql.replace("?", "%s"), params)

    def executemany(self, sql: str, params: Any) -> Any:
        return self._cur.executemany(sql.replace("?", "%s"), params)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._cur.fetchall())


class PostgresStore(SqlStore):
    skip_locked = " FOR UPDATE OF images SKIP LOCKED"
    lock_row = " FOR UPDATE"

    def __init__(self, url: str) -> None:
        super().__init__()
        try:
            import psycopg
        except ImportError as err:  # the optional extra
            raise RuntimeError("IDG_JOBS_DB_URL names PostgreSQL, which needs psycopg: pip install 'idg-service[postgres]'") from err
        self._conn = psycopg.connect(url, autocommit=True)
        with self._lock, self.transaction() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))  # replicas starting together create the tables once
            for statement in schema("BYTEA", "DOUBLE PRECISION", "BIGINT"):
                cur.execute(statement)

    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        with self._conn.transaction(), self._conn.cursor() as cur:
            yield _Cursor(cur)

    def lock_jobs(self, cur: Cursor) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(?)", (CREATE_LOCK,))

    def close(self) -> None:
        with self._lock:
            self._conn.close()
