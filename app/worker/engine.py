"""The worker: one thread owns the device, takes jobs from bounded queues and drives their plans,
pooling the path points of many requests into shared model calls.

Each round is one model call: the jobs of one model in order (``/predict`` jobs first, then the
oldest) give rows of the kind the first of them needs next (forward-only or with a gradient), up
to ``min(max_batch_images, max_round_images)`` in all; a step with more rows goes on in the next
rounds, and a plan gets its answers once its step is complete. A job left out of a round because
it needs the other kind decides the kind of the next one (see :meth:`Worker._next_kind`), so the
kinds take turns: a newer request's forward pass waits one round behind an older request's run
of gradient steps (Guided IG, IG), not until that request ends. So a ``/predict`` waits for at most
the model call in flight, and the deadline is checked before every call: a request past it (or
cancelled) leaves the device within one call, the others' answers unaffected. A failed call is
retried job by job, so only the request that fails gets the error; a CUDA out-of-memory error
splits the call first.

Admission is bounded twice: ``max_queue`` attributions and, apart, ``max_predict_queue``
predictions, so a burst of attributions cannot lock ``/predict`` out. A request's slot is freed
the moment it ends, is cancelled or times out. ``Retry-After`` is the work admitted ahead
(estimated in work units before each job starts) times the measured seconds per unit. A watchdog
thread fails a job the worker still holds ``watchdog_grace_s`` past its deadline, and the worker
reports itself stuck (readiness 503) until that round returns.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from app.core.prometheus import Metrics
from app.worker.device import Call, DeviceStage, name_os_thread
from app.worker.jobs import Job, JobCancelled, JobStuck
from idg_core.call_shapes import CallShapes
from idg_core.evaluator import CallStats, answer_rows, book_call, empty_answers, prepare_call
from idg_core.types import Answer, Model

log = logging.getLogger(__name__)
T = TypeVar("T")

GRAD_UNITS = 3
"""Work units of an image with a gradient; a forward-only image is 1 (a forward and backward
pass cost about three forwards; 3.8 measured for ResNet-101 on an H100)."""
PRIOR_SECONDS_PER_UNIT = 0.01
"""Seconds per work unit assumed before any round was measured (weighted as ``PRIOR_UNITS``)."""
PRIOR_UNITS = 20.0
RATE_WINDOW_S = 30.0
"""The measured rate weighs the last ~30 s of worker time."""
SHUTTING_DOWN = "the server is shutting down"
BACKGROUND = 2
"""Priority of background work (durable jobs' images): a call of only such rows is not queued behind a call
that holds a request's rows, so the request's next step goes first (at the cost of a short device gap)."""


def work_units(forward: int, backward: int) -> float:
    """Work units of ``forward`` images through the model, ``backward`` of them with a gradient."""
    return float(forward + (GRAD_UNITS - 1) * backward)


class QueueFull(Exception):
    """The worker already holds as many requests of this kind as it admits (or cannot take any)."""

    def __init__(self, retry_after: int, message: str | None = None, reason: str = "queue_full") -> None:
        super().__init__(message or f"the service is busy, retry in {retry_after} s")
        self.retry_after = retry_after
        self.reason = reason


class Worker:
    """Owns the models on ``device``; ``submit``, ``cancel``, ``wait_estimate`` and ``stuck`` are
    called from the event loop, everything else runs on the worker's own thread."""

    def __init__(
        self, models: Mapping[str, Model], device: torch.device, metrics: Metrics, *, max_batch_images: int,
        max_round_images: int, batch_wait_ms: float, max_queue: int, max_predict_queue: int = 16,
        watchdog_grace_s: float = 10.0, shapes: Mapping[str, CallShapes] | None = None, pipeline_depth: int = 2,
        on_device_event: Callable[[str, int], None] | None = None,
    ) -> None:
        self.models = dict(models)
        self.device = device
        self.metrics = metrics
        self.max_batch_images = max_batch_images
        self.max_round_images = max(max_round_images, 1)
        self.call_images = max(1, min(max_batch_images, max_round_images))
        self.batch_wait = batch_wait_ms / 1000
        self.max_queue = max_queue
        self.max_predict_queue = max_predict_queue
        self.watchdog_grace = watchdog_grace_s
        self.stats = CallStats()
        self.shapes = {name: (shapes or {}).get(name) or CallShapes() for name in self.models}
        """Each model's call sizes (:mod:`idg_core.call_shapes`): fixed and warmed, or any."""
        self.pipeline_depth = max(1, pipeline_depth)
        self._on_device_event = on_device_event
        self._device: DeviceStage
        self._calls: deque[Call] = deque()  # handed to the device stage, not yet booked, oldest first
        self._last_booked = 0.0
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._active: list[Job] = []
        self._held: set[Job] = set()  # admitted, slot not yet freed
        self._lock = threading.Lock()
        self._accepting = True
        self._stop = threading.Event()
        self._busy: tuple[float, tuple[Job, ...]] | None = None  # (since, jobs) of the round being run
        self._last_model: str | None = None  # the model of the last round: rounds go round-robin between models
        self._rate_seconds = 0.0  # worker seconds and work units of recent rounds, decayed together
        self._rate_units = 0.0
        self._warm_up: Callable[[], None] | None = None
        self._warm_up_error: BaseException | None = None
        self._warmed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idg-worker", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="idg-watchdog", daemon=True)

    # -- event-loop side -------------------------------------------------------------------
    def start(self, warm_up: Callable[[], None] | None = None) -> None:
        """Start the worker thread and the watchdog. ``warm_up``, if given, runs first on the worker's own
        thread, where the requests will run (its malloc arena, thread-local caches), and this returns only
        once it has; if it raises, the worker does not start and the exception is raised here."""
        self._warm_up = warm_up
        self._device = DeviceStage(self.device, self.pipeline_depth, on_event=self._on_device_event)
        self._thread.start()
        self._warmed.wait()
        if self._warm_up_error is not None:
            self._thread.join()
            self._device.stop()
            raise self._warm_up_error
        self._watchdog.start()

    def run_on_device(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the device stage's thread, where model calls run (for warm-up: cuDNN keeps its
        plans per thread); from the warm-up function passed to :meth:`start`."""
        return self._device.run_here(fn)

    @property
    def depth(self) -> int:
        """Requests admitted and not finished, cancelled or timed out."""
        return len(self._held)

    def submit(self, job: Job) -> None:
        """Admit a job or raise :class:`QueueFull` (at once, never blocking)."""
        stuck = self.stuck
        with self._lock:
            if not self._accepting:
                raise QueueFull(retry_after=5, reason="shutting_down")
            if stuck is not None:
                wait = max(1, math.ceil(self.watchdog_grace))
                raise QueueFull(wait, f"the service is stalled on another request, retry in {wait} s", reason="stalled")
            predict = job.priority == 0
            limit = self.max_predict_queue if predict else self.max_queue
            if sum((j.priority == 0) == predict for j in self._held) >= limit:
                raise QueueFull(retry_after=max(1, math.ceil(self._wait_locked(job.priority))))
            self._held.add(job)
            depth = len(self._held)
        self.metrics.queue_depth.set(depth)
        job.emit({"event": "queued", "position": depth})
        self._inbox.put(job)

    def cancel(self, job: Job, reason: str) -> None:
        """Drop ``job`` (any thread): its slot is freed now, its work stops before the next model call."""
        job.cancel(reason)
        self._release(job)

    def wait_estimate(self, priority: int = 1) -> float:
        """Seconds until the admitted work that runs before a new job of ``priority`` is done."""
        with self._lock:
            return self._wait_locked(priority)

    def _wait_locked(self, priority: int) -> float:
        units = sum(j.remaining_units for j in self._held if j.priority <= priority)
        return units * self.seconds_per_unit

    @property
    def seconds_per_unit(self) -> float:
        """Measured worker seconds per work unit (model passes and the host work between them)."""
        return (self._rate_seconds + PRIOR_SECONDS_PER_UNIT * PRIOR_UNITS) / (self._rate_units + PRIOR_UNITS)

    @property
    def stuck(self) -> str | None:
        """Why the worker counts as stuck (a job it holds is past deadline + grace), or None."""
        busy = self._busy
        if busy is None:
            return None
        now = time.monotonic()
        late = [j for j in busy[1] if now > j.deadline + self.watchdog_grace]
        if not late:
            return None
        job = min(late, key=lambda j: j.deadline)
        return (f"the worker has been on one model call or plan step for {now - busy[0]:.0f} s, "
                f"{now - job.deadline:.0f} s past the deadline of request {job.id} ({job.kind})")

    def stop(self, grace_s: float) -> None:
        """Stop accepting, let in-flight jobs finish within ``grace_s``, then drop the rest
        (before the next model call, or the next checkpoint of a plan's host work)."""
        with self._lock:
            self._accepting = False
        deadline = time.monotonic() + grace_s
        while self.depth > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=10)

    def _release(self, job: Job) -> None:
        """Free the job's slot, once (from any thread)."""
        with self._lock:
            if job not in self._held:
                return
            self._held.discard(job)
            depth = len(self._held)
        self.metrics.queue_depth.set(depth)

    # -- watchdog thread -------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            why = self.stuck
            busy = self._busy
            if why is None or busy is None:
                continue
            for job in busy[1]:
                if time.monotonic() > job.deadline + self.watchdog_grace and not job.watchdog_failed:
                    job.watchdog_failed = True
                    log.error("watchdog: %s; failing it (readiness 503 until the worker returns)", why)
                    self.metrics.rejections.labels("stuck").inc()
                    job.cancel("stuck")
                    self._release(job)
                    job.finish(error=JobStuck(f"the worker was stuck on this request {self.watchdog_grace:g} s past its deadline"))

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
        self._busy = None
        for job in self._active + self._drain():
            job.cancel(SHUTTING_DOWN)
            self._close(job, JobCancelled(SHUTTING_DOWN))
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
        self._busy = (job.started, (job,))
        try:
            if self._step(job, None):
                job.emit({"event": "started", "queued_ms": round((job.started - job.enqueued) * 1000, 1)})
        finally:
            self._busy = None

    def _dropped(self, job: Job) -> bool:
        """True once the job was cancelled, is past its deadline or the worker stops (its reason set)."""
        if job.cancel_reason is None:
            if self._stop.is_set():
                job.cancel(SHUTTING_DOWN)
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
                self._busy = (time.monotonic(), (job,))
                try:
                    self._advance(job)
                finally:
                    self._busy = None

    def _select_call(self) -> tuple[str, bool, list[tuple[Job, list[tuple[int, int, int]]]]] | None:
        """The next model call: its model, kind (gradient or not) and the rows each job gives it."""
        waiting = [j for j in self._active if j.rows and j.cancel_reason is None]
        if not waiting:
            return None
        if (self._calls and min(j.priority for j in waiting) >= BACKGROUND
                and any(j.priority < BACKGROUND and j.in_flight for j in self._active)):
            return None  # a request waits on a call in flight: its next step must not queue behind background work
        ordered = sorted(waiting, key=lambda j: (j.priority, j.enqueued))
        model = self._next_model(ordered)
        mine = [j for j in ordered if j.model == model]
        grad = self._next_kind(mine)
        limit = min(self.call_images, getattr(self.models[model], "max_batch", None) or self.call_images)
        shapes = self.shapes[model]
        if shapes.largest is not None:
            limit = min(limit, shapes.largest)
        available = sum(_ready_rows(j, grad) for j in mine)
        budget = min(limit, shapes.fill(min(available, limit)))
        chosen: list[tuple[Job, list[tuple[int, int, int]]]] = []
        for job in mine:
            if job.next_grad != grad:
                job.passed_over += 1  # the next call is of its kind (at its priority)
            elif budget > 0:
                job.passed_over = 0
                rows = job.take(budget, grad)
                budget -= sum(b - a for _, a, b in rows)
                chosen.append((job, rows))
        return model, grad, chosen

    @staticmethod
    def _next_kind(jobs: list[Job]) -> bool:
        """Whether this call's call takes gradients: the kind the first job (in order) with rows needs
        next, unless a job at its priority was left out of a call for needing the other kind; then
        the kind of the first such job. Without the turn, a job whose next rows are of the other
        kind would wait for as long as the jobs before it keep needing theirs: a Guided IG request
        arriving while another runs its 400 gradient steps would wait for all 400 before its
        forward prediction pass (and then share their calls, one row each)."""
        waiting = [j for j in jobs if j.rows]
        if not waiting:
            return False
        top = waiting[0].priority
        passed = next((j for j in waiting if j.priority == top and j.passed_over), waiting[0])
        return passed.next_grad

    def _next_model(self, ordered: list[Job]) -> str:
        """Round-robin between the models with work at the most urgent priority, so a model with a long
        queue (a slow ViT) takes every other call, not every call, from another (a small CNN)."""
        top = ordered[0].priority
        waiting = {j.model for j in ordered if j.priority == top}
        names = list(self.models)
        start = names.index(self._last_model) + 1 if self._last_model in names else 0
        model = next(n for n in names[start:] + names[:start] if n in waiting)
        self._last_model = model
        return model

    def _launch_next(self) -> Call | None:
        """Gather the next call's inputs here and hand it to the device stage (None: nothing to run)."""
        selected = self._select_call()
        if selected is None:
            return None
        model_name, grad, work = selected
        owners = [(job, qi, a, b) for job, rows in work for qi, a, b in rows]
        queries = [job.part(qi, a, b) for job, qi, a, b in owners]
        for job, _ in work:
            job.in_flight += 1
        prepared = prepare_call(queries, [(i, 0, q.n) for i, q in enumerate(queries)], grad, self.shapes[model_name])
        call = Call(self.models[model_name], prepared, graphs=self.shapes[model_name].graphs, owner=(model_name, work, owners, queries))
        self.metrics.batch_requests.observe(len(work))
        self._device.submit(call)
        return call

    def _mark_busy(self) -> None:
        """What the watchdog sees: the jobs of every call on the device, since the oldest was handed over."""
        if self._calls:
            jobs = tuple(dict.fromkeys(job for call in self._calls for job, _ in call.owner[1]))
            self._busy = (self._calls[0].submitted, jobs)

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
            if call.error is not None and not isinstance(call.error, torch.cuda.OutOfMemoryError):
                log.warning("a model call for %d jobs failed (%s); retrying each alone", len(work), call.error)
            units = self._evaluate_isolated(self.models[model_name], work)
        else:
            self.stats.record(prepared.size, prepared.grad)
            self.shapes[model_name].note(prepared.size, prepared.n, prepared.grad)
            self.metrics.device_busy.inc(call.device_seconds)
            self.metrics.batch_images.observe(prepared.size)
            self.metrics.model_calls.labels(model_name).inc()
            self.metrics.call_rows.labels(model_name, "real").inc(prepared.n)
            self.metrics.call_rows.labels(model_name, "padding").inc(prepared.size - prepared.n)
            answers = empty_answers(queries)
            book_call(prepared, queries, answers, call.out)
            for (job, qi, a, b), ans in zip(owners, answers, strict=True):
                if job.cancel_reason is None:
                    job.store(qi, a, b, ans)
                    job.done_units += (b - a) * (GRAD_UNITS if prepared.grad else 1)
            units = work_units(prepared.n, prepared.n if prepared.grad else 0)
        self.metrics.unwarmed_calls.labels(model_name).set(self.shapes[model_name].unwarmed_calls)
        for job, _ in work:
            if job not in self._active or job.in_flight:
                continue  # failed in this call, or has rows in a later one
            if self._dropped(job):
                self._active.remove(job)
                self._close_dropped(job)
            elif job.step_answered:
                self._busy = (time.monotonic(), (job,))
                self._advance(job)
        self._busy = None
        now = time.monotonic()
        self._measure(now - max(self._last_booked, call.submitted), units)
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
            try:
                answered = answer_rows(model, work, batch, self.stats, skip=self._dropped, shapes=shapes)
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
                self.metrics.device_busy.inc(time.perf_counter() - called)  # model calls, results back on the host
                for size in self.stats.call_sizes[before[0]:]:
                    self.metrics.batch_images.observe(size)
                self.metrics.model_calls.labels(work[0][0].model).inc(len(self.stats.call_sizes) - before[0])
        for job, qi, a, b, q, ans in answered:
            if job.cancel_reason is None:  # a dropped job's answers may be incomplete
                job.store(qi, a, b, ans)
                job.done_units += (b - a) * (GRAD_UNITS if q.grad else 1)
        return work_units(self.stats.forward_images - before[1], self.stats.backward_images - before[2])

    def _measure(self, seconds: float, units: float) -> None:
        """Fold one round into the measured seconds per unit (host-only rounds add time, no units)."""
        decay = math.exp(-seconds / RATE_WINDOW_S)
        self._rate_seconds = self._rate_seconds * decay + seconds
        self._rate_units = self._rate_units * decay + units

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
        reason = job.cancel_reason or SHUTTING_DOWN
        if not job.watchdog_failed:
            self.metrics.rejections.labels(reason).inc()
        self._close(job, JobCancelled(reason))

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
        self._busy = None

    def _close(self, job: Job, error: BaseException | None = None, result: object = None) -> None:
        job.finished = time.monotonic()
        if job.started is not None:
            self.metrics.job_seconds.labels(job.kind).observe(job.finished - job.started)
        try:
            job.plan.close()
        except Exception:  # noqa: BLE001 - a plan that fails to close still gets its answer
            log.warning("job %d: its plan failed to close", job.id, exc_info=True)
        job.finish(result, error)
        self._release(job)


def _labels(job: Job) -> str:
    return ", ".join(dict.fromkeys(q.label for q in job.pending or [] if q.label))


def _ready_rows(job: Job, grad: bool) -> int:
    """Rows of the job's step not yet taken that one call of kind ``grad`` could take (those before
    the first row of the other kind)."""
    count = pos = 0
    for q in job.pending or []:
        start = max(job.taken - pos, 0)
        pos += q.n
        if start >= q.n:
            continue
        if q.grad != grad:
            break
        count += q.n - start
    return count
