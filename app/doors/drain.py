"""Graceful shutdown of the app: drain, then answer what is left with a JSON 503.

``drain(app, grace_s)`` (called by ``app.server`` on SIGTERM, while the listening socket is still
open) flips the app into draining: readiness answers 503 and new work is refused with a JSON 503
``shutting_down`` (``app.api.deps.get_service``). Requests already in flight may finish for
``grace_s``; then the worker is stopped (it drops its remaining jobs, reason ``shutting_down``, which their requests answer as 503 with
the same message, :data:`app.core.errors.SHUTTING_DOWN`), and after a short settle whatever still runs (a slow
upload, a request stuck anywhere) is cancelled by :class:`DrainMiddleware`, which answers it with
a JSON 503 itself. Only then does uvicorn close the sockets.

Every door drains the same way, through :class:`Drain`'s public interface: each call runs inside :meth:`Drain.track`
(counted in flight, cancelled by :meth:`Drain.abort` once the grace is over), and a cancellation that
:meth:`Drain.absorb_abort` says was the drain's is answered by the door as its 503 ``shutting_down`` (HTTP:
:class:`DrainMiddleware`; gRPC: :mod:`app.api.oip_grpc`, UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.errors import SHUTTING_DOWN
from app.doors.asgi import HttpMiddleware, StartWatch, send_json_error

log = logging.getLogger(__name__)

SETTLE_S = 1.0  # after the grace, how long requests whose jobs the worker dropped get to answer themselves


class Drain:
    """The calls in flight over every door (counted and cancellable) and how far the drain has gone."""

    def __init__(self) -> None:
        self.active = 0
        self.aborted = False
        self.drained = False
        self.worker_stopper: threading.Thread | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @contextmanager
    def track(self) -> Iterator[asyncio.Task[Any] | None]:
        """Around one call of a door, run by the current task (which it yields): counted in :attr:`active` meanwhile, so
        the drain waits for it within its grace, and cancelled by :meth:`abort` if it still runs after."""
        task = asyncio.current_task()
        self.active += 1
        if task is not None:
            self._tasks.add(task)
        try:
            yield task
        finally:
            self.active -= 1
            if task is not None:
                self._tasks.discard(task)

    def absorb_abort(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether the cancellation ``task`` (a call inside :meth:`track`) got is the drain's (:meth:`abort`): if so it
        is taken back (``uncancel``) so that the door answers the call itself (503 ``shutting_down``); if not (the
        client went away, a deadline), the door lets it go on."""
        if not self.aborted or task is None:
            return False
        task.uncancel()
        return True

    def abort(self) -> int:
        """Cancel every call still in flight; its door answers each with 503 (:meth:`absorb_abort`)."""
        self.aborted = True
        for task in self._tasks:
            task.cancel()
        return len(self._tasks)


class DrainMiddleware(HttpMiddleware):
    """Counts the requests in flight; when the drain aborts one that has not started its answer,
    sends the JSON 503 itself (pure ASGI, so the body and disconnects pass untouched)."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        super().__init__(app)
        self.drain = drain

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = StartWatch(send)
        with self.drain.track() as task:
            try:
                await self.app(scope, receive, watch)
            except asyncio.CancelledError:
                if not self.drain.absorb_abort(task):
                    raise
                if not watch.started:  # a started answer cannot be replaced: uvicorn closes that connection
                    await _answer_503(send)


async def _answer_503(send: Send) -> None:
    await send_json_error(send, 503, SHUTTING_DOWN, "shutting_down", [(b"retry-after", b"5"), (b"connection", b"close")])


def start_draining(app: FastAPI) -> None:
    """Readiness 503 and new work refused from now on."""
    state = app.state
    state.ready = False
    state.draining = True
    state.metrics.set_ready(False)


async def drain(app: FastAPI, grace_s: float, *, settle_s: float = SETTLE_S, force: Callable[[], bool] = lambda: False) -> None:
    """Drain ``app`` (built by :func:`app.main.create_app`) within about ``grace_s + settle_s``;
    ``force()`` true (a second Ctrl+C) skips the waiting."""
    state = app.state
    tracker: Drain = state.drain
    start_draining(app)
    began = time.monotonic()
    log.info("draining: readiness 503, new work refused; %d request(s) in flight may finish within %g s", tracker.active, grace_s)
    await _wait_idle(tracker, began + grace_s, force)
    service = getattr(state, "service", None)
    if service is not None and tracker.worker_stopper is None:
        # a daemon thread: the worker ends its current round, then drops what is left with
        # JobCancelled("the server is shutting down"), which Service.run answers with a 503
        tracker.worker_stopper = threading.Thread(target=service.worker.stop, args=(0.0,), name="idg-worker-stop", daemon=True)
        tracker.worker_stopper.start()
    if tracker.active:
        log.info("grace of %g s over: %d request(s) still in flight get 503", grace_s, tracker.active)
        await _wait_idle(tracker, time.monotonic() + settle_s, force)
    if tracker.active:
        log.info("answering %d request(s) still in flight with 503", tracker.abort())
        await _wait_idle(tracker, time.monotonic() + 0.5, force)  # they send their answers
    tracker.drained = True
    log.info("drained in %.1f s", time.monotonic() - began)


async def _wait_idle(tracker: Drain, deadline: float, force: Callable[[], bool]) -> None:
    while tracker.active and time.monotonic() < deadline and not force():
        await asyncio.sleep(0.05)


async def wait_thread(thread: threading.Thread | None, limit_s: float) -> None:
    """Wait up to ``limit_s`` for ``thread`` without blocking the loop (or an executor thread)."""
    deadline = time.monotonic() + limit_s
    while thread is not None and thread.is_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
