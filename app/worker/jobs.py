"""A job is one request's plan plus what the worker needs to drive and answer it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from idg_core.model_calls import PlanState
from idg_core.types import PlanOf

_ids = itertools.count(1)


SHUTDOWN_REASON = "shutting_down"
"""Why a job is dropped when the server stops (its message to the client: :data:`app.core.errors.SHUTTING_DOWN`)."""


class JobCancelled(Exception):
    """The job was dropped: its client went away, its deadline passed, or the server shuts down."""

    def __init__(self, reason: str, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason = reason


class JobStuck(JobCancelled):
    """The worker held this job far past its deadline (the watchdog failed it)."""

    def __init__(self, message: str) -> None:
        super().__init__("stuck", message)


@dataclass(eq=False)
class Job(PlanState):
    """One request in the worker: its plan's state (:class:`idg_core.model_calls.PlanState`: the
    current step's queries, the rows taken into rounds, the answers stored) and what the worker needs
    to schedule and answer it. ``priority`` 0 (predict) runs before 1 (attribute)."""

    model: str
    plan: PlanOf[Any]
    """Any plan: a method's (an AttributionResult), a prediction's, an explanation's."""
    kind: str
    deadline: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    priority: int = 1
    on_event: Callable[[dict[str, Any]], None] | None = None
    cost: float = 1.0
    """Work units the whole job may need (a forward image is 1: :mod:`idg_core.budget`)."""
    alone: bool = False
    """Its rows share no model call with another job's, and its calls are sized by its own rows: its answer is then
    the one it gets alone (a method that is not batch-invariant: :mod:`app.worker.scheduler`)."""
    served: int = 0
    """The scheduler's number of the last call that took its rows (jobs marked alone take turns by it)."""
    id: int = field(default_factory=lambda: next(_ids))
    enqueued: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    done_units: float = 0.0
    passed_over: int = 0
    """Rounds in a row this job had rows ready but was left out for needing the other kind."""
    rounds: int = 0
    done_label: str = ""
    cancel_reason: str | None = None
    watchdog_failed: bool = False
    request_id: str | None = None
    """The X-Request-ID of the request that submitted it (for its log lines)."""
    trace: Any = None
    """The trace context of the request that submitted it (app.doors.tracing; None with tracing off)."""
    trace_calls: list[tuple[float, float, int]] = field(default_factory=list)
    """With tracing: each model call that held its rows (began, ended, images)."""
    in_flight: int = 0
    """Model calls on the device that hold rows of this job (it is advanced only once none does)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        PlanState.__init__(self, self.plan)

    @property
    def remaining_units(self) -> float:
        return max(self.cost - self.done_units, 1.0)

    def cancel(self, reason: str) -> None:
        """Ask the worker to drop this job (safe from any thread); the first reason stays."""
        with self._lock:
            self.cancel_reason = self.cancel_reason or reason

    def emit(self, event: dict[str, Any]) -> None:
        """Send a progress event to the request's event loop (from the worker thread)."""
        if self.on_event is not None:
            self.loop.call_soon_threadsafe(self.on_event, event)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Resolve the request's future from any thread but the loop's, once."""

        def _set() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the request's event loop is closed: nobody waits for the answer
            self.loop.call_soon_threadsafe(_set)
