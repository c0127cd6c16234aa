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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from app.jobs.sealing import Sealer, key_file
from app.jobs.sql import Cursor, SqlStore

FILE_NAME = "jobs.sqlite3"
WAL_LIMIT_BYTES = 64 * 1024 * 1024
VACUUM_PAGES = 2048
"""Free pages given back per turn at the store (8 MB at SQLite's 4 kB pages), the lock released between turns."""
VACUUM_S = 2.0
"""Most seconds one sweep gives pages back."""
PASSING = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN,
           sqlite3.SQLITE_PROTOCOL}
"""Primary result codes of a file that is locked, or not writable for now (disk full or failing)."""


class SqliteStore(SqlStore):
    def __init__(self, data_dir: Path, busy_timeout_s: float = 5.0, sealer: Sealer | None = None) -> None:
        """``sealer``: seals the callback URLs' secrets; default: the key of ``data_dir/jobs.key`` (made on first start)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(busy_timeout_s, sealer or Sealer(key_file(data_dir)))
        self.path = data_dir / FILE_NAME
        # autocommit mode: transactions are begun and ended here (BEGIN IMMEDIATE ... COMMIT)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=busy_timeout_s)
        self._conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect on a new file: freed pages can go back
        # a file made before incremental vacuum keeps its pages (VACUUM once by hand gives them back); its sweeps had spun
        # 2 s each on a vacuum that frees nothing
        self._incremental = int(self._conn.execute("PRAGMA auto_vacuum").fetchone()[0]) == 2
        self._conn.execute("PRAGMA journal_mode=WAL")
        # after a checkpoint the WAL file is cut back to this: a sweep that freed 1.7 GB had left a WAL file of 1.7 GB
        self._conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._read_conn: sqlite3.Connection | None = None
        with self._lock, self.transaction() as cur:
            self.create_tables(cur, ("BLOB", "REAL", "INTEGER"))
        # reads on a connection of their own: WAL lets them run beside a writer, which the shared one (and its lock, held
        # by a writer waiting for another process's lock) had not
        self._read_conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=busy_timeout_s)
        self._read_conn.execute("PRAGMA foreign_keys=ON")
        self._read_lock = threading.Lock()

    def lock_for(self, write: bool) -> threading.Lock:
        return self._lock if write else self._read_lock

    @contextmanager
    def transaction(self, write: bool = True, timeout_s: float | None = None) -> Iterator[Cursor]:
        conn = self._read_conn if not write and self._read_conn is not None else self._conn
        conn.execute(f"PRAGMA busy_timeout={round(1000 * (self.timeout_s if timeout_s is None else timeout_s))}")
        cur = conn.cursor()
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

    def names(self, cur: Cursor) -> set[str]:
        cur.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")
        return {row[0] for row in cur.fetchall()}

    def transient(self, err: BaseException) -> bool:
        return isinstance(err, sqlite3.OperationalError) and (getattr(err, "sqlite_errorcode", 0) & 0xFF) in PASSING

    def purge(self, stop: Callable[[], bool] = lambda: False) -> int:
        """Free the deleted jobs' rows, then give the file's free pages back (answered images' bytes, deleted jobs) a few
        at a time, for at most :data:`VACUUM_S`: one ``incremental_vacuum`` of 1.7 GB freed had held the store, and every
        route and the runner with it, for 10 minutes; what is left goes back at the next purge (every minute's sweep)."""
        purged = super().purge(stop)
        ends, left = time.monotonic() + VACUUM_S, -1
        while self._incremental and time.monotonic() < ends:
            before = left
            if not self._lock.acquire(timeout=self.timeout_s):
                break
            try:  # sqlite3_exec steps it to the end (execute frees one page)
                self._conn.executescript(f"PRAGMA incremental_vacuum({VACUUM_PAGES});")
                left = int(self._conn.execute("PRAGMA freelist_count").fetchone()[0])
            except sqlite3.OperationalError as err:  # locked by another process: the pages go back at the next sweep
                if not self.transient(err):
                    raise
                break
            finally:
                self._lock.release()
            if left == 0 or left == before or stop():  # all given back, nothing more moves, or the runner stops
                break
        return purged

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._conn.close()
            if self._read_conn is not None:
                self._read_conn.close()
