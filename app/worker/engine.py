"""The worker: one thread owns the device, takes jobs from a bounded queue and drives their
plans in rounds, pooling the path points of many requests into shared model calls.

A round picks the jobs of one model (``/predict`` jobs first, then the oldest) until
``max_round_images`` points, evaluates all their pending queries with at most
``max_batch_images`` images per model call, and advances each plan. A failure in a round is
retried job by job, so only the request that fails gets the error; a CUDA out-of-memory error
halves the batch first.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Mapping

import torch

from app.core.metrics import Metrics
from app.worker.jobs import Job, JobCancelled
from idg_core.evaluator import EvalStats, evaluate
from idg_core.types import Answer, Model

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The worker already holds ``max_queue`` requests."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the service is busy, retry in {retry_after} s")
        self.retry_after = retry_after


class Worker:
    """Owns the models on ``device``; ``submit`` is called from the event loop, everything else
    runs on the worker's own thread."""

    def __init__(
        self, models: Mapping[str, Model], device: torch.device, metrics: Metrics, *, max_batch_images: int,
        max_round_images: int, batch_wait_ms: float, max_queue: int,
    ) -> None:
        self.models = dict(models)
        self.device = device
        self.metrics = metrics
        self.max_batch_images = max_batch_images
        self.max_round_images = max(max_round_images, 1)
        self.batch_wait = batch_wait_ms / 1000
        self.max_queue = max_queue
        self.stats = EvalStats()
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._active: list[Job] = []
        self._admitted = 0
        self._lock = threading.Lock()
        self._accepting = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idg-worker", daemon=True)
        self._job_seconds = 1.0

    # -- event-loop side -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def depth(self) -> int:
        return self._admitted

    def submit(self, job: Job) -> None:
        """Admit a job or raise :class:`QueueFull` (at once, never blocking)."""
        with self._lock:
            if not self._accepting:
                raise QueueFull(retry_after=5)
            if self._admitted >= self.max_queue:
                raise QueueFull(retry_after=max(1, math.ceil(self._job_seconds * self._admitted / 4)))
            self._admitted += 1
            self.metrics.queue_depth.set(self._admitted)
        job.emit({"event": "queued", "position": self._admitted})
        self._inbox.put(job)

    def stop(self, grace_s: float) -> None:
        """Stop accepting, let in-flight jobs finish within ``grace_s``, then drop the rest."""
        with self._lock:
            self._accepting = False
        deadline = time.monotonic() + grace_s
        while self._admitted > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=10)

    # -- worker thread ---------------------------------------------------------------------
    def _run(self) -> None:
        log.info("worker started on %s", self.device)
        while not self._stop.is_set():
            try:
                self._take_new(block=not self._active)
                round_jobs = self._select_round()
                if round_jobs:
                    self._run_round(round_jobs)
            except Exception:  # noqa: BLE001 - the worker loop must never die
                log.exception("worker round failed; continuing")
        for job in self._active + self._drain():
            self._close(job, JobCancelled("the server is shutting down"))
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
        self._active.append(job)
        if self._step(job, None):
            job.emit({"event": "started", "queued_ms": round((job.started - job.enqueued) * 1000, 1)})

    def _step(self, job: Job, answers: list[Answer] | None) -> bool:
        """Send the answers to the job's plan; close it when it returns or raises. True if it goes on."""
        try:
            job.pending = job.plan.send(answers)  # type: ignore[arg-type]
            return True
        except StopIteration as stop:
            self._active.remove(job)
            self._close(job, result=stop.value)
        except Exception as err:  # noqa: BLE001 - the plan's error fails its own request only
            self._active.remove(job)
            self._close(job, err)
        return False

    def _select_round(self) -> list[Job]:
        now = time.monotonic()
        for job in list(self._active):
            if job.cancel_reason is None and now > job.deadline:
                job.cancel("deadline")
            if job.cancel_reason is not None:
                self.metrics.rejections.labels(job.cancel_reason).inc()
                self._active.remove(job)
                self._close(job, JobCancelled(job.cancel_reason))
        if not self._active:
            return []
        ordered = sorted(self._active, key=lambda j: (j.priority, j.enqueued))
        model = ordered[0].model
        chosen, rows = [], 0
        for job in ordered:
            if job.model != model:
                continue
            if chosen and rows + job.rows > self.max_round_images:
                break
            chosen.append(job)
            rows += job.rows
        return chosen

    def _run_round(self, jobs: list[Job]) -> None:
        model = self.models[jobs[0].model]
        self.metrics.batch_requests.observe(len(jobs))
        try:
            answers = self._evaluate(model, jobs)
        except Exception:  # noqa: BLE001 - isolate the failing request(s)
            log.warning("a round of %d jobs failed; retrying each alone", len(jobs), exc_info=True)
            answers = {}
            for job in jobs:
                try:
                    answers.update(self._evaluate(model, [job]))
                except Exception as err:  # noqa: BLE001
                    self._active.remove(job)
                    self._close(job, err)
        for job in jobs:
            if job in answers:
                self._advance(job, answers[job])
        self.metrics.sample_device_memory(self.device)

    def _evaluate(self, model: Model, jobs: list[Job]) -> dict[Job, list[Answer]]:
        flat = [q for job in jobs for q in job.pending or []]
        batch = self.max_batch_images
        while True:
            before = len(self.stats.call_sizes)
            try:
                answers = evaluate(model, flat, batch, self.stats)
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                if batch == 1:
                    raise
                batch = max(1, batch // 2)
                log.warning("CUDA out of memory: retrying the round with %d images per call", batch)
            finally:
                for size in self.stats.call_sizes[before:]:
                    self.metrics.batch_images.observe(size)
                self.metrics.model_calls.labels(jobs[0].model).inc(len(self.stats.call_sizes) - before)
        out, pos = {}, 0
        for job in jobs:
            k = len(job.pending or [])
            out[job] = answers[pos : pos + k]
            pos += k
        return out

    def _advance(self, job: Job, answers: list[Answer]) -> None:
        job.rounds += 1
        done = ", ".join(dict.fromkeys(q.label for q in job.pending or [] if q.label))
        if self._step(job, answers):
            upcoming = ", ".join(dict.fromkeys(q.label for q in job.pending or [] if q.label))
            job.emit({"event": "progress", "round": job.rounds, "done": done, "next": upcoming, "points": job.rows})

    def _close(self, job: Job, error: BaseException | None = None, result: object = None) -> None:
        job.finished = time.monotonic()
        if job.started is not None:
            seconds = time.monotonic() - job.started
            self.metrics.job_seconds.labels(job.kind).observe(seconds)
            self._job_seconds = 0.8 * self._job_seconds + 0.2 * seconds
        job.plan.close()
        job.finish(result, error)
        with self._lock:
            self._admitted -= 1
            self.metrics.queue_depth.set(self._admitted)
