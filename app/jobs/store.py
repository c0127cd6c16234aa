"""What a job store keeps and the few operations the routes and the runner need (:class:`Store`).

A job is a list of images and one set of /attribute parameters. Each image is ``pending``, then
``running`` (claimed by one runner, under a lease it renews), then ``done`` or ``failed`` with its
answer. Storing an answer, marking the image finished and numbering it in the job's results happen
in one transaction, and only while the claim is still the runner's own, so every image is answered
exactly once whatever dies in between (a claim whose runner died goes back to ``pending``).
Implementations: :mod:`app.jobs.sqlite` (the default, one file) and :mod:`app.jobs.postgres`
(replicas sharing jobs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

MAX_INT = 2**63 - 1
"""The largest offset, sequence number or count the stores take (SQLite's INTEGER, PostgreSQL's BIGINT)."""
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
"""Image states."""
QUEUED, JOB_RUNNING, JOB_DONE = "queued", "running", "done"
"""Job states: no image claimed yet, some claimed, every image answered."""


class StoreFull(Exception):
    """Storing this job would pass ``IDG_JOBS_MAX_BYTES`` (the route answers 507)."""


class QuotaExceeded(Exception):
    """Storing this job would pass its key's ``IDG_JOBS_MAX_BYTES_PER_KEY`` (the route answers 413)."""


class StoreUnavailable(Exception):
    """The store could not be reached, or stayed locked past ``IDG_JOBS_STORE_TIMEOUT_S``: a passing failure
    (the routes answer 503 with ``Retry-After``; the runner waits and tries again). Nothing of the failed
    operation was stored."""


class StoreBusy(StoreUnavailable):
    """This process's own operations held the store's connection past ``IDG_JOBS_STORE_TIMEOUT_S`` (a large job being
    written, a sweep): the store itself answers, so neither readiness nor the store's error count hear of it; the route
    answers 503 all the same, and the runner tries again shortly."""


OPERATION_DEADLINE: ContextVar[float | None] = ContextVar("job_store_operation_deadline", default=None)
"""The ``time.monotonic()`` by which a store operation must answer, set by its caller before the operation's thread is
started (:func:`asyncio.to_thread` carries it there): an operation that waited for a thread past it gives up at once,
so a request waits ``IDG_JOBS_STORE_TIMEOUT_S`` in all, not that on top of the operations queued before it."""


class Reachability:
    """Whether the store answered its last operation, and since when it has not (``/health/ready`` and
    the ``idg_durable_job_store_up`` gauge say so). ``listeners`` hear each change (True: reachable again)."""

    def __init__(self) -> None:
        self.down_since: float | None = None
        self.error = ""
        self.listeners: list[Callable[[bool], None]] = []
        self._lock = threading.Lock()

    @property
    def up(self) -> bool:
        return self.down_since is None

    def ok(self) -> None:
        if self.down_since is None:
            return
        with self._lock:
            since, self.down_since, self.error = self.down_since, None, ""
        if since is not None:
            log.warning("the job store answers again (after %.1f s)", time.time() - since)
            self._tell(True)

    def failed(self, err: BaseException) -> None:
        with self._lock:
            first, self.error = self.down_since is None, f"{type(err).__name__}: {str(err).strip()[:300]}"
            if first:
                self.down_since = time.time()
        if first:
            log.warning("the job store is unreachable: %s", self.error)
            self._tell(False)

    def _tell(self, up: bool) -> None:
        for listener in self.listeners:
            listener(up)


@dataclass(frozen=True)
class JobInfo:
    """A job's row: its state and counts (``done`` answered, ``failed`` answered with an error)."""

    id: str
    state: str
    total: int
    done: int
    failed: int
    created: float
    started: float | None
    finished: float | None
    params: dict[str, Any]
    callback_url: str | None
    """The callback URL as shown: its user, password, query values and fragment ``***``."""
    bytes: int
    callback_outcome: str | None = None
    """What the callback got, once sent: ``delivered``, ``refused`` or ``failed``, with the status or error and the attempts."""
    tenant: str | None = None
    """The name of the API key that submitted it (None where no keys are configured)."""
    request_id: str | None = None
    """The ``X-Request-ID`` of the request that submitted it (None for a job stored before the service kept it)."""
    callback_target: str | None = field(default=None, repr=False)
    """The callback URL to call, its secrets in clear: opened from the store's sealed copy (:mod:`app.jobs.sealing`); None
    where there is no callback, or its sealed URL does not open (:attr:`callback_problem` says why). ``callback_url`` is
    the URL as shown, its secrets ``***``."""
    callback_problem: str | None = None
    """Why :attr:`callback_target` is None for a job with a callback (sealed with another key): its callback fails so."""

    @property
    def answered(self) -> int:
        return self.done + self.failed


@dataclass(frozen=True)
class Claimed:
    """One image a runner holds: what it needs to answer it."""

    job_id: str
    index: int
    filename: str
    data: bytes
    params: dict[str, Any]
    attempts: int
    """Claims of this image so far, this one included (those given back as "busy" not counted)."""
    request_id: str | None = None
    """The job's request ID (:attr:`JobInfo.request_id`): the runner's log lines for this image carry it."""


@dataclass(frozen=True)
class Answer:
    """An image's answer: ``status`` 200 with its summary and full body, or an error status with
    the error as ``summary`` (``result`` None)."""

    status: int
    summary: dict[str, Any]
    result: dict[str, Any] | None = None


@dataclass(frozen=True)
class Finished:
    """What storing an answer did: its place in the job's results and whether it was the last."""

    seq: int
    job_done: bool


@dataclass(frozen=True)
class ResultRow:
    seq: int
    index: int
    filename: str
    status: int
    summary: str
    """JSON text."""
    result: str | None
    """JSON text, None for an error or when only summaries were asked for."""
    finished: float | None = None
    """When the answer was stored (Unix time; None for one stored before the service kept it)."""
    replica: str | None = None
    """Which replica answered it (``X-IDG-Replica``: ``host:pid``, or the Ray Serve replica; None if not kept)."""


class Store(Protocol):
    """A job store; every method blocks (the routes and the runner call them in a thread), and raises
    :class:`StoreUnavailable` when the store cannot be reached (or stays locked) for now."""

    reachability: Reachability
    timeout_s: float
    """How long one operation may wait for the store, in all (``IDG_JOBS_STORE_TIMEOUT_S``)."""

    def create_job(self, job_id: str, params: dict[str, Any], callback_url: str | None, images: list[tuple[str, bytes]],
                   max_bytes: int, tenant: str | None = None, request_id: str | None = None,
                   max_tenant_bytes: int | None = None) -> JobInfo:
        """Store a job and its images in one transaction, or nothing of it: :class:`QuotaExceeded` if the bytes of
        ``tenant``'s jobs would then pass ``max_tenant_bytes`` (not checked for a job of no tenant), else
        :class:`StoreFull` if every job's bytes would then pass ``max_bytes``. ``tenant``: the name of the key that
        submitted it; ``request_id``: the submitting request's ``X-Request-ID``; ``callback_url``: kept as shown (its
        secrets ``***``), the whole URL sealed with the store's key (:mod:`app.jobs.sealing`)."""
        ...

    def get_job(self, job_id: str) -> JobInfo | None: ...

    def list_jobs(self, offset: int, limit: int, before: tuple[float, str] | None = None,
                  tenant: str | None = None) -> tuple[list[JobInfo], int]:
        """Jobs, newest first (after the ``offset`` first), and how many there are in all; ``before``: only
        jobs after this one (its ``(created, id)``) in that order: a page that new submissions do not shift;
        ``tenant``: only the jobs this key submitted (None: everyone's)."""
        ...

    def delete_job(self, job_id: str) -> bool:
        """Delete a job at once: from now on no read finds it, its images are not claimed nor answered, its callback is no
        longer due and its bytes count against no bound; its rows (images and answers) are freed by :meth:`purge`, in the
        background. False if there was none."""
        ...

    def purge(self, stop: Callable[[], bool] = lambda: False) -> int:
        """Free the rows of the deleted jobs (deleted, or expired, before this process started too), a few images per
        transaction, until none is left or ``stop()``; how many jobs were freed (SQLite: then give free pages back to the
        disk, for a bounded time)."""
        ...

    def expire(self, finished_before: float) -> int:
        """Delete, as :meth:`delete_job` does, the jobs finished before this time whose callback is not due; how many."""
        ...

    def claim(self, owner: str, limit: int, lease_s: float) -> list[Claimed]:
        """Claim up to ``limit`` images for ``owner``: pending ones, or running ones whose lease
        ran out; round-robin across jobs (the first image of every job before the second of any)."""
        ...

    def renew(self, owner: str, lease_s: float) -> None:
        """Extend the lease of every image ``owner`` holds."""
        ...

    def release(self, owner: str, job_id: str, index: int, refund: bool) -> None:
        """Give a claimed image back (to be tried again), if ``owner`` still holds it; ``refund``:
        this claim does not count as an attempt (the worker was busy, or the server stopped)."""
        ...

    def release_owners(self, owners: list[str]) -> int:
        """Give back every image these (dead) owners held; how many."""
        ...

    def owners(self) -> list[str]:
        """The owners of running images."""
        ...

    def finish(self, owner: str, job_id: str, index: int, answer: Answer, replica: str | None = None) -> Finished | None:
        """Store the answer and finish the image atomically, if ``owner`` still holds it (None if
        not: the claim was lost, or the job deleted), with the time and the ``replica`` that answered it."""
        ...

    def finish_many(self, owner: str, answers: Sequence[tuple[str, int, Answer]], replica: str | None = None) -> list[Finished | None]:
        """:meth:`finish` of each (job, image, answer) in one transaction, its outcomes in the order given: all stored or,
        the store unreachable, none (a runner stores the answers that arrived together at once: one commit instead of one
        each). They are written in (job, image) order, so that replicas writing at once lock rows in one order."""
        ...

    def results(self, job_id: str, after: int, limit: int, summary_only: bool) -> list[ResultRow]:
        """Answers numbered after ``after``, in the order they were stored."""
        ...

    def sweep(self, finished_before: float) -> int:
        """:meth:`expire` then :meth:`purge`; how many expired."""
        ...

    def due_callbacks(self) -> list[JobInfo]:
        """Finished jobs with a callback URL not yet called."""
        ...

    def callback_sent(self, job_id: str, outcome: str) -> None:
        """The job's callback is no longer due; ``outcome`` is what it got (kept on the job)."""
        ...

    def close(self) -> None: ...
