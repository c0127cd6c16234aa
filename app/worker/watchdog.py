"""The watchdog: a thread that fails a job the worker still holds ``grace_s`` past its deadline, so its
client gets a 504 while the worker is stuck on it; the worker counts as stuck (readiness 503, new
requests refused) until that model call or plan step returns."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from app.worker.jobs import Job

log = logging.getLogger(__name__)


class Watchdog:
    """Watches what the worker is busy with (``busy``: since when, and the jobs of the calls or the plan
    step it runs), set by the worker thread and read here and by the event loop."""

    def __init__(self, grace_s: float, on_late: Callable[[Job, str], None], on_tick: Callable[[], None] | None = None) -> None:
        self.grace = grace_s
        self.on_late = on_late
        """Called (on the watchdog's thread) once per job found late, with why the worker is stuck."""
        self.on_tick = on_tick
        """Called (on the watchdog's thread) at every look, every 0.25 s: what must follow the worker while it is busy."""
        self.busy: tuple[float, tuple[Job, ...]] | None = None
        self._thread = threading.Thread(target=self._watch, name="idg-watchdog", daemon=True)
        self._stop: threading.Event | None = None

    def mark(self, since: float, jobs: Sequence[Job]) -> None:
        self.busy = (since, tuple(jobs))

    def clear(self) -> None:
        self.busy = None

    @property
    def stuck(self) -> str | None:
        """Why the worker counts as stuck (a job it holds is past deadline + grace), or None."""
        busy = self.busy
        if busy is None:
            return None
        now = time.monotonic()
        late = [j for j in busy[1] if now > j.deadline + self.grace]
        if not late:
            return None
        job = min(late, key=lambda j: j.deadline)
        return (f"the worker has been on one model call or plan step for {now - busy[0]:.0f} s, "
                f"{now - job.deadline:.0f} s past the deadline of request {job.id} ({job.kind})")

    def start(self, stop: threading.Event) -> None:
        """Watch every 0.25 s until ``stop`` is set."""
        self._stop = stop
        self._thread.start()

    def _watch(self) -> None:
        assert self._stop is not None
        while not self._stop.wait(0.25):
            if self.on_tick is not None:
                try:
                    self.on_tick()
                except Exception:  # noqa: BLE001 - the watchdog must go on watching
                    log.exception("watchdog: its tick failed")
            why = self.stuck
            busy = self.busy
            if why is None or busy is None:
                continue
            for job in busy[1]:
                if time.monotonic() > job.deadline + self.grace and not job.watchdog_failed:
                    job.watchdog_failed = True
                    log.error("watchdog: %s; failing it (readiness 503 until the worker returns)", why)
                    self.on_late(job, why)
