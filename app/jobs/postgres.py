"""The shared job store for several replicas (Ray Serve, or several servers): PostgreSQL, chosen by
``IDG_JOBS_DB_URL=postgresql://user:password@host/db``. Needs the ``postgres`` extra (psycopg 3 and
psycopg_pool).

Connections come from a pool (:class:`psycopg_pool.ConnectionPool`) that checks each one before
lending it and replaces a broken one, reconnecting with exponential backoff: a server restarted, or
unreachable for a while, costs the operations meanwhile (:class:`~app.jobs.store.StoreUnavailable`
after ``timeout_s`` each: the routes answer 503, the runner tries again), never a restart.

Images are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED``: two replicas claiming at once take
different images, neither waits for the other, and an answer is stored only by the replica that
still holds the image's claim (:meth:`app.jobs.sql.SqlStore.finish`), so no image is answered twice.
Leases are compared with each replica's clock: keep the replicas' clocks in sync (NTP).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from app.jobs.sealing import Sealer
from app.jobs.sql import Cursor, SqlStore

SCHEMA_LOCK = 0x1D6_0B5  # pg_advisory_xact_lock keys: creating the tables, creating a job
CREATE_LOCK = 0x1D6_0B6
POOL_SIZE = 4
"""Most connections per process (the store serves one operation at a time; the rest are spares being re-made)."""
RECONNECT_S = 10.0
"""The pool's own reconnect attempts (after 1, 2, 4, ... s) give up after this; the next operation starts them over."""


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


def _dead_peer(timeout_s: float) -> dict[str, int]:
    """libpq's TCP settings that end a connection to a server gone silent (a network partition) within about
    ``timeout_s`` plus a few seconds: a statement waiting on it had held the store's connection, and every operation of
    this process behind it, for as long as the kernel's defaults (hours) allowed."""
    idle = max(1, round(timeout_s))
    return {"keepalives": 1, "keepalives_idle": idle, "keepalives_interval": 1, "keepalives_count": 3,
            "tcp_user_timeout": 1000 * (idle + 3)}


class PostgresStore(SqlStore):
    skip_locked = " FOR UPDATE OF images SKIP LOCKED"
    lock_row = " FOR UPDATE"
    skip_locked_row = " FOR UPDATE SKIP LOCKED"

    def __init__(self, url: str, timeout_s: float = 5.0, sealer: Sealer | None = None) -> None:
        """``sealer``: seals the callback URLs' secrets, its key shared by every replica (:func:`app.jobs.sealing.load_key`);
        default: a key of this process's lifetime (tools and tests)."""
        super().__init__(timeout_s, sealer)
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as err:  # the optional extra
            raise RuntimeError("IDG_JOBS_DB_URL names PostgreSQL, which needs psycopg and psycopg_pool: "
                               ".venv/bin/pip install -e '.[postgres]' torch==2.13.0") from err
        self._errors = (psycopg.OperationalError, psycopg.InterfaceError)  # PoolTimeout is an OperationalError
        self._pool = ConnectionPool(url, min_size=1, max_size=POOL_SIZE, open=False, name="idg-jobs", timeout=timeout_s,
                                    kwargs={"autocommit": True, "connect_timeout": max(2, round(timeout_s)), **_dead_peer(timeout_s)},
                                    check=ConnectionPool.check_connection, reconnect_timeout=RECONNECT_S)
        self._pool.open(wait=True, timeout=max(timeout_s, 10.0))  # the server must answer at start-up
        with self._tx() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))  # replicas starting together create the tables once
            self.create_tables(cur, ("BYTEA", "DOUBLE PRECISION", "BIGINT"))

    @contextmanager
    def transaction(self, write: bool = True, timeout_s: float | None = None) -> Iterator[Cursor]:
        with self._pool.connection(timeout=timeout_s) as conn, conn.transaction(), conn.cursor() as cur:
            yield _Cursor(cur)

    def columns(self, cur: Cursor, table: str) -> set[str]:
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? AND table_schema = current_schema()",
                    (table,))
        return {row[0] for row in cur.fetchall()}

    def names(self, cur: Cursor) -> set[str]:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                    "UNION SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
        return {row[0] for row in cur.fetchall()}

    def transient(self, err: BaseException) -> bool:
        return isinstance(err, self._errors)

    def lock_jobs(self, cur: Cursor) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(?)", (CREATE_LOCK,))

    def close(self) -> None:
        with self._lock:
            self._pool.close()
