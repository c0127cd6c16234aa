"""The default job store: one SQLite file under ``IDG_DATA_DIR`` (``jobs.sqlite3``), in WAL mode.

Every transaction that writes takes SQLite's write lock first (``BEGIN IMMEDIATE``), so a claim or
an answer is all or nothing, and ``synchronous=FULL`` makes each commit durable before it returns:
a process killed at any point (``kill -9`` included) leaves the file as of its last commit.
Several processes on one machine may share the file (the claims' leases keep them apart); for
replicas on several machines use :mod:`app.jobs.postgres`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.jobs.sql import Cursor, SqlStore, schema

FILE_NAME = "jobs.sqlite3"


class SqliteStore(SqlStore):
    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / FILE_NAME
        # autocommit mode: transactions are begun and ended here (BEGIN IMMEDIATE ... COMMIT)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect on a new file: freed pages can go back
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        with self._lock, self.transaction() as cur:
            for statement in schema("BLOB", "REAL", "INTEGER"):
                cur.execute(statement)

    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        else:
            cur.execute("COMMIT")
        finally:
            cur.close()

    def sweep(self, finished_before: float) -> int:
        """Delete the old jobs, then give the file's free pages back (answered images' bytes, deleted jobs)."""
        swept = super().sweep(finished_before)
        with self._lock:
            self._conn.executescript("PRAGMA incremental_vacuum;")  # sqlite3_exec steps it to the end (execute frees one page)
        return swept

    def close(self) -> None:
        with self._lock:
            self._conn.close()
