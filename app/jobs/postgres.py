"""The shared job store for several replicas (Ray Serve, or several servers): PostgreSQL, chosen by
``IDG_JOBS_DB_URL=postgresql://user:password@host/db``. Needs the ``postgres`` extra (psycopg 3 and
psycopg_pool).

Connections come from a pool (:class:`psycopg_pool.ConnectionPool`) that checks each one before
lending it and replaces a broken one, reconnecting with exponential backoff: a server restarted, or
unreachable for a while, costs the operations meanwhile (:class:`~app.jobs.store.StoreUnavailable`
after ``timeout_s`` each: the routes answer 503, the runner tries again), never a restart. A server that stalls
without failing (stopped by SIGSTOP, its host frozen: its kernel still acknowledges every packet, so no TCP timeout
ends the wait) is found by :class:`_Watch`: the operation waiting on it ends, its connection closed, after
``timeout_s`` and a probe's ``timeout_s`` (at least 2 s) at most.

Images are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED``: two replicas claiming at once take
different images, neither waits for the other, and an answer is stored only by the replica that
still holds the image's claim (:meth:`app.jobs.sql.SqlStore.finish`), so no image is answered twice.
Leases are compared with each replica's clock: keep the replicas' clocks in sync (NTP).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from app.jobs.sealing import Sealer
from app.jobs.sql import Cursor, SqlStore

log = logging.getLogger(__name__)

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


class StoreStalled(Exception):
    """PostgreSQL answered nothing to an operation within the store's timeout, nor a new connection within as long: the
    operation's connection was shut down (a passing failure: :class:`~app.jobs.store.StoreUnavailable`)."""


class _Watch:
    """Ends the operation that a stalled PostgreSQL holds. A server stopped by SIGSTOP, or on a frozen host, never
    answers, and its kernel acknowledges every packet, so neither libpq nor TCP ends the wait: the operation had held the
    store's connection, and every operation of this process behind it, until the server went on (measured: 25 s of
    503s "busy", ``idg_durable_job_store_up`` 1, no store error).

    A thread looks at the operation in flight: past ``limit_s`` it asks ``answers()`` (a new connection, given
    ``limit_s`` too) whether the server answers at all. It does: the server is busy (a large write, a lock another
    replica holds) and the operation goes on, looked at again ``limit_s`` later. It does not: the operation's socket is
    shut down, so its wait ends at once with an error (:attr:`ended`), the connection is dropped and a new one made
    for the next operation."""

    def __init__(self, answers: Callable[[], bool], limit_s: float) -> None:
        self._answers, self.limit_s = answers, limit_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        """Set by :meth:`close`."""
        self._op = 0
        """The operation in flight (0: none)."""
        self._due: float | None = None
        """When the operation in flight is looked at (``time.monotonic()``; None: not again)."""
        self._conn: object | None = None
        self._fd: int | None = None
        """A duplicate of the socket of the connection the operation uses: shut down through it (the connection's own
        number may be another socket's by then, once the connection is closed)."""
        self.ended = False
        """Whether the operation in flight had its connection shut down."""
        self._closed = False
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="idg-jobs-postgres-watch", daemon=True)
        self._thread.start()

    @contextmanager
    def operation(self) -> Iterator[None]:
        """One store operation (one at a time: the store's lock is held)."""
        with self._lock:  # the thread, idle, looks every limit_s: in time for this one's due, without a wake-up each
            self._seq += 1
            self._op, self._due, self.ended = self._seq, time.monotonic() + self.limit_s, False
        try:
            yield
        finally:
            with self._lock:
                self._op, self._due, self._conn = 0, None, None
                self._forget()

    def uses(self, conn: Any) -> None:
        """The operation in flight waits on ``conn`` (the pool's check of it, then its statements)."""
        with self._lock:
            if not self._op or self._conn is conn or conn.closed:
                return
            self._forget()
            self._conn, self._fd = conn, os.dup(conn.pgconn.socket)

    def _forget(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            with self._lock:
                op, due = self._op, self._due
            if (left := self.limit_s if due is None else due - time.monotonic()) > 0:
                self._wake.wait(left)  # set by close() only
                continue
            try:
                answered = self._answers()
            except Exception:  # noqa: BLE001 - the watch goes on; the operation with it
                log.exception("probing the job store (PostgreSQL) failed")
                answered = True
            with self._lock:
                if op == self._op:
                    self._looked_at(answered)

    def _looked_at(self, answered: bool) -> None:
        """The operation in flight is past its time and the server answered a new connection or not (the lock held)."""
        if answered or self._fd is None:  # busy; or waiting for the pool, which has a timeout of its own
            self._due = time.monotonic() + self.limit_s
            return
        sock = socket.socket(fileno=self._fd)
        try:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()
        self._due, self.ended = time.monotonic() + self.limit_s, True  # looked at again: the pool may lend another such one
        log.warning("the job store (PostgreSQL) answered nothing for %g s, nor a new connection: its connection is closed",
                    self.limit_s)


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
        self._errors = (psycopg.OperationalError, psycopg.InterfaceError, StoreStalled)  # PoolTimeout is an OperationalError
        self._url = url
        self._connect: dict[str, Any] = {"autocommit": True, "connect_timeout": max(2, math.ceil(timeout_s)), **_dead_peer(timeout_s)}
        self._pool = ConnectionPool(url, min_size=1, max_size=POOL_SIZE, open=False, name="idg-jobs", timeout=timeout_s,
                                    kwargs=self._connect, check=self._check, reconnect_timeout=RECONNECT_S)
        self._watch = _Watch(self._answers, timeout_s)
        try:
            self._pool.open(wait=True, timeout=max(timeout_s, 10.0))  # the server must answer at start-up
            with self._tx() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))  # replicas starting together create the tables once
                self.create_tables(cur, ("BYTEA", "DOUBLE PRECISION", "BIGINT"))
        except BaseException:
            self.close()
            raise

    @contextmanager
    def transaction(self, write: bool = True, timeout_s: float | None = None) -> Iterator[Cursor]:
        """A cursor in a transaction on one of the pool's connections, watched (:class:`_Watch`): an operation PostgreSQL
        stops answering ends as :class:`StoreStalled`."""
        with self._watch.operation():
            try:
                with self._pool.connection(timeout=timeout_s) as conn:
                    self._watch.uses(conn)
                    with conn.transaction(), conn.cursor() as cur:
                        yield _Cursor(cur)
            except self._errors as err:
                if not self._watch.ended:
                    raise
                raise StoreStalled(f"PostgreSQL answered nothing for {self._watch.limit_s:g} s, nor a new connection: "
                                   "its connection was closed") from err

    def _check(self, conn: Any) -> None:
        """The pool's check of a connection before lending it (a statement: watched, as a stalled server never answers it)."""
        self._watch.uses(conn)
        type(self._pool).check_connection(conn)

    def _answers(self) -> bool:
        """Whether the server answers a new connection within the store's timeout (refusing it is an answer: too many
        clients, starting up)."""
        import psycopg

        try:
            psycopg.connect(self._url, **self._connect).close()
        except psycopg.Error as err:
            return err.sqlstate is not None
        return True

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
            self._watch.close()
            self._pool.close()
