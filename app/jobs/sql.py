"""The job store in SQL, shared by SQLite and PostgreSQL (:class:`SqlStore`); the subclasses give
the connection, the transaction and the few words that differ.

Tables: ``jobs`` (one row per job: parameters, counts, stored bytes, its callback URL as shown and sealed, when it was
deleted) and ``images`` (one row per image: its bytes until answered, its state and claim, then its answer, kept once:
its summary and its body without what the summary holds, and its place ``seq`` in the job's results). ``seq`` comes
from the job row's counter, incremented in the transaction that stores the answer, so results are numbered 1, 2, ...
in the order they were stored, without gaps, and a client can resume reading them after any number.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from app.jobs.callbacks import redacted
from app.jobs.sealing import Sealer, Unsealable
from app.jobs.store import (
    DONE,
    FAILED,
    JOB_DONE,
    JOB_RUNNING,
    MAX_INT,
    OPERATION_DEADLINE,
    PENDING,
    QUEUED,
    RUNNING,
    Answer,
    Claimed,
    Finished,
    JobInfo,
    QuotaExceeded,
    Reachability,
    ResultRow,
    StoreBusy,
    StoreFull,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

Row = Sequence[Any]
JOB_COLUMNS = ("id, state, total, done, failed, created, started, finished, params, callback_url, bytes, callback_outcome, tenant, "
               "request_id, callback_sealed")


class Cursor(Protocol):
    """What the store uses of a DB-API cursor (sqlite3's and psycopg's)."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def executemany(self, sql: str, params: Any) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


def schema(blob: str, real: str, big: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS jobs (
            id TEXT PRIMARY KEY, state TEXT NOT NULL, total {big} NOT NULL, done {big} NOT NULL DEFAULT 0,
            failed {big} NOT NULL DEFAULT 0, created {real} NOT NULL, started {real}, finished {real}, params TEXT NOT NULL,
            callback_url TEXT, callback_due INTEGER NOT NULL DEFAULT 0, bytes {big} NOT NULL DEFAULT 0, callback_outcome TEXT,
            tenant TEXT, request_id TEXT, callback_sealed TEXT, deleted {real})""",
        f"""CREATE TABLE IF NOT EXISTS images (
            job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE, idx {big} NOT NULL, filename TEXT NOT NULL, data {blob},
            state TEXT NOT NULL, owner TEXT, lease_until {real}, attempts INTEGER NOT NULL DEFAULT 0, seq {big}, status INTEGER,
            summary TEXT, result TEXT, finished {real}, replica TEXT, tenant TEXT, PRIMARY KEY (job_id, idx))""",
        "CREATE INDEX IF NOT EXISTS jobs_open ON jobs (state)",
        "CREATE INDEX IF NOT EXISTS images_seq ON images (job_id, seq)",
        "CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (finished)",
    ]


ADDED_COLUMNS = {"jobs": {"callback_outcome": "TEXT", "tenant": "TEXT", "request_id": "TEXT", "callback_sealed": "TEXT",
                          "deleted": "{real}"},
                 "images": {"finished": "{real}", "replica": "TEXT", "tenant": "TEXT"}}
"""Columns newer than the first schema: added to a store made before them (``{real}``: the dialect's type)."""
FILLED_COLUMNS = {
    ("images", "tenant"): "UPDATE images SET tenant = COALESCE((SELECT jobs.tenant FROM jobs WHERE jobs.id = images.job_id), '')",
}
"""How an added column is filled in the rows that were there before it (the others keep NULL)."""
LATER_INDEXES = [
    # each tenant's pending images in the claim's order within the tenant (image index, then job): a claim reads the next
    # few of each tenant, whatever the number of open images and jobs
    f"CREATE INDEX IF NOT EXISTS images_tenant_pending ON images (tenant, idx, job_id) WHERE state = '{PENDING}'",
    # the images in flight, by runner: a claim reads them all, an upkeep its own (an image pending or answered is in
    # no index but the key and the tenant's pending one, so claiming and answering it move fewer index entries)
    f"CREATE INDEX IF NOT EXISTS images_running ON images (owner) WHERE state = '{RUNNING}'",
    "DROP INDEX IF EXISTS images_pending",  # the first pending image of each job, which the claim no longer reads
    "DROP INDEX IF EXISTS images_open",  # every image by state, which made a claim read every pending image
    # the jobs deleted but not yet purged (a few, for seconds): what claims, answers and the purge leave out or look for
    "CREATE INDEX IF NOT EXISTS jobs_deleted ON jobs (id) WHERE deleted IS NOT NULL",
]
"""Index statements on added columns, run once those are there."""


def _bounded(n: int) -> int:
    """``n`` within the integers SQLite and PostgreSQL bind (past them, the page is empty all the same)."""
    return max(0, min(int(n), MAX_INT))


def _values(rows: int, types: tuple[str, ...]) -> str:
    """``rows`` rows of ``?`` placeholders cast to ``types``, for a ``VALUES`` list (typed alike on SQLite and PostgreSQL)."""
    return ", ".join(["(" + ", ".join(f"CAST(? AS {t})" for t in types) + ")"] * rows)


ANSWER_TYPES = ("TEXT", "BIGINT", "TEXT", "BIGINT", "INTEGER", "TEXT", "TEXT")
"""The types of an answer's row in :meth:`SqlStore.finish_many`'s ``VALUES``: job, image, state, seq, status, summary,
result."""
PURGE_ROWS = 16
"""Images a purge deletes per transaction: 16 answers of about 230 kB (a photo's heatmap and overlay) are 4 MB, a few
tens of milliseconds of the store's write lock, so that requests and the runner take their turns between them."""
ANSWERS_A_STATEMENT = 500
"""Most answers (or jobs) one statement writes (7 bound values each, within SQLite's and PostgreSQL's limits)."""


SHARED = ("prediction", "target", "faithfulness")
"""What an answer's summary and its full body both hold: kept once, in the summary."""
SHARED_MARK = "+"
"""Begins a stored body kept without the summary's :data:`SHARED` fields (a JSON text never begins with it); a body
stored whole (one that disagrees with its summary, or one stored before) begins with ``{``."""


def _stored(answer: Answer) -> tuple[str, str | None]:
    """The answer's summary and body as the store keeps them (compact JSON), the body without what the summary holds."""
    summary = json.dumps(answer.summary, separators=(",", ":"))
    if answer.result is None:
        return summary, None
    shared = [k for k in SHARED if k in answer.summary]
    if shared and all(k in answer.result and answer.result[k] == answer.summary[k] for k in shared):
        rest = {k: v for k, v in answer.result.items() if k not in shared}
        return summary, SHARED_MARK + json.dumps(rest, separators=(",", ":"))
    return summary, json.dumps(answer.result, separators=(",", ":"))


def _whole(summary: str, result: str | None) -> str | None:
    """A stored body with the summary's :data:`SHARED` fields back in it (spliced as text: the body, with its PNGs,
    is not parsed)."""
    if result is None or not result.startswith(SHARED_MARK):
        return result
    held = json.loads(summary)
    head = ",".join(f"{json.dumps(k)}:{json.dumps(held[k], separators=(',', ':'))}" for k in SHARED if k in held)
    rest = result[len(SHARED_MARK):]
    return "{" + head + ("}" if rest == "{}" else "," + rest[1:])


OPEN = "(images.state = ? OR (images.state = ? AND images.lease_until < ? AND images.owner <> ?))"
"""An image a runner may claim: pending, or running under a lapsed lease of another runner (never its
own lapsed claims: those are still in its hands, an answer waiting for the store to come back)."""

IN_FLIGHT_SQL = f"""SELECT job_id, idx, tenant, lease_until, owner FROM images WHERE state = '{RUNNING}'"""
"""Every image some runner holds (read through ``images_running``: as many rows as images in flight, not open)."""

TENANTS_SQL = f"""WITH RECURSIVE t(tenant) AS (
  SELECT MIN(tenant) FROM images WHERE state = '{PENDING}'
  UNION ALL
  SELECT (SELECT MIN(images.tenant) FROM images WHERE images.state = '{PENDING}' AND images.tenant > t.tenant)
  FROM t WHERE t.tenant IS NOT NULL)
SELECT tenant FROM t WHERE tenant IS NOT NULL"""
"""The tenants with pending images: one step of ``images_tenant_pending`` per tenant (a skip scan), not one per image."""

LIVE = "job_id NOT IN (SELECT id FROM jobs WHERE deleted IS NOT NULL)"
"""An image of a job not deleted (the deleted ones, read by ``jobs_deleted``, are few: their rows are being purged)."""

NEXT_OF_TENANT_SQL = f"""SELECT * FROM (SELECT tenant, idx, job_id FROM images WHERE tenant = ? AND state = '{PENDING}'
AND (idx, job_id) > (?, ?) AND {LIVE} ORDER BY idx, job_id LIMIT ?) AS p{{n}}"""
"""A tenant's next pending images after an (image, job) in its own order (image index, then job), read by
``images_tenant_pending``."""
TENANTS_A_STATEMENT = 32
"""Tenants whose next images one statement reads (``UNION ALL`` of :data:`NEXT_OF_TENANT_SQL`)."""

CANDIDATES_SQL = """WITH c(job_id, idx, ord) AS (VALUES {values})
SELECT images.job_id, images.idx FROM images JOIN c ON images.job_id = c.job_id AND images.idx = c.idx
WHERE {open} AND images.{live} ORDER BY c.ord LIMIT ?"""
"""The first ``limit`` candidates still open, in the claim's order (PostgreSQL locks them as it returns them and skips
those another replica holds)."""

CLAIM_WINDOW = 2
"""Candidates a claim looks at per image it wants, beyond :data:`CLAIM_SPARE` (a window found taken by replicas claiming
at the same moment is followed by the next one, up to :data:`CLAIM_WINDOWS`)."""
CLAIM_SPARE = 16
CLAIM_WINDOWS = 8
CLAIM_MOST = 1000
"""Most images one claim takes (its candidates' bound values stay within SQLite's 32,766); a runner with more free
slots claims again."""


def claim_order(busy: dict[str, int], pending: dict[str, list[tuple[int, str]]],
                lapsed: list[tuple[str, int, str]]) -> Iterator[tuple[str, int]]:
    """The claim's order of the open images, fair across tenants (the keys that submitted the jobs; no key is one
    tenant): each tenant's open images take turns after the ``busy`` images it already has in flight, so a tenant with
    one job gets as many runner slots as one with many jobs, and a tenant's own jobs take turns by image (image 0 of
    each, then image 1 of each...): the order of (turn, image index, job).

    ``pending``: each tenant's next pending images, (image, job) in that order; ``lapsed``: (job, image, tenant) held
    under a lapsed lease, candidates too, each in its place in its tenant's order."""
    again: dict[str, list[tuple[int, str]]] = {}
    for job_id, idx, tenant in lapsed:
        again.setdefault(tenant, []).append((idx, job_id))
    streams = {tenant: heapq.merge(pending.get(tenant, []), sorted(again.get(tenant, [])))
               for tenant in pending.keys() | again.keys()}
    heads: list[tuple[int, int, str, str]] = []
    for tenant, stream in streams.items():
        first_of = next(stream, None)
        if first_of is not None:
            heapq.heappush(heads, (busy.get(tenant, 0) + 1, first_of[0], first_of[1], tenant))
    while heads:
        turn, idx, job_id, tenant = heapq.heappop(heads)
        yield job_id, idx
        following = next(streams[tenant], None)
        if following is not None:
            heapq.heappush(heads, (turn + 1, following[0], following[1], tenant))


class SqlStore:
    """:class:`app.jobs.store.Store` over one DB-API connection, used by one thread at a time."""

    skip_locked = ""
    """Appended to the claim's SELECT: PostgreSQL's ``FOR UPDATE OF images SKIP LOCKED``."""
    lock_row = ""
    """Appended to a SELECT of rows about to change: PostgreSQL's ``FOR UPDATE``."""
    skip_locked_row = ""
    """Appended to a SELECT of rows about to change, those another transaction holds left out: PostgreSQL's
    ``FOR UPDATE SKIP LOCKED``."""

    def __init__(self, timeout_s: float = 5.0, sealer: Sealer | None = None) -> None:
        self.sealer = sealer or Sealer.ephemeral()
        """Seals the secrets of the jobs' callback URLs (:mod:`app.jobs.sealing`)."""
        self._lock = threading.Lock()
        self.timeout_s = timeout_s
        """How long one operation may wait, for this process's turn at the store and then for the store itself
        (``IDG_JOBS_STORE_TIMEOUT_S``)."""
        self.reachability = Reachability()

    # -- dialect ---------------------------------------------------------------------------
    def transaction(self, write: bool = True, timeout_s: float | None = None) -> AbstractContextManager[Cursor]:
        """A cursor in a transaction (committed on leaving, rolled back on an error), waiting at most ``timeout_s``
        (None: :attr:`timeout_s`) for the store; ``write=False``: it only reads (SQLite then does not wait for
        another writer's lock)."""
        raise NotImplementedError

    def lock_for(self, write: bool) -> threading.Lock:
        """The lock of the connection a transaction uses (one connection serves one thread at a time)."""
        return self._lock

    def transient(self, err: BaseException) -> bool:
        """Whether ``err`` means the store is unreachable or busy for now (not a bug in a statement)."""
        return False

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Cursor]:
        """:meth:`transaction` under this store's lock; a passing failure becomes :class:`StoreUnavailable`
        and marks the store unreachable, a success marks it reachable."""
        deadline, lock = OPERATION_DEADLINE.get() or time.monotonic() + self.timeout_s, self.lock_for(write)
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):  # another operation holds the connection (a
            # store that hangs, a long write): every operation queued behind it had waited its turn, then its own timeout
            if not self.reachability.up:  # the operation ahead waits for the store itself, which is away
                raise StoreUnavailable(f"the job store is unreachable: {self.reachability.error}")
            raise StoreBusy(f"the job store is busy: this process's other operations held it for {self.timeout_s:g} s")
        try:
            with self.transaction(write, max(0.05, deadline - time.monotonic())) as cur:
                yield cur
        except Exception as err:
            if not self.transient(err):
                raise
            self.reachability.failed(err)
            raise StoreUnavailable(f"{type(err).__name__}: {str(err).strip()[:200]}") from err
        finally:
            lock.release()
        self.reachability.ok()

    def lock_jobs(self, cur: Cursor) -> None:
        """Serialise job creation (the byte bound is checked against every job's bytes)."""

    def columns(self, cur: Cursor, table: str) -> set[str]:
        """The names of ``table``'s columns."""
        raise NotImplementedError

    def names(self, cur: Cursor) -> set[str]:
        """The names of the store's tables and indexes."""
        raise NotImplementedError

    def create_tables(self, cur: Cursor, types: tuple[str, str, str]) -> None:
        """The tables and indexes (blob, real and big integer ``types``), and the columns added since a store was made.
        Only what is missing is created or dropped: ``CREATE INDEX IF NOT EXISTS`` locks its table all the same (in
        PostgreSQL, against writes), and a replica starting while others claim had deadlocked with them."""
        there = self.names(cur)

        def run(statement: str) -> None:
            name = re.search(r"IF (?:NOT )?EXISTS (\w+)", statement)
            wanted = statement.startswith("CREATE")
            if name is None or (name[1] in there) != wanted:
                cur.execute(statement)

        for statement in schema(*types):
            run(statement)
        blob, real, big = types
        for table, added in ADDED_COLUMNS.items():
            for column in sorted(added.keys() - self.columns(cur, table)):
                cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {added[column].format(blob=blob, real=real, big=big)}")
                if (table, column) in FILLED_COLUMNS:
                    cur.execute(FILLED_COLUMNS[table, column])
        for statement in LATER_INDEXES:
            run(statement)
        self._seal_clear_callbacks(cur)

    def _seal_clear_callbacks(self, cur: Cursor) -> None:
        """Seal the callback URLs a store made before sealing keeps in clear (their rows then hold the URL as shown, and
        the URL sealed); a URL with nothing secret stays as it is."""
        cur.execute("SELECT id, callback_url FROM jobs WHERE callback_url IS NOT NULL AND callback_sealed IS NULL")
        clear = [(job_id, url) for job_id, url in cur.fetchall() if redacted(url) != url]
        for job_id, url in clear:
            cur.execute("UPDATE jobs SET callback_url = ?, callback_sealed = ? WHERE id = ?",
                        (redacted(url), self.sealer.seal(url, job_id), job_id))
        if clear:
            log.info("sealed the callback URLs of %d job(s) the store had kept in clear", len(clear))

    def _info(self, row: Row) -> JobInfo:
        """A job's row as :class:`JobInfo`, its callback URL as shown and, opened, the one to call."""
        target, problem = row[9], None
        if row[14] is not None:
            try:
                target = self.sealer.open(row[14], row[0])
            except Unsealable as err:
                target, problem = None, f"its callback URL, sealed in the job store, could not be opened: {err}"
        return JobInfo(id=row[0], state=row[1], total=int(row[2]), done=int(row[3]), failed=int(row[4]), created=float(row[5]),
                       started=None if row[6] is None else float(row[6]), finished=None if row[7] is None else float(row[7]),
                       params=json.loads(row[8]), callback_url=row[9], bytes=int(row[10]), callback_outcome=row[11],
                       tenant=row[12], request_id=row[13], callback_target=target, callback_problem=problem)

    def blob(self, data: bytes) -> Any:
        return data

    # -- the store -------------------------------------------------------------------------
    def create_job(self, job_id: str, params: dict[str, Any], callback_url: str | None, images: list[tuple[str, bytes]],
                   max_bytes: int, tenant: str | None = None, request_id: str | None = None,
                   max_tenant_bytes: int | None = None) -> JobInfo:
        size = sum(len(data) for _, data in images)
        now = time.time()
        # the row keeps the URL as shown; its secrets (user, password, query values, fragment) only sealed
        shown = None if callback_url is None else redacted(callback_url)
        sealed = None if callback_url is None or shown == callback_url else self.sealer.seal(callback_url, job_id)
        with self._tx() as cur:
            self.lock_jobs(cur)  # both bounds are checked and the job stored under one lock: no two submissions pass together
            if tenant is not None and max_tenant_bytes is not None:
                cur.execute("SELECT COALESCE(SUM(bytes), 0) FROM jobs WHERE tenant = ? AND deleted IS NULL", (tenant,))
                held = int(cur.fetchone()[0])
                if held + size > max_tenant_bytes:
                    raise QuotaExceeded(f"the jobs of key {tenant!r} hold {held} bytes in the job store; this job's {size} more "
                                        f"would pass IDG_JOBS_MAX_BYTES_PER_KEY ({max_tenant_bytes}): fetch and delete its "
                                        "finished jobs, or wait for their retention to end")
            cur.execute("SELECT COALESCE(SUM(bytes), 0) FROM jobs WHERE deleted IS NULL")
            stored = int(cur.fetchone()[0])
            if stored + size > max_bytes:
                raise StoreFull(f"the job store holds {stored} bytes; this job's {size} more would pass IDG_JOBS_MAX_BYTES "
                                f"({max_bytes}): fetch and delete finished jobs, or wait for their retention to end")
            cur.execute("INSERT INTO jobs (id, state, total, created, params, callback_url, callback_sealed, bytes, tenant, "
                        "request_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (job_id, QUEUED, len(images), now, json.dumps(params), shown, sealed, size, tenant, request_id))
            cur.executemany("INSERT INTO images (job_id, idx, filename, data, state, tenant) VALUES (?, ?, ?, ?, ?, ?)",
                            [(job_id, i, name, self.blob(data), PENDING, tenant or "") for i, (name, data) in enumerate(images)])
        return JobInfo(job_id, QUEUED, len(images), 0, 0, now, None, None, params, shown, size, tenant=tenant,
                       request_id=request_id, callback_target=callback_url)

    def get_job(self, job_id: str) -> JobInfo | None:
        with self._tx(write=False) as cur:
            cur.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND deleted IS NULL", (job_id,))
            row = cur.fetchone()
        return None if row is None else self._info(row)

    def list_jobs(self, offset: int, limit: int, before: tuple[float, str] | None = None,
                  tenant: str | None = None) -> tuple[list[JobInfo], int]:
        offset, limit = _bounded(offset), _bounded(limit)
        mine, own = ("tenant = ? AND deleted IS NULL", [tenant]) if tenant is not None else ("deleted IS NULL", [])
        after, args = ("(created < ? OR (created = ? AND id > ?))", [before[0], before[0], before[1]]) if before else ("1 = 1", [])
        with self._tx(write=False) as cur:
            cur.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE {mine} AND {after} ORDER BY created DESC, id LIMIT ? OFFSET ?",
                        (*own, *args, limit, offset))
            rows = cur.fetchall()
            cur.execute(f"SELECT COUNT(*) FROM jobs WHERE {mine}", own)
            count = int(cur.fetchone()[0])
        return [self._info(r) for r in rows], count

    def delete_job(self, job_id: str) -> bool:
        """One row marked: the job's images and answers (272 MB had taken 8 s to delete in the request) are freed by
        :meth:`purge`."""
        with self._tx() as cur:
            cur.execute("UPDATE jobs SET deleted = ?, callback_due = 0 WHERE id = ? AND deleted IS NULL", (time.time(), job_id))
            return bool(cur.rowcount)

    def purge(self, stop: Callable[[], bool] = lambda: False) -> int:
        """Free the rows of the deleted jobs, :data:`PURGE_ROWS` images a transaction (other operations take their turns
        between them), then each job's row; the jobs freed. Rows another replica's purge holds are skipped (PostgreSQL):
        a pass that frees nothing ends it, and the next purge takes up what is left; ``stop()`` true (the runner stopping)
        ends it between two transactions."""
        purged = 0
        while not stop():
            freed = 0
            with self._tx(write=False) as cur:
                cur.execute("SELECT id FROM jobs WHERE deleted IS NOT NULL ORDER BY deleted, id LIMIT 32")
                jobs = [r[0] for r in cur.fetchall()]
            for job_id in jobs:
                while not stop():
                    with self._tx() as cur:
                        cur.execute(f"DELETE FROM images WHERE job_id = ? AND idx IN (SELECT idx FROM images WHERE job_id = ? "
                                    f"ORDER BY idx LIMIT ?{self.skip_locked_row})", (job_id, job_id, PURGE_ROWS))
                        gone = max(cur.rowcount, 0)
                        if not gone:  # none left but those another purge holds: the job's row goes once none is left
                            cur.execute("DELETE FROM jobs WHERE id = ? AND deleted IS NOT NULL "
                                        "AND NOT EXISTS (SELECT 1 FROM images WHERE job_id = ?)", (job_id, job_id))
                            gone = max(cur.rowcount, 0)
                            purged += gone
                    freed += gone
                    if not gone or gone < PURGE_ROWS:
                        break
            if not freed:
                return purged
        return purged
    def claim(self, owner: str, limit: int, lease_s: float) -> list[Claimed]:
        if limit <= 0:
            return []
        limit = min(limit, CLAIM_MOST)
        now = time.time()
        with self._tx() as cur:
            keys = self._choose(cur, owner, limit, now)
            if not keys:
                return []
            keyed = _values(len(keys), ("TEXT", "BIGINT"))
            cur.execute(f"WITH c(job_id, idx) AS (VALUES {keyed}) UPDATE images SET state = ?, owner = ?, lease_until = ?, "
                        "attempts = attempts + 1 FROM c WHERE images.job_id = c.job_id AND images.idx = c.idx "
                        "RETURNING images.job_id, images.idx, images.filename, images.data, images.attempts",
                        (*(v for key in keys for v in key), RUNNING, owner, now + lease_s))
            rows = {(r[0], int(r[1])): r for r in cur.fetchall()}
            jobs = sorted({j for j, _ in keys})
            some = ", ".join("?" * len(jobs))
            # a job's first claim marks it running; a claim never waits for a job's row (one another claim is marking is
            # skipped), so claims and answers being stored, which lock jobs in one order, never wait in a circle
            cur.execute(f"UPDATE jobs SET state = ?, started = COALESCE(started, ?) WHERE id IN "
                        f"(SELECT id FROM jobs WHERE state = ? AND id IN ({some}){self.skip_locked_row})",
                        (JOB_RUNNING, now, QUEUED, *jobs))
            cur.execute(f"SELECT id, params, request_id FROM jobs WHERE id IN ({some})", jobs)
            params = {r[0]: (json.loads(r[1]), r[2]) for r in cur.fetchall()}
            return [Claimed(j, i, rows[j, i][2], bytes(rows[j, i][3]), params[j][0], int(rows[j, i][4]), request_id=params[j][1])
                    for j, i in keys]

    def _choose(self, cur: Cursor, owner: str, limit: int, now: float) -> list[tuple[str, int]]:
        """The images this claim takes, in :func:`claim_order`: the images in flight and each tenant's next pending
        images are read (not every open image, nor every job), then the first candidates still open are taken (PostgreSQL
        locks them, skipping those another replica is claiming); while some are missing, each tenant's next images after
        those looked at are read and taken the same way, up to :data:`CLAIM_WINDOWS` times."""
        cur.execute(IN_FLIGHT_SQL)
        busy: dict[str, int] = {}
        lapsed: list[tuple[str, int, str]] = []
        for job_id, idx, tenant, lease_until, holder in cur.fetchall():
            if lease_until is not None and float(lease_until) < now and holder != owner:
                lapsed.append((job_id, int(idx), tenant or ""))
            else:
                busy[tenant or ""] = busy.get(tenant or "", 0) + 1
        cur.execute(TENANTS_SQL)
        tenants = [r[0] for r in cur.fetchall()]
        seen: dict[str, tuple[int, str]] = {}  # each tenant's last candidate looked at, (image, job)
        keys: list[tuple[str, int]] = []
        for _ in range(CLAIM_WINDOWS):
            size = CLAIM_WINDOW * (limit - len(keys)) + CLAIM_SPARE
            pending = self._next_pending(cur, tenants, size, seen)
            tenant_of = {(job_id, idx): tenant for tenant, rows in pending.items() for idx, job_id in rows}
            tenant_of |= {(job_id, idx): tenant for job_id, idx, tenant in lapsed}
            window = list(itertools.islice(claim_order(busy, pending, lapsed), size))
            if not window:
                break
            lapsed = []  # looked at once
            for job_id, idx in window:
                seen[tenant_of[job_id, idx]] = max(seen.get(tenant_of[job_id, idx], (-1, "")), (idx, job_id))
            cur.execute(CANDIDATES_SQL.format(values=_values(len(window), ("TEXT", "BIGINT", "INTEGER")), open=OPEN, live=LIVE)
                        + self.skip_locked,
                        (*(v for n, (j, i) in enumerate(window) for v in (j, i, n)), PENDING, RUNNING, now, owner, limit - len(keys)))
            taken = [(r[0], int(r[1])) for r in cur.fetchall()]
            for key in taken:
                busy[tenant_of[key]] = busy.get(tenant_of[key], 0) + 1
            keys += taken
            if len(keys) >= limit:
                break
        return keys

    def _next_pending(self, cur: Cursor, tenants: list[str], each: int,
                      after: dict[str, tuple[int, str]]) -> dict[str, list[tuple[int, str]]]:
        """Each tenant's next ``each`` pending images after ``after``'s (image, job) (none: from its first), in the
        tenant's order."""
        pending: dict[str, list[tuple[int, str]]] = {}
        for start in range(0, len(tenants), TENANTS_A_STATEMENT):
            some = tenants[start:start + TENANTS_A_STATEMENT]
            cur.execute(" UNION ALL ".join(NEXT_OF_TENANT_SQL.format(n=n) for n in range(len(some))),
                        [v for tenant in some for v in (tenant, *after.get(tenant, (-1, "")), each)])
            for tenant, idx, job_id in cur.fetchall():
                pending.setdefault(tenant, []).append((int(idx), job_id))
        return {tenant: sorted(rows) for tenant, rows in pending.items()}

    def renew(self, owner: str, lease_s: float) -> None:
        with self._tx() as cur:
            cur.execute(f"UPDATE images SET lease_until = ? WHERE owner = ? AND state = '{RUNNING}'", (time.time() + lease_s, owner))

    def release(self, owner: str, job_id: str, index: int, refund: bool) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE images SET state = ?, owner = NULL, lease_until = NULL, attempts = attempts - ? "
                        "WHERE job_id = ? AND idx = ? AND owner = ? AND state = ?", (PENDING, int(refund), job_id, index, owner, RUNNING))

    def release_owners(self, owners: list[str]) -> int:
        released = 0
        with self._tx() as cur:
            for owner in owners:
                cur.execute(f"UPDATE images SET state = ?, owner = NULL, lease_until = NULL WHERE owner = ? AND state = '{RUNNING}'",
                            (PENDING, owner))
                released += max(cur.rowcount, 0)
        return released

    def owners(self) -> list[str]:
        with self._tx(write=False) as cur:
            cur.execute(f"SELECT DISTINCT owner FROM images WHERE state = '{RUNNING}' AND owner IS NOT NULL")
            return [r[0] for r in cur.fetchall()]

    def finish(self, owner: str, job_id: str, index: int, answer: Answer, replica: str | None = None) -> Finished | None:
        return self.finish_many(owner, [(job_id, index, answer)], replica)[0]

    def finish_many(self, owner: str, answers: Sequence[tuple[str, int, Answer]], replica: str | None = None) -> list[Finished | None]:
        """First every image is locked (those ``owner`` still holds, in (job, image) order), then each job's counters are
        moved once for all its answers, which take the next numbers in image order: a transaction waits for images only
        before it holds any job, so replicas claiming and finishing at once never wait for one another in a circle."""
        if not answers:
            return []
        now = time.time()
        wanted = sorted({(job_id, index) for job_id, index, _ in answers})
        given = {(job_id, index): answer for job_id, index, answer in answers}
        finished: dict[tuple[str, int], Finished] = {}
        with self._tx() as cur:
            held: list[tuple[str, int, int]] = []  # the images owner still holds; the others: claim lost, or job deleted
            for start in range(0, len(wanted), ANSWERS_A_STATEMENT):  # in order, a part at a time (SQLite's expression depth)
                some = wanted[start:start + ANSWERS_A_STATEMENT]
                pairs = " OR ".join(["(job_id = ? AND idx = ?)"] * len(some))
                cur.execute(f"SELECT job_id, idx, length(data) FROM images WHERE owner = ? AND state = ? AND ({pairs}) "
                            f"AND {LIVE} ORDER BY job_id, idx{self.lock_row}", (owner, RUNNING, *(v for key in some for v in key)))
                held += [(r[0], int(r[1]), int(r[2] or 0)) for r in cur.fetchall()]
            rows: dict[str, list[tuple[int, str, str | None, int]]] = {}  # each job's answers: image, summary, result, status
            grown: dict[str, int] = {}
            for job_id, mine in itertools.groupby(held, key=lambda row: row[0]):  # held is in (job, image) order
                sizes = {i: size for _, i, size in mine}
                rows[job_id] = [(i, *_stored(given[job_id, i]), given[job_id, i].status) for i in sizes]
                grown[job_id] = sum(len(summary) + len(result or "") for _, summary, result, _ in rows[job_id]) - sum(sizes.values())
            counters = self._count_answers(cur, rows, grown)
            numbered: list[tuple[str, int, str, int, int, str, str | None]] = []
            done_jobs: list[str] = []
            for job_id, answered in rows.items():
                last_seq, total = counters[job_id]
                first_seq = last_seq - len(answered) + 1
                numbered += [(job_id, i, DONE if status == 200 else FAILED, first_seq + n, status, summary, result)
                             for n, (i, summary, result, status) in enumerate(answered)]
                finished |= {(job_id, i): Finished(first_seq + n, last_seq == total and n == len(answered) - 1)
                             for n, (i, *_) in enumerate(answered)}
                if last_seq == total:
                    done_jobs.append(job_id)
            for start in range(0, len(numbered), ANSWERS_A_STATEMENT):  # one statement for many answers: a statement each
                part = numbered[start:start + ANSWERS_A_STATEMENT]  # had cost PostgreSQL a statement's start and end each
                cur.execute(f"WITH a(job_id, idx, state, seq, status, summary, result) AS (VALUES {_values(len(part), ANSWER_TYPES)}) "
                            "UPDATE images SET state = a.state, owner = NULL, lease_until = NULL, data = NULL, seq = a.seq, "
                            "status = a.status, summary = a.summary, result = a.result, finished = ?, replica = ? FROM a "
                            "WHERE images.job_id = a.job_id AND images.idx = a.idx",
                            (*(v for row in part for v in row), now, replica))
            if done_jobs:
                cur.execute("UPDATE jobs SET state = ?, finished = ?, callback_due = CASE WHEN callback_url IS NULL THEN 0 ELSE 1 END "
                            f"WHERE id IN ({', '.join('?' * len(done_jobs))})", (JOB_DONE, now, *done_jobs))
        return [finished.get((job_id, index)) for job_id, index, _ in answers]

    def _count_answers(self, cur: Cursor, rows: dict[str, list[tuple[int, str, str | None, int]]],
                       grown: dict[str, int]) -> dict[str, tuple[int, int]]:
        """Move each job's counters by its answers (``rows``) and stored bytes (``grown``), in one statement for many
        jobs; each job's answers so far and its images, after. The jobs are locked first, in one order (PostgreSQL), so
        transactions finishing answers of the same jobs wait for one another in line, never in a circle."""
        jobs = sorted(rows)
        counters: dict[str, tuple[int, int]] = {}
        for start in range(0, len(jobs), ANSWERS_A_STATEMENT):
            some = jobs[start:start + ANSWERS_A_STATEMENT]
            if self.lock_row:
                cur.execute(f"SELECT id FROM jobs WHERE id IN ({', '.join('?' * len(some))}) ORDER BY id{self.lock_row}", some)
            moved = [(j, ok := sum(status == 200 for *_, status in rows[j]), len(rows[j]) - ok, grown[j]) for j in some]
            cur.execute(f"WITH v(id, ok, bad, grown) AS (VALUES {_values(len(some), ('TEXT', 'BIGINT', 'BIGINT', 'BIGINT'))}) "
                        "UPDATE jobs SET done = jobs.done + v.ok, failed = jobs.failed + v.bad, bytes = jobs.bytes + v.grown FROM v "
                        "WHERE jobs.id = v.id RETURNING jobs.id, jobs.done + jobs.failed, jobs.total", [x for row in moved for x in row])
            counters |= {r[0]: (int(r[1]), int(r[2])) for r in cur.fetchall()}
        return counters

    def results(self, job_id: str, after: int, limit: int, summary_only: bool) -> list[ResultRow]:
        body = "NULL" if summary_only else "result"
        after, limit = _bounded(after), _bounded(limit)
        with self._tx(write=False) as cur:
            cur.execute(f"SELECT seq, idx, filename, status, summary, {body}, finished, replica FROM images "
                        "WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?", (job_id, after, limit))
            rows = cur.fetchall()
        return [ResultRow(int(r[0]), int(r[1]), r[2], int(r[3]), r[4], _whole(r[4], r[5]), None if r[6] is None else float(r[6]),
                          r[7]) for r in rows]

    def expire(self, finished_before: float) -> int:
        with self._tx() as cur:
            cur.execute("UPDATE jobs SET deleted = ? WHERE finished IS NOT NULL AND finished < ? AND callback_due = 0 "
                        "AND deleted IS NULL", (time.time(), finished_before))
            return max(cur.rowcount, 0)

    def sweep(self, finished_before: float) -> int:
        expired = self.expire(finished_before)
        self.purge()
        return expired

    def due_callbacks(self) -> list[JobInfo]:
        with self._tx(write=False) as cur:
            cur.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE callback_due = 1 AND deleted IS NULL")
            return [self._info(r) for r in cur.fetchall()]

    def callback_sent(self, job_id: str, outcome: str) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE jobs SET callback_due = 0, callback_outcome = ? WHERE id = ?", (outcome, job_id))
