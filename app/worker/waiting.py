"""Submitting a plan to the worker and waiting for it honestly: :class:`Busy` when the queue is full (with
when to retry), :class:`Late` past the deadline, the job dropped (its slot freed, its work stopped before the
next model call) when it is late or its client goes away. The worker knows no protocol: its refusals are the
typed :class:`Refused` outcomes below, which the service turns into its errors and each door into its own form."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from app.core.errors import model_failure
from app.monitoring.prometheus import Metrics
from app.worker.admission import QueueFull
from app.worker.engine import Worker
from app.worker.jobs import Job, JobCancelled
from idg_core.budget import PREDICT_UNITS
from idg_core.types import PlanOf

log = logging.getLogger(__name__)
T = TypeVar("T")
UntilDisconnected = Callable[[], Awaitable[None]]
"""Returns once the request's client has gone away (never, while it stays): see
:func:`app.api.requests.until_disconnected`."""
OnEvent = Callable[[dict[str, Any]], None]


@dataclass
class Outcome(Generic[T]):
    """A finished job's result and where its time went."""

    value: T
    queued_ms: float
    compute_ms: float


class Refused(Exception):
    """A submission the worker did not answer with a value: one of the subclasses below."""


class Busy(Refused):
    """The queue was full (or the worker takes nothing): retry in ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Late(Refused):
    """The deadline passed before the job finished; ``detail`` says more when the worker was stuck."""

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail or "the deadline passed")
        self.detail = detail


class Dropped(Refused):
    """The job was dropped for ``reason``: the server stops (:data:`SHUTDOWN_REASON`), or another reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the request was dropped: {reason}")
        self.reason = reason


class Failed(Refused):
    """The running plan raised ``error``: the model failed on this request only. The service words it
    (:func:`app.core.errors.model_failure`); its traceback is logged here."""

    def __init__(self, error: Exception) -> None:
        super().__init__(type(error).__name__)
        self.error = error


@dataclass(frozen=True)
class Submission(Generic[T]):
    """One plan to queue: what runs (``plan`` on ``model``, a ``kind`` of work), how urgent (``priority``: 0
    predictions, 1 attributions, 2 background work), what it may cost (``cost``: its work units at most,
    :mod:`idg_core.budget`) and whether its rows share no model call (``alone``: a method whose answer is not
    batch-invariant, :attr:`idg_core.methods.Method.batch_invariant`)."""

    model: str
    plan: PlanOf[T]
    kind: str
    priority: int = 1
    cost: float = PREDICT_UNITS
    alone: bool = False


@dataclass(frozen=True)
class Waiter:
    """How the caller waits for a submission: until ``deadline`` (``time.monotonic()``; the request's arrival
    plus ``timeout``, :func:`app.core.deadline.deadline_of`; None: ``timeout`` from submission), dropping it
    when ``until_disconnected`` returns (its client went away), with progress events to ``on_event``."""

    timeout: float
    deadline: float | None = None
    until_disconnected: UntilDisconnected | None = None
    on_event: OnEvent | None = None


async def submit_and_wait(worker: Worker, metrics: Metrics, work: Submission[T], waiter: Waiter) -> Outcome[T]:
    """Queue ``work`` and wait for it as ``waiter`` says; :class:`Busy` when full, :class:`Late` when late, :class:`Dropped`
    or :class:`Failed`. A late or abandoned job frees its slot at once and stops costing before the worker's next model call."""
    loop = asyncio.get_running_loop()
    timeout, plan, until_disconnected = waiter.timeout, work.plan, waiter.until_disconnected
    deadline = time.monotonic() + timeout if waiter.deadline is None else waiter.deadline
    job = Job(work.model, plan, work.kind, deadline, loop, loop.create_future(), work.priority, waiter.on_event, work.cost,
              alone=work.alone)
    try:
        worker.submit(job)
    except QueueFull as err:
        plan.close()
        metrics.rejections.labels(err.reason).inc()
        raise Busy(str(err), err.retry_after) from err
    watcher = asyncio.create_task(_watch(worker, until_disconnected, job)) if until_disconnected is not None else None
    try:
        value = await asyncio.wait_for(asyncio.shield(job.future), timeout=max(0.0, job.deadline - time.monotonic()))
    except TimeoutError as err:
        worker.cancel(job, "deadline")
        raise Late() from err
    except JobCancelled as err:
        if err.reason in ("deadline", "stuck"):
            raise Late(None if err.reason == "deadline" else str(err)) from err
        raise Dropped(err.reason) from err
    # No ValueError -> a refusal of the parameters here: the parameters were checked before the job was queued (app.service.planning
    # runs the methods' validation), so whatever the running plan raises is this request's 500.
    except Exception as err:  # noqa: BLE001 - the model failed on this request only
        # the answer's sentence, then the whole traceback and message (TorchScript's holds the model's source): the log's
        # only, on a line that names the request's ID
        log.error("job %d (%s) failed: %s", job.id, work.kind, model_failure(err), exc_info=err)
        raise Failed(err) from err
    finally:
        if watcher is not None:
            watcher.cancel()
        if not job.future.done():
            worker.cancel(job, "client_disconnected")
            job.future.add_done_callback(_consume)  # its error, when the worker ends it, goes unread
    started = job.started or job.enqueued
    return Outcome(value, (started - job.enqueued) * 1000, ((job.finished or time.monotonic()) - started) * 1000)

async def _watch(worker: Worker, until_disconnected: UntilDisconnected, job: Job) -> None:
    """Drop the job when its client goes away. It waits for the disconnect, it does not poll: a
    request waiting in a long queue costs the event loop nothing."""
    try:
        await until_disconnected()
    except Exception:  # noqa: BLE001 - a server whose receive fails: this job is just not watched
        log.debug("cannot watch the client of job %d", job.id, exc_info=True)
        return
    if not job.future.done():
        log.info("client of job %d went away; dropping it", job.id)
        worker.cancel(job, "client_disconnected")


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
