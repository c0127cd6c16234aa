"""The worker's device loop: one thread owns the device, takes jobs from the admitted ones and drives
their plans, pooling the path points of many requests into shared model calls.

The loop's parts live apart: :mod:`app.worker.admission` takes or refuses a request (its slot, the
``Retry-After`` from the measured rate), :mod:`app.worker.scheduler` decides what goes into each model
call (pure rules, tested without threads), :mod:`app.worker.device` runs the calls on a thread of its own
(call k+1 is prepared and call k booked while the device runs), and :mod:`app.worker.watchdog` fails a
job the worker still holds ``watchdog_grace_s`` past its deadline (the worker reports itself stuck,
readiness 503, until that round returns).

Each round is one model call (see the scheduler for which rows it takes); a step with more rows goes
on in the next rounds, and a plan gets its answers once its step is complete. So a ``/predict`` waits
for at most the model calls in flight, and the deadline is checked before every call: a request past it
(or cancelled) leaves the device within one call, the others' answers unaffected. A failed call is
retried job by job, so only the request that fails gets the error; a CUDA out-of-memory error splits
the call first.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from app.core.errors import SHUTTING_DOWN
from app.doors import tracing
from app.doors.request_id import current_request_id
from app.monitoring.prometheus import Metrics
from app.worker.admission import Admission, QueueFull, RateEstimate
from app.worker.device import Call, DeviceStage, name_os_thread
from app.worker.jobs import SHUTDOWN_REASON, Job, JobCancelled, JobStuck
from app.worker.scheduler import BACKGROUND, Scheduler
from app.worker.watchdog import Watchdog
from idg_core.budget import GRAD_UNITS, row_units, work_units
from idg_core.call_shapes import CallShapes
from idg_core.model_calls import CallStats, answer_rows, book_call, booked_answers, prepare_call
from idg_core.types import Answer, Model

__all__ = ["BACKGROUND", "GRAD_UNITS", "QueueFull", "Worker", "work_units"]  # GRAD_UNITS, work_units: idg_core.budget

log = logging.getLogger(__name__)
T = TypeVar("T")
BOOK_RUNNING_AFTER_S = 1.0
"""A model call running longer than this is booked as device busy time while it runs (every 0.25 s)."""


class Worker:
    """Owns the models on ``device``; ``submit``, ``cancel``, ``wait_estimate`` and ``stuck`` are
    called from the event loop, everything else runs on the worker's own thread."""

    def __init__(
        self, models: Mapping[str, Model], device: torch.device, metrics: Metrics, *, max_batch_images: int,
        max_round_images: int, batch_wait_ms: float, max_queue: int, max_predict_queue: int = 16,
        watchdog_grace_s: float = 10.0, shapes: Mapping[str, CallShapes] | None = None, pipeline_depth: int = 2,
        on_device_event: Callable[[str, int], None] | None = None, launch_ahead: int = 2,
    ) -> None:
        self.models = dict(models)
        self.device = device
        self.metrics = metrics
        self.max_batch_images = max_batch_images
        self.batch_wait = batch_wait_ms / 1000
        self.stats = CallStats()
        self.shapes = {name: (shapes or {}).get(name) or CallShapes() for name in self.models}
        """Each model's call sizes (:mod:`idg_core.call_shapes`): fixed and warmed, or any."""
        self.rate = RateEstimate()
        self._marks = metrics.device_marks(device)
        """With several server processes: where this one marks its calls on the device and whether it holds requests."""
        self.admission = Admission(metrics, max_queue=max_queue, max_predict_queue=max_predict_queue,
                                   stall_wait_s=watchdog_grace_s, rate=self.rate,
                                   on_holds=None if self._marks is None else self._marks.holds)
        self.scheduler = Scheduler(list(self.models), min(max_batch_images, max(max_round_images, 1)), shapes=self.shapes,
                                   max_batch={name: getattr(m, "max_batch", None) for name, m in self.models.items()})
        self.watchdog = Watchdog(watchdog_grace_s, self._fail_late, self._tick)
        self._busy_lock = threading.Lock()  # the busy time of a call: booked as it runs (watchdog) and at its end (worker)
        self.pipeline_depth = max(1, pipeline_depth)
        self.launch_ahead = max(1, launch_ahead)
        """One ``app.results`` log line per prediction and explanation (IDG_LOG_PREDICTIONS)."""
        self._on_device_event = on_device_event
        self._device: DeviceStage
        self._calls: deque[Call] = deque()  # handed to the device stage, not yet booked, oldest first
        self._last_booked = 0.0
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._active: list[Job] = []
        self._stop = threading.Event()
        self._warm_up: Callable[[], None] | None = None
        self._warm_up_error: BaseException | None = None
        self._warmed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idg-worker", daemon=True)

    # -- event-loop side -------------------------------------------------------------------
    def start(self, warm_up: Callable[[], None] | None = None) -> None:
        """Start the worker thread and the watchdog. ``warm_up``, if given, runs first on the worker's own
        thread, where the requests will run (its malloc arena, thread-local caches), and this returns only
        once it has; if it raises, the worker does not start and the exception is raised here."""
        self._warm_up = warm_up
        self._device = DeviceStage(self.device, self.pipeline_depth, on_event=self._on_device_event, ahead=self.launch_ahead,
                                   work_since=lambda: self.admission.held_since, on_idle=self._book_idle,
                                   on_busy=None if self._marks is None else self._marks.call)
        self._thread.start()
        self._warmed.wait()
        if self._warm_up_error is not None:
            self._thread.join()
            self._device.stop()
            raise self._warm_up_error
        if self._marks is not None:
            self._marks.join()  # serving from now: the device's time starts (a warm-up's calls are not the traffic's)
        self.watchdog.start(self._stop)

    def run_on_device(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the device stage's thread, where model calls run (for warm-up: cuDNN keeps its
        plans per thread); from the warm-up function passed to :meth:`start`."""
        return self._device.run_here(fn)

    @property
    def depth(self) -> int:
        """Requests admitted and not finished, cancelled or timed out."""
        return self.admission.depth

    def submit(self, job: Job) -> None:
        """Admit a job or raise :class:`QueueFull` (at once, never blocking)."""
        depth = self.admission.admit(job, self.stuck)
        job.trace = tracing.capture()  # on the event loop, in the request's context
        job.request_id = current_request_id()
        job.emit({"event": "queued", "position": depth})
        self._inbox.put(job)

    def cancel(self, job: Job, reason: str) -> None:
        """Drop ``job`` (any thread): its slot is freed now, its work stops before the next model call."""
        job.cancel(reason)
        self.admission.release(job)

    def wait_estimate(self, priority: int = 1) -> float:
        """Seconds until the admitted work that runs before a new job of ``priority`` is done."""
        return self.admission.wait_estimate(priority)

    @property
    def seconds_per_unit(self) -> float:
        """Measured worker seconds per work unit (model passes and the host work between them)."""
        return self.rate.seconds_per_unit

    @property
    def stuck(self) -> str | None:
        """Why the worker counts as stuck (a job it holds is past deadline + grace), or None."""
        return self.watchdog.stuck

    def stop(self, grace_s: float) -> None:
        """Stop accepting, let in-flight jobs finish within ``grace_s``, then drop the rest
        (before the next model call, or the next checkpoint of a plan's host work)."""
        self.admission.close()
        deadline = time.monotonic() + grace_s
        while self.depth > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=10)

    # -- watchdog thread -------------------------------------------------------------------
    def _fail_late(self, job: Job, why: str) -> None:
        self.metrics.rejections.labels("stuck").inc()
        job.cancel("stuck")
        self.admission.release(job)
        job.finish(error=JobStuck(f"the worker was stuck on this request {self.watchdog.grace:g} s past its deadline"))

    def _tick(self) -> None:
        """Every 0.25 s: readiness follows whether the worker is stuck, and a long model call's busy time is booked."""
        self.metrics.set_health(worker=self.stuck is None)
        self._book_running()

    def _book_running(self) -> None:
        """Book the wall time of the call the device is on, once it has run :data:`BOOK_RUNNING_AFTER_S`: a stalled device
        reads as busy while it stalls, not all at once when the call ends. Its end books the rest (:meth:`_book_busy`)."""
        front = self._device.on_device()
        if front is None:
            return
        call, since = front
        ran = time.monotonic() - since
        with self._busy_lock:
            if ran > BOOK_RUNNING_AFTER_S and not call.busy_closed and ran > call.busy_booked:
                self.metrics.book_busy(ran - call.busy_booked)
                call.busy_booked = ran

    def _book_busy(self, call: Call) -> None:
        """The call ended: book its device time less what was booked while it ran (never less than 0)."""
        with self._busy_lock:
            call.busy_closed = True
            self.metrics.book_busy(max(0.0, call.device_seconds - call.busy_booked))

    # -- worker thread ---------------------------------------------------------------------
    def _run(self) -> None:
        name_os_thread(self._thread.name)
        try:
            if self._warm_up is not None:
                self._warm_up()
        except BaseException as err:  # noqa: BLE001 - handed to start(), which raises it on its caller's thread
            self._warm_up_error = err
            return
        finally:
            self._warmed.set()
        log.info("worker started on %s (device stage depth %d)", self.device, self._device.depth)
        while not self._stop.is_set():
            try:
                self._take_new(block=not self._active and not self._calls)
                self._drop_late()
                self._checkpoints()
                launched = False
                while self._device.has_room and (call := self._launch_next()) is not None:
                    self._calls.append(call)
                    launched = True
                self._mark_busy()
                if self._calls:
                    self._complete(self._calls.popleft())
                elif not launched and self._active:
                    time.sleep(0.001)  # nothing to run yet (cannot happen with jobs that have rows): do not spin hot
            except Exception:  # noqa: BLE001 - the worker loop must never die
                log.exception("worker loop failed; failing the requests of its calls and continuing")
                self._fail_calls()
        for call in self._calls:
            self._device.wait(call, timeout=10)
        self._calls.clear()
        self._device.stop()
        self.watchdog.clear()
        for job in self._active + self._drain():
            job.cancel(SHUTDOWN_REASON)
            self._close(job, JobCancelled(SHUTDOWN_REASON, SHUTTING_DOWN))
        self._active.clear()
        log.info("worker stopped")

    def _drain(self) -> list[Job]:
        jobs = []
        while True:
            try:
                jobs.append(self._inbox.get_nowait())
            except queue.Empty:
                return jobs

    def _take_new(self, block: bool) -> None:
        if block:
            try:
                first = self._inbox.get(timeout=0.1)
            except queue.Empty:
                return
            self._start(first)
            if self.batch_wait > 0:
                time.sleep(self.batch_wait)  # let concurrent requests join this call
        for job in self._drain():
            self._start(job)

    def _start(self, job: Job) -> None:
        job.started = time.monotonic()
        if self._dropped(job):  # cancelled or late while queued: costs nothing
            self._close_dropped(job)
            return
        self._active.append(job)
        self.watchdog.mark(job.started, (job,))
        try:
            if self._step(job, None):
                job.emit({"event": "started", "queued_ms": round((job.started - job.enqueued) * 1000, 1)})
        finally:
            self.watchdog.clear()

    def _dropped(self, job: Job) -> bool:
        """True once the job was cancelled, is past its deadline or the worker stops (its reason set)."""
        if job.cancel_reason is None:
            if self._stop.is_set():
                job.cancel(SHUTDOWN_REASON)
            elif time.monotonic() > job.deadline:
                job.cancel("deadline")
        return job.cancel_reason is not None

    def _drop_late(self) -> None:
        for job in list(self._active):
            if job.in_flight == 0 and self._dropped(job):  # one with rows in a call is closed when the call is booked
                self._active.remove(job)
                self._close_dropped(job)

    def _checkpoints(self) -> None:
        """Advance the jobs whose step needs no model call (a plan's checkpoint between host steps)."""
        for job in list(self._active):
            if job.in_flight == 0 and job.step_answered and job in self._active:
                self.watchdog.mark(time.monotonic(), (job,))
                try:
                    self._advance(job)
                finally:
                    self.watchdog.clear()

    def _launch_next(self) -> Call | None:
        """Gather the next call's inputs here and hand it to the device stage (None: nothing to run)."""
        selected = self.scheduler.select(self._active, calls_in_flight=bool(self._calls))
        if selected is None:
            return None
        model_name, grad, work = selected.model, selected.grad, selected.work
        owners = [(job, qi, a, b) for job, rows in work for qi, a, b in rows]
        queries = [job.part(qi, a, b) for job, qi, a, b in owners]
        for job, _ in work:
            job.in_flight += 1
        prepared = prepare_call(queries, [(i, 0, q.n) for i, q in enumerate(queries)], grad, self.shapes[model_name])
        call = Call(self.models[model_name], prepared, graphs=self.shapes[model_name].graphs, owner=(model_name, work, owners, queries),
                    host_logits=any(q.full for q in queries))
        self.metrics.batch_requests.observe(len(work))
        self._device.submit(call)
        return call

    def _book_idle(self, no_work: float, host: float) -> None:
        """An idle gap of the device, split by what it waited for (:func:`app.worker.device.split_gap`)."""
        self.metrics.book_idle(no_work, host)

    def _mark_busy(self) -> None:
        """What the watchdog sees: the jobs of every call on the device, since the oldest was handed over."""
        if self._calls:
            jobs = tuple(dict.fromkeys(job for call in self._calls for job, _ in call.owner[1]))
            self.watchdog.mark(self._calls[0].submitted, jobs)

    def _complete(self, call: Call) -> None:
        """Wait for ``call``, store its answers in its jobs and advance the jobs whose step it completed
        (while the next call runs on the device)."""
        while not self._device.wait(call, timeout=0.25):
            if self._stop.is_set() and call.started is None:
                break
        self._mark_busy()
        model_name, work, owners, queries = call.owner
        for job, _ in work:
            job.in_flight -= 1
        prepared = call.prepared
        units = 0.0
        if call.error is not None or call.out is None:
            with self._busy_lock:
                call.busy_closed = True  # what ran of it stays booked; its requests' evaluation alone books its own
            if call.error is not None and not isinstance(call.error, torch.cuda.OutOfMemoryError):
                log.warning("a model call for %d jobs failed (%s); retrying each alone", len(work), call.error)
            units = self._evaluate_isolated(self.models[model_name], work)
            self._device.skip_next_gap()  # that time was the device's (busy), not a gap before the next call
        else:
            self.stats.record(prepared.size, prepared.grad)
            self.shapes[model_name].note(prepared.size, prepared.n, prepared.grad)
            self._book_busy(call)
            self.metrics.batch_images.observe(prepared.size)
            if tracing.enabled() and call.started is not None and call.ended is not None:
                for job, _ in work:
                    job.trace_calls.append((call.started, call.ended, prepared.size))
            self.metrics.model_called(model_name)
            self.metrics.call_rows.labels(model_name, "real").inc(prepared.n)
            self.metrics.call_rows.labels(model_name, "padding").inc(prepared.size - prepared.n)
            booked: list[Answer | None] = [None] * len(queries)
            book_call(prepared, queries, booked, call.out, call.top1)
            for (job, qi, a, b), ans in zip(owners, booked_answers(queries, booked), strict=True):
                if job.cancel_reason is None:
                    job.store(qi, a, b, ans)
                    job.done_units += row_units(b - a, prepared.grad)
            units = row_units(prepared.n, prepared.grad)
        self.metrics.after_call(model_name, self.shapes[model_name].unwarmed_calls)
        for job, _ in work:
            if job not in self._active or job.in_flight:
                continue  # failed in this call, or has rows in a later one
            if self._dropped(job):
                self._active.remove(job)
                self._close_dropped(job)
            elif job.step_answered:
                self.watchdog.mark(time.monotonic(), (job,))
                self._advance(job)
        self.watchdog.clear()
        now = time.monotonic()
        self.rate.measure(now - max(self._last_booked, call.submitted), units)
        self._last_booked = now
        self.metrics.sample_device_memory(self.device)

    def _evaluate_isolated(self, model: Model, work: list[tuple[Job, list[tuple[int, int, int]]]]) -> float:
        """Evaluate ``work`` on this thread (after its call failed), each job alone, so only the
        failing one gets the error; a CUDA out-of-memory error halves the call first."""
        units = 0.0
        for job, rows in work:
            if job not in self._active:
                continue
            try:
                units += self._evaluate(model, [(job, rows)])
            except Exception as err:  # noqa: BLE001
                self._active.remove(job)
                self._close(job, err)
        return units

    def _evaluate(self, model: Model, work: list[tuple[Job, list[tuple[int, int, int]]]]) -> float:
        """Answer the rows of ``work`` here and store them in their jobs; returns the work units done."""
        batch = min(self.max_batch_images, getattr(model, "max_batch", None) or self.max_batch_images)
        shapes = self.shapes[work[0][0].model]
        while True:
            before = (len(self.stats.call_sizes), self.stats.forward_images, self.stats.backward_images)
            called = time.perf_counter()
            if self._marks is not None:
                self._marks.call(True)
            try:
                # eagerly: the device stage may be replaying the same CUDA graphs behind (calls launched after the one
                # that failed), and a graph's inputs are buffers of its own, which this thread's stream would overwrite
                answered = answer_rows(model, work, batch, self.stats, skip=self._dropped, shapes=shapes, graphs=False)
                if self.device.type == "cuda":  # the calls are queued without waits; busy time ends when their results are in
                    torch.cuda.synchronize(self.device)
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                if batch == 1:
                    raise
                batch = max(1, batch // 2)
                log.warning("CUDA out of memory: retrying with %d images per call", batch)
            finally:
                self.metrics.book_busy(time.perf_counter() - called)  # model calls, results back on the host
                if self._marks is not None:
                    self._marks.call(False)
                for size in self.stats.call_sizes[before[0]:]:
                    self.metrics.batch_images.observe(size)
                self.metrics.model_called(work[0][0].model, len(self.stats.call_sizes) - before[0])
        for job, qi, a, b, q, ans in answered:
            if job.cancel_reason is None:  # a dropped job's answers may be incomplete
                job.store(qi, a, b, ans)
                job.done_units += row_units(b - a, q.grad)
        return work_units(self.stats.forward_images - before[1], self.stats.backward_images - before[2])

    def _step(self, job: Job, answers: list[Answer] | None) -> bool:
        """Send the answers to the job's plan; close it when it returns or raises. True if it goes on."""
        try:
            if job.advance(answers):
                return True
            self._active.remove(job)
            self._close(job, result=job.result)
        except Exception as err:  # noqa: BLE001 - the plan's error fails its own request only
            self._active.remove(job)
            self._close(job, err)
        return False

    def _advance(self, job: Job) -> None:
        job.rounds += 1
        done = _labels(job) or job.done_label
        if self._step(job, job.step_answers()):
            if job.pending:
                job.emit({"event": "progress", "round": job.rounds, "done": done, "next": _labels(job), "points": job.rows})
                job.done_label = ""
            else:  # a checkpoint: report the step when the plan next asks for points
                job.done_label = done

    def _close_dropped(self, job: Job) -> None:
        reason = job.cancel_reason or SHUTDOWN_REASON
        if not job.watchdog_failed:
            self.metrics.rejections.labels(reason).inc()
        self._close(job, JobCancelled(reason, SHUTTING_DOWN if reason == SHUTDOWN_REASON else None))

    def _fail_calls(self) -> None:
        """After an unexpected error in the loop: wait for the calls on the device and fail their jobs."""
        err = RuntimeError("the worker failed while running this request's model calls")
        calls, self._calls = list(self._calls), deque()
        for call in calls:
            self._device.wait(call, timeout=30)
            for job, _ in call.owner[1]:
                job.in_flight = 0
                if job in self._active:
                    self._active.remove(job)
                    self._close(job, err)
        self.watchdog.clear()

    def _close(self, job: Job, error: BaseException | None = None, result: object = None) -> None:
        job.finished = time.monotonic()
        if job.started is not None:
            self.metrics.job_seconds.labels(job.kind).observe(job.finished - job.started)
        try:
            job.plan.close()
        except Exception:  # noqa: BLE001 - a plan that fails to close still gets its answer
            log.warning("job %d: its plan failed to close", job.id, exc_info=True)
        if job.trace is not None:
            tracing.record_job(job.trace, job.kind, job.model, job.enqueued, job.started, job.finished, job.trace_calls,
                               None if error is None else type(error).__name__)
        job.finish(result, error)
        self.admission.release(job)


def _labels(job: Job) -> str:
    return ", ".join(dict.fromkeys(q.label for q in job.pending or [] if q.label))
