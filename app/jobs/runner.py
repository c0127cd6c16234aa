"""The job runner: on the app's event loop, it claims images from the store, answers each through
the worker at priority 2 (after every /predict at 0 and /attribute at 1, in the same model calls),
stores each answer, and calls the job's callback URL when the job ends.

At most ``IDG_JOBS_IN_FLIGHT`` images are in the worker at once (per process), so a 10,000-image
job holds that many of ``IDG_MAX_QUEUE``'s slots and the worker's rounds always serve a request
first. An image the worker refuses (503 busy, or the server stopping) goes back to ``pending`` and
claiming pauses for the worker's ``Retry-After``; a deadline (504) is retried up to
:data:`MAX_ATTEMPTS` claims, as is an image whose process died with it (a crash loop ends there).
Claims are leased: this process renews its leases every third of ``IDG_JOBS_LEASE_S``; a claim
whose process died is taken up by another once its lease runs out, or at once by a process
restarted on the same host (:meth:`JobRunner.recover`).

The store may be unreachable for a while (PostgreSQL restarting, another process holding SQLite's
write lock): no loop and no image's task dies of it. An answer waits, and is stored once the store is
back (tried again with backoff up to :data:`MAX_STORE_WAIT_S`); claiming pauses meanwhile. An image
whose task failed anyway is given back to the store (at the next upkeep), never held forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from app.core.config import Settings
from app.core.errors import ApiError, error_body
from app.core.model_loading import ModelLoadError
from app.doors.door import JOB
from app.doors.layer import Call, Doors
from app.doors.replica import replica_id
from app.jobs.callbacks import deliver, redacted
from app.jobs.sealing import KEY_FILE, load_key
from app.jobs.store import Answer, Claimed, Finished, JobInfo, Store, StoreBusy, StoreUnavailable
from app.monitoring.prometheus import StoreOperation
from app.schemas import AttributeParams, AttributeResponse
from app.service import BACKGROUND_PRIORITY, Service

log = logging.getLogger(__name__)
T = TypeVar("T")

JOB_PRIORITY = BACKGROUND_PRIORITY
"""The worker's priority of job images: after /predict (0) and /attribute (1)."""
MAX_ATTEMPTS = 3
"""Claims of one image (deadlines, processes that died with it) before it is answered with its error."""
FINISH_BATCH = 256
"""Most answers written in one transaction."""
CLAIM_FRACTION = 0.25
"""A runner claims again once this share of its slots (``IDG_JOBS_IN_FLIGHT``) is free, or none is in flight."""
POLL_S = 1.0
"""How often an idle runner looks for images (jobs submitted to another replica; its own wake it at once)."""
SWEEP_S = 60.0
MAX_PAUSE_S = 5.0
CALLBACK_TIMEOUT_S = 10.0
STORE_RETRY_S = 0.25
MAX_STORE_WAIT_S = 5.0
"""Waits between tries of a store operation that failed as unreachable: from STORE_RETRY_S, doubling up to this."""


def open_store(settings: Settings) -> Store:
    """PostgreSQL when ``IDG_JOBS_DB_URL`` is set, else SQLite under ``IDG_DATA_DIR``. One that cannot be opened is a
    :class:`~app.core.model_loading.ModelLoadError` naming the setting (the start-up's one line; it had been an 80-line
    ``PoolTimeout`` or ``NotADirectoryError`` traceback)."""
    try:
        sealer = load_key(settings.jobs_seal_key, settings.data_dir)
    except OSError as err:
        if settings.jobs_seal_key:  # the key is the setting's: no file to make
            raise ModelLoadError(f"IDG_JOBS_SEAL_KEY cannot be used: {err}") from err
        # the key file lives beside the SQLite store: a folder that cannot hold it cannot hold the store (one sentence)
        raise ModelLoadError(f"IDG_DATA_DIR={settings.data_dir}: the job store cannot be made there ({err.strerror or err}): "
                             f"neither its file nor the callback URLs' seal key ({KEY_FILE})") from err
    except ValueError as err:
        raise ModelLoadError(f"the callback URLs' seal key (IDG_JOBS_SEAL_KEY, else IDG_DATA_DIR/{KEY_FILE}) cannot be used: "
                             f"{err}") from err
    if settings.jobs_db_url:
        from app.jobs.postgres import PostgresStore

        if not settings.jobs_seal_key:
            log.warning("IDG_JOBS_SEAL_KEY is unset: callback URLs are sealed with %s; replicas sharing this PostgreSQL store "
                        "must share one key (set IDG_JOBS_SEAL_KEY alike on each), or a callback one replica sealed fails on "
                        "another", settings.data_dir / KEY_FILE)
        try:
            return PostgresStore(settings.jobs_db_url, settings.jobs_store_timeout_s, sealer)
        except Exception as err:  # noqa: BLE001 - psycopg's errors are imported with the optional extra
            if isinstance(err.__cause__, ImportError):  # the optional extra is missing: its message says what to install
                raise ModelLoadError(str(err)) from err
            where = urlsplit(settings.jobs_db_url)
            raise ModelLoadError(f"IDG_JOBS_DB_URL: the PostgreSQL server at {where.hostname}:{where.port or 5432} could not "
                                 f"be used ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from err
    from app.jobs.sqlite import SqliteStore

    try:
        return SqliteStore(settings.data_dir, settings.jobs_store_timeout_s, sealer)
    except OSError as err:
        raise ModelLoadError(f"IDG_DATA_DIR={settings.data_dir}: the job store cannot be made there ({err.strerror or err})") from err


async def start_jobs(service: Service, paused: Callable[[], bool], doors: Doors) -> JobRunner:
    """Open the store (SQLite or PostgreSQL, per the settings) and start its runner, whose images go through ``doors``."""
    store = await asyncio.to_thread(open_store, service.settings)
    runner = JobRunner(store, service, service.settings, doors, paused)
    await runner.start()
    return runner


PROCESS_STARTED = str(int(time.time() * 1000))
"""Tells this process from an earlier one with the same pid (a restarted container's pid 1)."""


def new_owner() -> str:
    """This runner's name in the store: ``host:pid:process start:token``."""
    return f"{socket.gethostname()}:{os.getpid()}:{PROCESS_STARTED}:{uuid.uuid4().hex[:8]}"


def _dead_here(owner: str) -> bool:
    """Whether ``owner`` was a process on this host that is gone (a previous run of this one included)."""
    host, pid_text, started, *_ = [*owner.split(":"), "", ""]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():  # this process (another app in it), or an earlier one with the same pid
        return started != PROCESS_STARTED
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def summary_of(response: AttributeResponse | None, prediction: list[Any] | None, explained: bool | None) -> dict[str, Any]:
    """An answer's scores and classes, without images: what ``GET /jobs/{id}/results?summary=true`` gives."""
    if response is not None:
        return {"explained": explained, "prediction": [c.model_dump() for c in response.prediction],
                "target": response.target.model_dump(),
                "faithfulness": None if response.faithfulness is None else response.faithfulness.model_dump()}
    return {"explained": explained, "prediction": [c.model_dump() for c in prediction or []], "target": None, "faithfulness": None}


class _Retry(Exception):
    """Give the image back and try it again later: the worker was busy or stopping, or late."""

    def __init__(self, pause_s: float, refund: bool, reason: str, status: int = 503) -> None:
        super().__init__(reason)
        self.pause_s, self.refund, self.reason, self.status = pause_s, refund, reason, status


class JobRunner:
    """Answers the store's images with ``service``; ``paused()`` true (draining, not ready) stops claiming."""

    def __init__(self, store: Store, service: Service, settings: Settings, doors: Doors,
                 paused: Callable[[], bool] = lambda: False, owner: str | None = None) -> None:
        self.store = store
        self.service = service
        self.settings = settings
        self.doors = doors
        """The layer every door passes through: each image is one call through the ``job`` door."""
        self.paused = paused
        self.owner = owner or new_owner()
        self._tasks: dict[asyncio.Task[None], Claimed] = {}
        self._wake = asyncio.Event()
        self._purge_wanted = asyncio.Event()
        """Set when deleted or expired jobs' rows wait to be freed (:meth:`purge_soon`)."""
        self._resume_at = 0.0
        self._stopping = False
        self._loops: list[asyncio.Task[None]] = []
        self._callbacks: set[asyncio.Task[None]] = set()
        self._tls: ssl.SSLContext | None = None
        """The callbacks' TLS context, built once off the event loop: httpx builds one per client otherwise
        (40-50 ms of CPU loading the CA bundle, which would stall every request on the loop at each job's end)."""
        self._tls_lock = asyncio.Lock()
        """Held while the context is built, so callbacks that start meanwhile wait for it instead of each building one."""
        self.answered = 0
        """Images this runner stored answers for (tests, logs)."""
        self._orphans: list[Claimed] = []
        """Claims whose task failed unexpectedly: given back to the store at the next upkeep."""
        self._claim_wait = POLL_S
        self._finishing: list[tuple[Claimed, Answer, asyncio.Future[Finished | None]]] = []
        """Answers waiting to be stored: those that arrive while others are being written go in together next."""
        self._finisher: asyncio.Task[None] | None = None
        self.metrics = service.metrics
        self.metrics.job_images_in_flight.set_function(lambda: len(self._tasks))
        self.metrics.job_store_up.set(1)
        store.reachability.listeners.append(lambda up: self.metrics.job_store_up.set(int(up)))

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self.recover()
        await asyncio.to_thread(self.store.expire, time.time() - self.settings.jobs_retention_s)  # hidden now, freed below
        for job in await asyncio.to_thread(self.store.due_callbacks):  # finished while the previous process went down
            self._callback(job)
        self._loops = [asyncio.create_task(self._claim_loop(), name="idg-jobs"),
                       asyncio.create_task(self._upkeep_loop(), name="idg-jobs-upkeep"),
                       asyncio.create_task(self._purge_loop(), name="idg-jobs-purge")]
        self.purge_soon()  # what the previous process deleted, or left expired, and had not freed yet
        log.info("job runner %s started (%s, %d image(s) in flight at most)", self.owner, type(self.store).__name__,
                 self.settings.jobs_in_flight)

    async def recover(self) -> int:
        """Give back the claims of dead processes on this host (this one's previous run: killed, or crashed)."""
        owners = await asyncio.to_thread(self.store.owners)
        dead = [o for o in owners if _dead_here(o)]
        released = await asyncio.to_thread(self.store.release_owners, dead) if dead else 0
        if released:
            log.info("took back %d image(s) claimed by a process that is gone (%s)", released, ", ".join(dead))
        return released

    async def stop(self) -> None:
        """Stop claiming; the images in flight are dropped from the worker and given back to the store."""
        self._stopping = True
        for task in self._loops:
            task.cancel()
        held = list(self._tasks.items())
        for task, _ in held:
            task.cancel()
        finisher = [self._finisher] if self._finisher is not None else []
        for task in finisher:
            task.cancel()
        await asyncio.gather(*[t for t, _ in held], *self._loops, *finisher, return_exceptions=True)
        kept = 0
        for claim in [c for _, c in held] + self._orphans:
            try:
                await asyncio.to_thread(self.store.release, self.owner, claim.job_id, claim.index, True)
            except StoreUnavailable as err:  # its lease runs out instead: another process (or the next run here) takes it up
                kept += 1
                log.warning("job %s image %d not given back (the store is unreachable: %s); it returns when its lease ends",
                            claim.job_id, claim.index, err)
        for task in list(self._callbacks):
            task.cancel()
        await asyncio.to_thread(self.store.close)
        log.info("job runner stopped; %d image(s) in flight given back", len(held) + len(self._orphans) - kept)

    def wake(self) -> None:
        """Look for images now (a job was just submitted)."""
        self._wake.set()

    def purge_soon(self) -> None:
        """Free the rows of deleted jobs now, in the background (a job was just deleted)."""
        self._purge_wanted.set()

    def cancel_job(self, job_id: str) -> int:
        """Drop this job's images from the worker (the job was deleted); how many were in flight."""
        tasks = [t for t, c in self._tasks.items() if c.job_id == job_id]
        for task in tasks:
            task.cancel()
        return len(tasks)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    # -- loops -----------------------------------------------------------------------------
    async def _claim_loop(self) -> None:
        while not self._stopping:
            try:
                await self._claim_some()
                self._claim_wait = POLL_S
            except StoreBusy as err:  # this process's own operations held the store: it answers, so no error and no wait
                log.debug("claiming job images waited for this process's other store operations (%s)", err)
            except StoreUnavailable as err:  # said once by the store's Reachability; waits longer while it lasts
                self.metrics.job_store_errors.labels("claim").inc()
                self._claim_wait = min(2 * self._claim_wait, MAX_STORE_WAIT_S)
                log.debug("claiming job images failed (%s); trying again in %g s", err, self._claim_wait)
            except Exception:  # noqa: BLE001 - the loop goes on whatever a claim meets
                self.metrics.job_store_errors.labels("claim").inc()
                log.exception("claiming job images failed; trying again in %g s", POLL_S)
            self._wake.clear()
            wait = self._claim_wait
            paused_for = self._resume_at - time.monotonic()  # the worker said busy: wake when it said to retry
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=min(wait, paused_for) if paused_for > 0.05 else wait)

    async def _claim_some(self) -> bool:
        """Claim what the worker has room for, once a batch's worth is free (:data:`CLAIM_FRACTION` of the slots) or the
        worker holds none of the jobs' images: answers arrive a few at a time, and a claim for each would cost the store
        a claim per image or two (its work is per claim: a claim of 64 costs the store 0.14 ms of CPU an image, one of 2
        0.7-0.9 ms, benchmarks/store_scale.py); whether the store was asked (and answered)."""
        free = self.settings.jobs_in_flight - len(self._tasks)
        if free <= 0 or self.paused() or time.monotonic() < self._resume_at:
            return False
        if self._tasks and free < max(1, int(CLAIM_FRACTION * self.settings.jobs_in_flight)):
            return False  # the worker has the rest meanwhile; the next answers wake this loop again
        for claim in await asyncio.to_thread(self.store.claim, self.owner, free, self.settings.jobs_lease_s):
            task = asyncio.create_task(self._run(claim), name=f"idg-job-{claim.job_id}-{claim.index}")
            self._tasks[task] = claim
            task.add_done_callback(self._done)
        return True

    def _done(self, task: asyncio.Task[None]) -> None:
        claim = self._tasks.pop(task, None)
        if claim is not None and not task.cancelled() and (err := task.exception()) is not None:
            log.error("job %s image %d: its task failed; the image goes back to the store", claim.job_id, claim.index, exc_info=err)
            self._orphans.append(claim)
        self._wake.set()

    async def _upkeep_loop(self) -> None:
        last_sweep = time.monotonic()
        while not self._stopping:
            await asyncio.sleep(self.settings.jobs_lease_s / 3)
            try:
                while self._orphans:  # before renewing: their leases must not be kept alive
                    claim = self._orphans[0]
                    await asyncio.to_thread(self.store.release, self.owner, claim.job_id, claim.index, False)
                    self._orphans.pop(0)
                await asyncio.to_thread(self.store.renew, self.owner, self.settings.jobs_lease_s)
                if time.monotonic() - last_sweep > SWEEP_S:  # jobs past their retention: by the purge, not holding this loop
                    last_sweep = time.monotonic()
                    self.purge_soon()
            except StoreBusy as err:  # this process's own operations held the store: not the store's error
                log.debug("renewing job claims waited for this process's other store operations: %s", err)
            except StoreUnavailable as err:  # said once by the store's Reachability
                self.metrics.job_store_errors.labels("upkeep").inc()
                log.debug("renewing job claims failed: %s", err)
            except Exception:  # noqa: BLE001 - the loop goes on
                self.metrics.job_store_errors.labels("upkeep").inc()
                log.exception("renewing job claims failed")

    async def _purge_loop(self) -> None:
        """Delete the jobs past their retention and free the rows of deleted jobs, in the background: at start (what the
        previous process left), after each ``DELETE /jobs/{id}`` and every :data:`SWEEP_S`. The purge takes the store a
        few images per transaction, so requests and the runner's claims and answers take their turns meanwhile."""
        while not self._stopping:
            await self._purge_wanted.wait()
            self._purge_wanted.clear()
            try:
                expired = await asyncio.to_thread(self.store.expire, time.time() - self.settings.jobs_retention_s)
                if expired:
                    log.info("deleted %d finished job(s) past their retention", expired)
                began = time.monotonic()
                purged = await asyncio.to_thread(self.store.purge, lambda: self._stopping)
                if purged:
                    log.info("freed the rows of %d deleted job(s) in %.1f s", purged, time.monotonic() - began)
            except StoreUnavailable as err:  # StoreBusy too: tried again shortly
                if not isinstance(err, StoreBusy):
                    self.metrics.job_store_errors.labels("upkeep").inc()
                log.debug("freeing deleted jobs' rows failed (%s); trying again in %g s", err, MAX_STORE_WAIT_S)
                await asyncio.sleep(MAX_STORE_WAIT_S)
                self.purge_soon()
            except Exception:  # noqa: BLE001 - the loop goes on
                self.metrics.job_store_errors.labels("upkeep").inc()
                log.exception("freeing deleted jobs' rows failed")

    async def _store(self, what: StoreOperation, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` in a thread, tried again while the store is unreachable (waiting longer each time,
        up to :data:`MAX_STORE_WAIT_S`) until it answers, or the runner stops (the task is cancelled)."""
        wait, tries = STORE_RETRY_S, 0
        while True:
            try:
                done = await asyncio.to_thread(call, *args)
            except StoreBusy as err:  # this process's own operations held the store: again shortly, no error counted
                log.debug("job store: %s waited for this process's other operations (%s)", what, err)
                await asyncio.sleep(STORE_RETRY_S)
                continue
            except StoreUnavailable as err:
                tries += 1
                self.metrics.job_store_errors.labels(what).inc()
                log.log(logging.WARNING if tries == 1 else logging.DEBUG, "job store: %s failed (%s); trying again in %g s",
                        what, err, wait)
                await asyncio.sleep(wait)
                wait = min(2 * wait, MAX_STORE_WAIT_S)
                continue
            if tries:
                log.info("job store: %s done after %d failed tries", what, tries)
            return done

    # -- one image -------------------------------------------------------------------------
    async def _run(self, claim: Claimed) -> None:
        """One image through the ``job`` door (:mod:`app.doors.layer`): its log lines, and the worker's for it, name the job's
        request ID; it is counted (``idg_requests_total{door="job", route="image"}``: its answer's status, or the 503 or 504
        it is retried for), logged and traced: its span a child of the submitting request's (``POST /jobs``, whose trace
        context the job keeps with its parameters while tracing is on)."""
        with self.doors.handle(JOB, "image", request_id=claim.request_id, carrier=claim.params.get("trace"), name="job image",
                               line=f"job {claim.job_id} image {claim.index}") as door:
            door.fields.update(job=claim.job_id, image=claim.index)
            door.attributes.update({"idg.job": claim.job_id, "idg.image": claim.index})
            await self._run_image(claim, door)

    async def _run_image(self, claim: Claimed, door: Call) -> None:
        try:
            answer = await self._answer(claim)
        except _Retry as retry:
            door.status = str(retry.status)
            if not claim_exhausted(claim, retry):
                self.metrics.job_images.labels("retried").inc()
                await self._store("release", self.store.release, self.owner, claim.job_id, claim.index, retry.refund)
                if retry.pause_s:
                    self._resume_at = max(self._resume_at, time.monotonic() + min(retry.pause_s, MAX_PAUSE_S))
                return
            answer = _error_answer(504, "deadline", f"{retry.reason}, {claim.attempts} times")
        door.status = str(answer.status)
        finished = await self._finish(claim, answer)
        if finished is not None and finished.job_done:
            self.metrics.jobs_finished.inc()
            job = await self._store("get_job", self.store.get_job, claim.job_id)
            log.info("job %s finished: %s", claim.job_id, job and f"{job.done} answered, {job.failed} failed")
            if job is not None and job.callback_url:
                self._callback(job)

    async def _finish(self, claim: Claimed, answer: Answer) -> Finished | None:
        """Store the answer (None: the claim was lost). Group commit: a lone answer is written at once; answers that
        arrive while others are being written (a model batch's, together) wait and are written together in one
        transaction (:meth:`~app.jobs.store.Store.finish_many`), one commit instead of one each."""
        future: asyncio.Future[Finished | None] = asyncio.get_running_loop().create_future()
        self._finishing.append((claim, answer, future))
        if self._finisher is None or self._finisher.done():
            self._finisher = asyncio.create_task(self._write_answers(), name="idg-jobs-finish")
        return await future

    async def _write_answers(self) -> None:
        """Write the waiting answers, :data:`FINISH_BATCH` at a time, until none wait; an answer whose task was cancelled
        before its turn (the runner stopping, its job deleted) is not written (its claim is given back instead)."""
        while self._finishing:
            batch = [entry for entry in self._finishing[:FINISH_BATCH] if not entry[2].done()]
            del self._finishing[:FINISH_BATCH]
            if not batch:
                continue
            try:
                done = await self._store("finish", self.store.finish_many, self.owner,
                                         [(c.job_id, c.index, a) for c, a, _ in batch], replica_id())
            except Exception as err:  # noqa: BLE001 - not the store being away (retried above): each image's task fails with it
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            for (claim, answer, future), finished in zip(batch, done, strict=True):
                self._account(claim, answer, finished)
                if not future.done():
                    future.set_result(finished)

    def _account(self, claim: Claimed, answer: Answer, finished: Finished | None) -> None:
        """Count a written answer as the store now has it (before the image's own task resumes, a loop turn later)."""
        if finished is None:
            self.metrics.job_images.labels("lost").inc()
            log.info("job %s image %d: its claim was lost (job deleted, or taken over); answer dropped", claim.job_id, claim.index)
            return
        self.answered += 1
        self.metrics.job_images.labels("answered" if answer.status == 200 else "failed").inc()

    async def _answer(self, claim: Claimed) -> Answer:
        """The image's answer; :class:`_Retry` when it should be tried again later."""
        if claim.attempts > MAX_ATTEMPTS:
            return _error_answer(500, "gave_up", f"given up after {MAX_ATTEMPTS} attempts (each time the server stopped or "
                                 "died with this image in flight)")
        try:
            return await self._explain(claim)
        except ApiError as err:
            if err.status == 503:  # busy, stopping, stalled: not this image's fault
                raise _Retry(_retry_after(err), True, err.message) from err
            if err.status == 504:
                raise _Retry(0.0, False, err.message, 504) from err
            return _error_answer(err.status, err.code, err.message)
        except Exception as err:  # noqa: BLE001 - this image fails alone
            log.error("job %s image %d failed unexpectedly", claim.job_id, claim.index, exc_info=err)
            return _error_answer(500, "internal", f"internal error: {type(err).__name__}")

    async def _explain(self, claim: Claimed) -> Answer:
        """The image through the service's one call: explained, or with ``explain_if`` predicted and explained when the
        condition holds, at :data:`JOB_PRIORITY` within the request timeout from its claim."""
        service = self.service
        params = AttributeParams.model_validate(claim.params["attribute"])
        context = service.context(time.perf_counter(), priority=JOB_PRIORITY)
        condition = claim.params.get("explain_if")
        if condition is None:
            response = await service.attribute(service.explain_request(params, context), claim.data)
            return Answer(200, summary_of(response, None, None), response.model_dump(mode="json"))
        predicted = await service.predict(service.explain_if_request(params, condition, context), claim.data)
        if predicted.explanation is None:
            return Answer(200, summary_of(None, predicted.top_k, False))
        return Answer(200, summary_of(predicted.explanation, None, True), predicted.explanation.model_dump(mode="json"))

    # -- callbacks -------------------------------------------------------------------------
    def _callback(self, job: JobInfo) -> None:
        task = asyncio.create_task(self._send_callback(job), name=f"idg-job-callback-{job.id}")
        self._callbacks.add(task)
        task.add_done_callback(self._callbacks.discard)

    async def _send_callback(self, job: JobInfo) -> None:
        """POST the job's status to its callback URL, signed, tried again with backoff (at least once in
        all: one still due when the process stops is sent by the next); its outcome is kept on the job."""
        assert job.callback_url is not None
        body = json.dumps(job_status(job, self.settings.public_url or ""), separators=(",", ":")).encode()
        async with self._tls_lock:
            if self._tls is None:
                self._tls = await asyncio.to_thread(httpx.create_ssl_context)
        if job.callback_target is None:  # its sealed URL does not open under this server's key: failed, saying why
            outcome = f"failed: {job.callback_problem}"
            log.error("job %s: callback %s not sent: %s", job.id, job.callback_url, job.callback_problem)
        else:
            async with httpx.AsyncClient(timeout=CALLBACK_TIMEOUT_S, follow_redirects=False, verify=self._tls) as client:
                outcome = await deliver(client, job.callback_target, body, self.settings.callback_secret, f"job {job.id}")
        self.metrics.job_callbacks.labels(outcome.split(":", 1)[0]).inc()
        await self._store("callback_sent", self.store.callback_sent, job.id, outcome)


def _retry_after(err: ApiError) -> float:
    try:
        return float(err.headers.get("Retry-After", "1"))
    except ValueError:
        return 1.0


def claim_exhausted(claim: Claimed, retry: _Retry) -> bool:
    """A counted retry (a deadline) on the image's last allowed attempt: answer it with the error."""
    return not retry.refund and claim.attempts >= MAX_ATTEMPTS


def _error_answer(status: int, code: str, message: str) -> Answer:
    return Answer(status, error_body(status, message, code))  # with the job image's request ID


def job_status(job: JobInfo, base_url: str) -> dict[str, Any]:
    """``GET /jobs/{id}``'s body (and the callback's): state, counts, ETA from this job's own pace."""
    eta = None
    if job.finished is None and job.started is not None and job.answered:
        eta = round((time.time() - job.started) / job.answered * (job.total - job.answered), 1)
    elif job.finished is not None:
        eta = 0.0
    base = base_url.rstrip("/")
    return {
        "id": job.id, "state": job.state, "total": job.total, "done": job.done, "failed": job.failed,
        "pending": job.total - job.answered, "created": job.created, "started": job.started, "finished": job.finished,
        "eta_s": eta, "url": f"{base}/jobs/{job.id}", "results_url": f"{base}/jobs/{job.id}/results",
        "parameters": job.params.get("attribute", {}), "explain_if": job.params.get("explain_if"),
        "callback_url": None if job.callback_url is None else redacted(job.callback_url), "callback_outcome": job.callback_outcome,
        "tenant": job.tenant, "request_id": job.request_id,
    }
