"""A job is one request's plan plus what the worker needs to drive and answer it."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from idg_core.types import Plan, Query

_ids = itertools.count(1)


class JobCancelled(Exception):
    """The job was dropped: its client went away, its deadline passed, or the server shuts down."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(eq=False)
class Job:
    """One request in the worker. ``priority`` 0 (predict) runs before 1 (attribute)."""

    model: str
    plan: Plan
    kind: str
    deadline: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    priority: int = 1
    on_event: Callable[[dict[str, Any]], None] | None = None
    id: int = field(default_factory=lambda: next(_ids))
    enqueued: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    pending: list[Query] | None = None
    rounds: int = 0
    cancel_reason: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def rows(self) -> int:
        return sum(q.n for q in self.pending or [])

    def cancel(self, reason: str) -> None:
        """Ask the worker to drop this job (safe from any thread)."""
        with self._lock:
            self.cancel_reason = self.cancel_reason or reason

    def emit(self, event: dict[str, Any]) -> None:
        """Send a progress event to the request's event loop (from the worker thread)."""
        if self.on_event is not None:
            self.loop.call_soon_threadsafe(self.on_event, event)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Resolve the request's future from the worker thread, once."""

        def _set() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        self.loop.call_soon_threadsafe(_set)
