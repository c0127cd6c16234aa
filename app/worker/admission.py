"""Admission: which requests the worker takes, and how long a refused one should wait (``Retry-After``).

Admission is bounded twice: ``max_queue`` attributions (and background work) and, apart,
``max_predict_queue`` predictions, so a burst of attributions cannot lock ``/predict`` out. A request's
slot is freed the moment it ends, is cancelled or times out. ``Retry-After`` is the work admitted ahead
(estimated in work units before each job starts) times the measured seconds per
unit (:class:`RateEstimate`). Thread-safe: ``admit`` runs on the event loop, ``release`` on any thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from app.monitoring.prometheus import Metrics
from app.worker.jobs import SHUTDOWN_REASON, Job

PRIOR_SECONDS_PER_UNIT = 0.01
"""Seconds per work unit assumed before any round was measured (weighted as ``PRIOR_UNITS``)."""
PRIOR_UNITS = 20.0
RATE_WINDOW_S = 30.0
"""The measured rate weighs the last ~30 s of worker time."""


class QueueFull(Exception):
    """The worker already holds as many requests of this kind as it admits (or cannot take any)."""

    def __init__(self, retry_after: int, message: str | None = None, reason: str = "queue_full") -> None:
        super().__init__(message or f"the service is busy, retry in {retry_after} s")
        self.retry_after = retry_after
        self.reason = reason


class RateEstimate:
    """Measured worker seconds per work unit (model passes and the host work between them), the last
    ~``RATE_WINDOW_S`` seconds weighed most, starting from a prior."""

    def __init__(self) -> None:
        self._seconds = 0.0  # worker seconds and work units of recent rounds, decayed together
        self._units = 0.0

    @property
    def seconds_per_unit(self) -> float:
        return (self._seconds + PRIOR_SECONDS_PER_UNIT * PRIOR_UNITS) / (self._units + PRIOR_UNITS)

    def measure(self, seconds: float, units: float) -> None:
        """Fold one round into the estimate (host-only rounds add time, no units)."""
        decay = math.exp(-seconds / RATE_WINDOW_S)
        self._seconds = self._seconds * decay + seconds
        self._units = self._units * decay + units


class Admission:
    """The requests admitted and not yet finished (their slots), and the rules for taking a new one."""

    def __init__(self, metrics: Metrics, *, max_queue: int, max_predict_queue: int, stall_wait_s: float,
                 rate: RateEstimate | None = None, on_holds: Callable[[bool], None] | None = None) -> None:
        self.metrics = metrics
        self.on_holds = on_holds
        """Called with True when the first request is admitted after none was, False when the last is released."""
        self.max_queue = max_queue
        self.max_predict_queue = max_predict_queue
        self.stall_wait_s = stall_wait_s
        """Retry-After while the worker is stuck (the watchdog's grace)."""
        self.rate = rate or RateEstimate()
        self._held: set[Job] = set()  # admitted, slot not yet freed
        self._lock = threading.Lock()
        self._accepting = True
        self._held_since: float | None = None

    @property
    def depth(self) -> int:
        """Requests admitted and not finished, cancelled or timed out."""
        return len(self._held)

    @property
    def held_since(self) -> float | None:
        """Since when (``time.monotonic``) at least one request has been admitted without a break; None: none is."""
        return self._held_since

    def admit(self, job: Job, stuck: str | None = None) -> int:
        """Take ``job``'s slot and return the depth, or raise :class:`QueueFull` (at once, never blocking):
        the server stops, the worker is ``stuck``, or this kind's queue is full."""
        with self._lock:
            if not self._accepting:
                raise QueueFull(retry_after=5, reason=SHUTDOWN_REASON)
            if stuck is not None:
                wait = max(1, math.ceil(self.stall_wait_s))
                raise QueueFull(wait, f"the service is stalled on another request, retry in {wait} s", reason="stalled")
            predict = job.priority == 0
            limit = self.max_predict_queue if predict else self.max_queue
            if sum((j.priority == 0) == predict for j in self._held) >= limit:
                raise QueueFull(retry_after=max(1, math.ceil(self._wait_locked(job.priority))))
            self._held.add(job)
            depth = len(self._held)
            if depth == 1:
                self._held_since = time.monotonic()
                if self.on_holds is not None:
                    self.on_holds(True)
        self.metrics.queue_depth.set(depth)
        return depth

    def release(self, job: Job) -> None:
        """Free the job's slot, once (from any thread)."""
        with self._lock:
            if job not in self._held:
                return
            self._held.discard(job)
            depth = len(self._held)
            if depth == 0:
                self._held_since = None
                if self.on_holds is not None:
                    self.on_holds(False)
        self.metrics.queue_depth.set(depth)

    def close(self) -> None:
        """Take no new requests (shutdown)."""
        with self._lock:
            self._accepting = False

    def wait_estimate(self, priority: int = 1) -> float:
        """Seconds until the admitted work that runs before a new job of ``priority`` is done."""
        with self._lock:
            return self._wait_locked(priority)

    def _wait_locked(self, priority: int) -> float:
        units = sum(j.remaining_units for j in self._held if j.priority <= priority)
        return units * self.rate.seconds_per_unit
