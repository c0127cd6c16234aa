"""The glue between routes and the worker: check a request, submit its plan, wait honestly, and
answer. What a request runs is decided in :mod:`app.planning`, drawn in :mod:`app.render`; the
plans themselves are :mod:`idg_core.explain`'s."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from app.core.config import Settings
from app.core.errors import ApiError
from app.core.images import load_input
from app.core.prometheus import Metrics
from app.explain_if import Facts
from app.planning import AttributePlan, plan_attribute, plan_explain_if
from app.render import attribute_response, method_label, render
from app.schemas import (
    AttributeCommon,
    AttributeResponse,
    ClassScore,
    PredictExplainParams,
    PredictResponse,
    Timings,
)
from app.worker.engine import QueueFull, Worker
from app.worker.jobs import Job, JobCancelled
from idg_core.explain import PlanOf, predict_plan
from idg_core.models import ImageClassifier
from idg_core.models.speed import model_precision

log = logging.getLogger(__name__)
T = TypeVar("T")
IsDisconnected = Callable[[], Awaitable[bool]]
OnEvent = Callable[[dict[str, Any]], None]


@dataclass
class Outcome(Generic[T]):
    value: T
    queued_ms: float
    compute_ms: float


class Service:
    """Everything a route needs: settings, models, the worker and the metrics."""

    def __init__(
        self, settings: Settings, models: dict[str, ImageClassifier], worker: Worker, metrics: Metrics, device: torch.device,
    ) -> None:
        self.settings = settings
        self.models = models
        self.worker = worker
        self.metrics = metrics
        self.device = device

    def model(self, name: str | None) -> tuple[str, ImageClassifier]:
        key = name or next(iter(self.models))
        if key not in self.models:
            raise ApiError(404, f"unknown model {key!r}; loaded: {', '.join(self.models)}", code="unknown_model")
        return key, self.models[key]

    def check_top_k(self, k: int) -> None:
        if k > self.settings.max_top_k:
            raise ApiError(422, f"top_k must be <= {self.settings.max_top_k}, got {k}", code="invalid_parameter")

    def top_k(self, model: ImageClassifier, probs: Tensor, k: int) -> list[ClassScore]:
        values, idx = probs.topk(min(k, probs.numel()))
        return [ClassScore(index=int(i), name=model.class_names[int(i)], probability=float(v)) for v, i in zip(values, idx, strict=True)]

    def check_attribute(self, params: AttributeCommon) -> tuple[str, ImageClassifier, AttributePlan]:
        """Every check of an attribution request that needs no image: 4xx before any work is queued
        or any stream opens. Returns the model and what the request will run."""
        name, model = self.model(params.model)
        self.check_top_k(params.top_k)
        return name, model, plan_attribute(self.settings, params, model)

    async def predict(
        self, data: bytes, params: PredictExplainParams, received: float, is_disconnected: IsDisconnected | None = None,
    ) -> PredictResponse:
        """Decode, queue, wait: the top classes, and with ``explain_if`` the explanation of the
        predicted class when the condition holds (its parameters checked before any work)."""
        name, model = self.model(params.model)
        self.check_top_k(params.top_k)
        condition, explain = plan_explain_if(params)
        if explain is not None:
            self.check_attribute(explain)
        x = await load_input(data, model, self.settings, self.device)
        outcome = await self.run(is_disconnected, name, predict_plan(x), "predict", priority=0)
        held = None if condition is None else condition(Facts.of(outcome.value))
        self.metrics.predictions.labels(name, {None: "none", True: "held", False: "not_held"}[held]).inc()
        explanation = None
        if held and explain is not None:
            explanation = await self.explain(x, explain, received, is_disconnected, probs=outcome.value)
            self.metrics.explanations.labels(name).inc()
        return PredictResponse(
            model=name,
            top_k=self.top_k(model, outcome.value, params.top_k),
            timings=Timings(queued_ms=outcome.queued_ms, compute_ms=outcome.compute_ms, total_ms=(time.perf_counter() - received) * 1000),
            explained=held,
            explanation=explanation,
        )

    async def attribute(
        self, data: bytes, params: AttributeCommon, received: float, is_disconnected: IsDisconnected | None = None,
        on_event: OnEvent | None = None,
    ) -> AttributeResponse:
        """Check, decode, queue, wait and render one attribution; raises :class:`ApiError`."""
        _, model, _ = self.check_attribute(params)
        x = await load_input(data, model, self.settings, self.device)
        return await self.explain(x, params, received, is_disconnected, on_event)

    async def explain(
        self, x: Tensor, params: AttributeCommon, received: float, is_disconnected: IsDisconnected | None = None,
        on_event: OnEvent | None = None, probs: Tensor | None = None,
    ) -> AttributeResponse:
        """:meth:`attribute` of a decoded input ``x``; with ``probs`` (from /predict) no prediction pass."""
        name, model, planned = self.check_attribute(params)
        plan = planned.plan(x, params, probs)
        outcome = await self.run(is_disconnected, name, plan, "attribute", priority=1, on_event=on_event, cost=planned.cost(x, probs))
        found = outcome.value
        for metric, value in found.scores.items():
            self.metrics.faithfulness.labels(name, method_label(params), metric).observe(value)
        rendered_at = time.perf_counter()
        images = await asyncio.to_thread(render, x, found.result, params)
        timings = Timings(queued_ms=outcome.queued_ms, compute_ms=outcome.compute_ms, render_ms=(time.perf_counter() - rendered_at) * 1000,
                          total_ms=(time.perf_counter() - received) * 1000)
        target = ClassScore(index=found.target, name=model.class_names[found.target], probability=float(found.probs[found.target]))
        return attribute_response(name, params, planned, found, self.top_k(model, found.probs, params.top_k), target,
                                  model_precision(model, self.device), timings, images)

    async def run(
        self, is_disconnected: IsDisconnected | None, model: str, plan: PlanOf[T], kind: str, *, priority: int,
        on_event: OnEvent | None = None, cost: float = 1.0,
    ) -> Outcome[T]:
        """Queue a plan (``cost``: its work units at most) and wait for it within the deadline;
        503 when full, 504 when late. A late or abandoned job frees its slot at once and stops
        costing before the worker's next model call."""
        loop = asyncio.get_running_loop()
        timeout = self.settings.request_timeout_s
        job = Job(model, plan, kind, time.monotonic() + timeout, loop, loop.create_future(), priority, on_event, cost)
        try:
            self.worker.submit(job)
        except QueueFull as err:
            plan.close()
            self.metrics.rejections.labels(err.reason).inc()
            raise ApiError(503, str(err), headers={"Retry-After": str(err.retry_after)}, code="busy") from err
        watcher = asyncio.create_task(self._watch(is_disconnected, job)) if is_disconnected is not None else None
        late = f"the request did not finish within its deadline of {timeout:g} s"
        try:
            value = await asyncio.wait_for(asyncio.shield(job.future), timeout=max(0.0, job.deadline - time.monotonic()))
        except TimeoutError as err:
            self.worker.cancel(job, "deadline")
            raise ApiError(504, late, code="deadline") from err
        except JobCancelled as err:
            if err.reason in ("deadline", "stuck"):
                raise ApiError(504, late if err.reason == "deadline" else str(err), code="deadline") from err
            raise ApiError(503, f"the request was dropped: {err.reason}", headers={"Retry-After": "5"}, code="dropped") from err
        # No ValueError -> 422 here: the parameters were checked before the job was queued (app.planning
        # runs the methods' validation), so whatever the running plan raises is this request's 500.
        except Exception as err:  # noqa: BLE001 - the model failed on this request only
            log.error("job %d (%s) failed: %s", job.id, kind, err)
            raise ApiError(500, f"the model failed on this request: {err}", code="model_error") from err
        finally:
            if watcher is not None:
                watcher.cancel()
            if not job.future.done():
                self.worker.cancel(job, "client_disconnected")
                job.future.add_done_callback(_consume)  # its error, when the worker ends it, goes unread
        started = job.started or job.enqueued
        return Outcome(value, (started - job.enqueued) * 1000, ((job.finished or time.monotonic()) - started) * 1000)

    async def _watch(self, is_disconnected: IsDisconnected, job: Job) -> None:
        """Drop the job when its client goes away."""
        while not job.future.done():
            if await is_disconnected():
                log.info("client of job %d went away; dropping it", job.id)
                self.worker.cancel(job, "client_disconnected")
                return
            await asyncio.sleep(0.2)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
