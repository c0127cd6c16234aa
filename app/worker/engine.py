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
from collections.abc import Callable, Mapping

import torch

from app.core.prometheus import Metrics
from app.worker.jobs import Job, JobCancelled, JobStuck
from idg_core.evaluator import CallStats, answer_rows
from idg_core.types import Answer, Model

log = logging.getLogger(__name__)

GRAD_UNITS = 3
"""Work units of an image with a gradient; a forward-only image is 1 (a forward and backward
pass cost about three forwards; 3.8 measured for ResNet-101 on an H100)."""
PRIOR_SECONDS_PER_UNIT = 0.01
"""Seconds per work unit assumed before any round was measured (weighted as ``PRIOR_UNITS``)."""
PRIOR_UNITS = 20.0
RATE_WINDOW_S = 30.0
"""The measured rate weighs the last ~30 s of worker time."""
SHUTTING_DOWN = "the server is shutting down"


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
        watchdog_grace_s: float = 10.0,
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
        self._thread.start()
        self._warmed.wait()
        if self._warm_up_error is not None:
            self._thread.join()
            raise self._warm_up_error
        self._watchdog.start()

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
        try:
            if self._warm_up is not None:
                self._warm_up()
        except BaseException as err:  # noqa: BLE001 - handed to start(), which raises it on its caller's thread
            self._warm_up_error = err
            return
        finally:
            self._warmed.set()
        log.info("worker started on %s", self.device)
        while not self._stop.is_set():
            chosen: list[tuple[Job, list[tuple[int, int, int]]]] = []
            try:
                self._take_new(block=not self._active)
                self._drop_late()
                chosen = self._select_round()
                if chosen:
                    self._run_round(chosen)
            except Exception as err:  # noqa: BLE001 - the worker loop must never die
                log.exception("worker round failed; failing its requests and continuing")
                self._fail_round([job for job, _ in chosen], err)
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
                time.sleep(self.batch_wait)  # let concurrent requests join this round
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
            if self._dropped(job):
                self._active.remove(job)
                self._close_dropped(job)

    def _select_round(self) -> list[tuple[Job, list[tuple[int, int, int]]]]:
        """The jobs of this round (one model call) and the rows each gives (none: a checkpoint)."""
        if not self._active:
            return []
        ordered = sorted(self._active, key=lambda j: (j.priority, j.enqueued))
        model = self._next_model(ordered)
        grad = self._next_kind([j for j in ordered if j.model == model])
        chosen: list[tuple[Job, list[tuple[int, int, int]]]] = []
        budget = min(self.call_images, getattr(self.models[model], "max_batch", None) or self.call_images)
        for job in ordered:
            if job.model != model:
                continue
            if job.rows == 0:  # a checkpoint between host steps: advance it now
                chosen.append((job, []))
            elif job.next_grad != grad:
                job.passed_over += 1  # the next round is of its kind (at its priority)
            elif budget > 0:
                job.passed_over = 0
                rows = job.take(budget, grad)
                budget -= sum(b - a for _, a, b in rows)
                chosen.append((job, rows))
        return chosen

    @staticmethod
    def _next_kind(jobs: list[Job]) -> bool:
        """Whether this round's call takes gradients: the kind the first job (in order) with rows needs
        next, unless a job at its priority was left out of a round for needing the other kind; then
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
        queue (a slow ViT) takes every other round, not every round, from another (a small CNN)."""
        top = ordered[0].priority
        waiting = {j.model for j in ordered if j.priority == top}
        names = list(self.models)
        start = names.index(self._last_model) + 1 if self._last_model in names else 0
        model = next(n for n in names[start:] + names[:start] if n in waiting)
        self._last_model = model
        return model

    def _run_round(self, chosen: list[tuple[Job, list[tuple[int, int, int]]]]) -> None:
        began = time.monotonic()
        self._busy = (began, tuple(job for job, _ in chosen))
        units = 0.0
        try:
            work = [(job, rows) for job, rows in chosen if rows]
            if work:
                self.metrics.batch_requests.observe(len(work))
                units = self._evaluate_isolated(self.models[chosen[0][0].model], work)
            for job, _ in chosen:
                if job not in self._active:
                    continue  # failed in this round
                if self._dropped(job):
                    self._active.remove(job)
                    self._close_dropped(job)
                elif job.step_answered:
                    self._advance(job)
        finally:
            self._busy = None
        self._measure(time.monotonic() - began, units)
        self.metrics.sample_device_memory(self.device)

    def _evaluate_isolated(self, model: Model, work: list[tuple[Job, list[tuple[int, int, int]]]]) -> float:
        """Evaluate the round; if it fails, each job alone, so only the failing one gets the error."""
        try:
            return self._evaluate(model, work)
        except Exception:  # noqa: BLE001 - isolate the failing request(s)
            log.warning("a model call for %d jobs failed; retrying each alone", len(work), exc_info=True)
        units = 0.0
        for job, rows in work:
            try:
                units += self._evaluate(model, [(job, rows)])
            except Exception as err:  # noqa: BLE001
                self._active.remove(job)
                self._close(job, err)
        return units

    def _evaluate(self, model: Model, work: list[tuple[Job, list[tuple[int, int, int]]]]) -> float:
        """Answer the rows of ``work`` and store them in their jobs; returns the work units done."""
        batch = min(self.max_batch_images, getattr(model, "max_batch", None) or self.max_batch_images)
        while True:
            before = (len(self.stats.call_sizes), self.stats.forward_images, self.stats.backward_images)
            called = time.perf_counter()
            try:
                answered = answer_rows(model, work, batch, self.stats, skip=self._dropped)
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

    def _fail_round(self, jobs: list[Job], err: Exception) -> None:
        """After an unexpected error in the loop: fail the jobs of the round it left half done."""
        for job in jobs:
            if job in self._active:
                self._active.remove(job)
                self._close(job, err)

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
