"""The default job store: one SQLite file under ``IDG_DATA_DIR`` (``jobs.sqlite3``), in WAL mode.

Every transaction that writes takes SQLite's write lock first (``BEGIN IMMEDIATE``), so a claim or
an answer is all or nothing, and ``synchronous=FULL`` makes each commit durable before it returns:
a process killed at any point (``kill -9`` included) leaves the file as of its last commit. A writer
waits up to ``busy_timeout_s`` for another's lock (SQLite retries meanwhile), then the operation fails
as :class:`~app.jobs.store.StoreUnavailable` (the route answers 503, the runner tries again later);
reads do not wait for a writer (WAL), so job status and results stay readable while it holds the lock.
Several processes on one machine may share the file (the claims' leases keep them apart); for
replicas on several machines use :mod:`app.jobs.postgres`.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.jobs.sql import Cursor, SqlStore

FILE_NAME = "jobs.sqlite3"
PASSING = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN,
           sqlite3.SQLITE_PROTOCOL}
"""Primary result codes of a file that is locked, or not writable for now (disk full or failing)."""


class SqliteStore(SqlStore):
    def __init__(self, data_dir: Path, busy_timeout_s: float = 5.0) -> None:
        super().__init__()
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / FILE_NAME
        # autocommit mode: transactions are begun and ended here (BEGIN IMMEDIATE ... COMMIT)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=busy_timeout_s)
        self._conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect on a new file: freed pages can go back
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        with self._lock, self.transaction() as cur:
            self.create_tables(cur, ("BLOB", "REAL", "INTEGER"))

    @contextmanager
    def transaction(self, write: bool = True) -> Iterator[Cursor]:
        cur = self._conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield cur
            except BaseException:
                with contextlib.suppress(sqlite3.Error):  # a failed COMMIT or statement may have ended it already
                    cur.execute("ROLLBACK")
                raise
            try:
                cur.execute("COMMIT")
            except sqlite3.Error:
                with contextlib.suppress(sqlite3.Error):
                    cur.execute("ROLLBACK")
                raise
        finally:
            cur.close()

    def columns(self, cur: Cursor, table: str) -> set[str]:
        cur.execute(f"PRAGMA table_info({table})")
        return {row[1] for row in cur.fetchall()}

    def transient(self, err: BaseException) -> bool:
        return isinstance(err, sqlite3.OperationalError) and (getattr(err, "sqlite_errorcode", 0) & 0xFF) in PASSING

    def sweep(self, finished_before: float) -> int:
        """Delete the old jobs, then give the file's free pages back (answered images' bytes, deleted jobs)."""
        swept = super().sweep(finished_before)
        with self._lock:
            try:  # sqlite3_exec steps it to the end (execute frees one page)
                self._conn.executescript("PRAGMA incremental_vacuum;")
            except sqlite3.OperationalError as err:  # locked by another process: the pages go back at the next sweep
                if not self.transient(err):
                    raise
        return swept

    def close(self) -> None:
        with self._lock:
            self._conn.close()
