"""A job is one request's plan plus what the worker needs to drive and answer it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from idg_core.types import Answer, Query

_ids = itertools.count(1)


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
class Job:
    """One request in the worker. ``priority`` 0 (predict) runs before 1 (attribute).

    The worker drives the plan a step at a time: ``pending`` are the queries of the current step;
    each model call takes some of their rows (``take``), the worker stores what the model answered
    (``store``) and sends the answers to the plan once every row is in."""

    model: str
    plan: Generator[list[Query], list[Answer], Any]
    """Any plan: a method's (an AttributionResult), a prediction's, an explanation's."""
    kind: str
    deadline: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    priority: int = 1
    on_event: Callable[[dict[str, Any]], None] | None = None
    cost: float = 1.0
    """Work units the whole job may need (a forward image is 1, see ``engine.work_units``)."""
    id: int = field(default_factory=lambda: next(_ids))
    enqueued: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    pending: list[Query] | None = None
    answers: list[Answer | None] = field(default_factory=list)
    taken: int = 0
    """Rows of ``pending`` already taken into a round."""
    done_units: float = 0.0
    passed_over: int = 0
    """Rounds in a row this job had rows ready but was left out for needing the other kind."""
    rounds: int = 0
    done_label: str = ""
    cancel_reason: str | None = None
    watchdog_failed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def rows(self) -> int:
        """Points of the current step not yet taken into a round."""
        return sum(q.n for q in self.pending or []) - self.taken

    @property
    def remaining_units(self) -> float:
        return max(self.cost - self.done_units, 1.0)

    def begin_step(self, pending: list[Query]) -> None:
        self.pending = pending
        self.answers = [_empty_answer(q) if q.n == 0 else None for q in pending]
        self.taken = 0

    @property
    def next_grad(self) -> bool:
        """Whether the next row not yet taken needs a gradient."""
        pos = 0
        for q in self.pending or []:
            pos += q.n
            if pos > self.taken:
                return q.grad
        return False

    def take(self, budget: int, grad: bool) -> list[tuple[int, int, int]]:
        """Up to ``budget`` rows of the step not taken yet, in order and while they are of the kind
        ``grad``, as (query index, start, stop)."""
        out, pos = [], 0
        for qi, q in enumerate(self.pending or []):
            start = max(self.taken - pos, 0)
            pos += q.n
            if start >= q.n:
                continue
            if budget == 0 or q.grad != grad:
                break
            stop = min(q.n, start + budget)
            out.append((qi, start, stop))
            budget -= stop - start
            self.taken += stop - start
        return out

    def part(self, qi: int, start: int, stop: int) -> Query:
        """Rows ``start:stop`` of pending query ``qi`` as a query of their own."""
        q = (self.pending or [])[qi]
        if start == 0 and stop == q.n:
            return q
        if q.direction is None:
            return replace(q, origin=q.origin[start:stop], alphas=q.alphas[start:stop])
        return replace(q, alphas=q.alphas[start:stop])

    def store(self, qi: int, start: int, stop: int, ans: Answer) -> None:
        """Keep the model's answer to rows ``start:stop`` of pending query ``qi``."""
        n = (self.pending or [])[qi].n
        if start == 0 and stop == n:
            self.answers[qi] = ans
            return
        full = self.answers[qi]
        if full is None:
            full = self.answers[qi] = Answer(
                ans.values.new_empty(n), None if ans.grads is None else ans.grads.new_empty((n, *ans.grads.shape[1:])),
                ans.top1.new_empty(n), None if ans.all_logits is None else ans.all_logits.new_empty((n, ans.all_logits.shape[1])),
            )
        full.values[start:stop] = ans.values
        full.top1[start:stop] = ans.top1
        if full.grads is not None and ans.grads is not None:
            full.grads[start:stop] = ans.grads
        if full.all_logits is not None and ans.all_logits is not None:
            full.all_logits[start:stop] = ans.all_logits

    @property
    def step_answered(self) -> bool:
        return self.rows == 0 and all(a is not None for a in self.answers)

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


def _empty_answer(q: Query) -> Answer:
    dev = q.origin.device
    grads = torch.empty((0, *q.origin.shape[-3:]), device=dev, dtype=q.origin.dtype) if q.grad else None
    return Answer(torch.empty(0, device=dev), grads, torch.empty(0, dtype=torch.long, device=dev))
