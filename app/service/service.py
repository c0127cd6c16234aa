"""The glue between routes and the worker: check a request, submit its plan, wait honestly, and
answer. What a request runs is decided in :mod:`app.service.planning`, drawn in :mod:`app.service.render`; the
plans themselves are :mod:`idg_core.explain`'s."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

from app.core.config import Settings
from app.core.deadline import deadline_of
from app.core.errors import ApiError
from app.core.image_threads import in_image_thread
from app.core.images import load_input
from app.core.prometheus import Metrics
from app.schemas import AttributeCommon, AttributeParams, AttributeResponse, PredictExplainParams, PredictResponse, Timings
from app.service.explain_if import Facts
from app.service.planning import AttributePlan, check_top_k, plan_attribute, plan_explain_if
from app.service.render import NonFiniteAttribution, attribute_response, method_label, render, top_classes
from app.worker.engine import Worker
from app.worker.waiting import OnEvent, Outcome, Submission, UntilDisconnected, Waiter, submit_and_wait
from idg_core.explain import predict_plan
from idg_core.models import ImageClassifier
from idg_core.models.speed import model_precision

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Checked:
    """A checked attribution request: the model's name, the model, and what the request runs."""

    name: str
    model: ImageClassifier
    planned: AttributePlan


@dataclass(frozen=True)
class RequestContext:
    """Who a request's work runs for: when it arrived (``received``, its ``time.perf_counter()``; None: its
    deadline counts from when its work is queued), its time limit (``timeout``; None: the service's request
    timeout), its client (``until_disconnected`` returns once it went away) and where its progress events go."""

    received: float | None = None
    timeout: float | None = None
    until_disconnected: UntilDisconnected | None = None
    on_event: OnEvent | None = None


WARM_UP_PHOTO = Path(__file__).parents[1] / "static" / "samples" / "n01580077_jay.jpg"
WARM_UP_TIMEOUT_S = 600.0


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

    def check_attribute(self, params: AttributeCommon) -> Checked:
        """Every check of an attribution request that needs no image: 4xx before any work is queued
        or any stream opens. Returns the model and what the request will run."""
        name, model = self.model(params.model)
        check_top_k(self.settings, params.top_k)
        return Checked(name, model, plan_attribute(self.settings, params, model))

    async def predict(
        self, data: bytes, params: PredictExplainParams, received: float, until_disconnected: UntilDisconnected | None = None,
    ) -> PredictResponse:
        """Decode, queue, wait: the top classes, and with ``explain_if`` the explanation of the
        predicted class when the condition holds (its parameters checked before any work)."""
        name, model = self.model(params.model)
        check_top_k(self.settings, params.top_k)
        condition, explain = plan_explain_if(params)
        checked = None if explain is None else self.check_attribute(explain)
        x = await load_input(data, model, self.settings, self.device, deadline_of(received, self.settings.request_timeout_s))
        request = RequestContext(received, until_disconnected=until_disconnected)
        outcome = await self.run(Submission(name, predict_plan(x), "predict", priority=0), request)
        held = None if condition is None else condition(Facts.of(outcome.value))
        self.metrics.predictions.labels(name, {None: "none", True: "held", False: "not_held"}[held]).inc()
        explanation = None
        if held and explain is not None and checked is not None:
            explanation = await self.explain(x, explain, checked, request, probs=outcome.value)
            self.metrics.explanations.labels(name).inc()
        return PredictResponse(
            model=name,
            top_k=top_classes(model, outcome.value, params.top_k),
            timings=Timings(queued_ms=outcome.queued_ms, compute_ms=outcome.compute_ms, total_ms=(time.perf_counter() - received) * 1000),
            explained=held,
            explanation=explanation,
        )

    async def attribute(
        self, data: bytes, params: AttributeCommon, received: float, until_disconnected: UntilDisconnected | None = None,
        on_event: OnEvent | None = None, checked: Checked | None = None, timeout: float | None = None, priority: int = 1,
    ) -> AttributeResponse:
        """Check (unless the route did: ``checked``), decode, queue, wait and render one attribution;
        raises :class:`ApiError`. ``priority``: 1 for requests, 2 for the images of jobs (app.jobs)."""
        checked = checked or self.check_attribute(params)
        x = await load_input(data, checked.model, self.settings, self.device,
                             deadline_of(received, timeout or self.settings.request_timeout_s))
        request = RequestContext(received, timeout, until_disconnected, on_event)
        return await self.explain(x, params, checked, request, priority=priority)

    async def explain(
        self, x: Tensor, params: AttributeCommon, checked: Checked, request: RequestContext, *, probs: Tensor | None = None,
        priority: int = 1,
    ) -> AttributeResponse:
        """:meth:`attribute` of a decoded input ``x``, checked; with ``probs`` (from /predict) no prediction pass."""
        name, model, planned = checked.name, checked.model, checked.planned
        plan = planned.plan(x, params, probs)
        outcome = await self.run(Submission(name, plan, "attribute", priority, planned.cost(x, probs)), request)
        found = outcome.value
        for metric, value in found.scores.items():
            self.metrics.faithfulness.labels(name, method_label(params), metric).observe(value)
        rendered_at = time.perf_counter()
        try:
            images = await in_image_thread(render, x, found.result, params)
        except NonFiniteAttribution as err:
            raise ApiError(500, str(err), code="model_error") from err
        timings = Timings(queued_ms=outcome.queued_ms, compute_ms=outcome.compute_ms, render_ms=(time.perf_counter() - rendered_at) * 1000,
                          total_ms=(time.perf_counter() - (rendered_at if request.received is None else request.received)) * 1000)
        return attribute_response(name, model, params, planned, found, model_precision(model, self.device), timings, images)

    async def warm_up_requests(self) -> None:
        """One default attribution of a bundled photo per model through the whole path (decode, queue, the
        plan's host steps, render) before ready: the first request after ready then costs what the hundredth
        does, not the lazy first use of decoders, resizing and rendering (0.36 s of host time measured on
        this project's CPU before the first model call)."""
        data = WARM_UP_PHOTO.read_bytes()
        for name in self.models:
            started = time.perf_counter()
            try:  # not bound by the request deadline, and never a reason not to start: the models are warm already
                await self.attribute(data, AttributeParams.model_validate({"model": name}), started, timeout=WARM_UP_TIMEOUT_S)
            except Exception as err:  # noqa: BLE001 - a model that cannot explain this photo still serves (its errors are the requests')
                log.warning("warm-up request on %s failed (%s: %s); serving anyway", name, type(err).__name__, err)
                continue
            log.info("warm-up request on %s: %.0f ms", name, (time.perf_counter() - started) * 1000)

    async def run(self, work: Submission[T], request: RequestContext | None = None) -> Outcome[T]:
        """Submit ``work`` to the worker and wait for it within ``request``'s deadline (:func:`submit_and_wait`)."""
        request = request or RequestContext()
        timeout = request.timeout or self.settings.request_timeout_s
        deadline = None if request.received is None else deadline_of(request.received, timeout)
        waiter = Waiter(timeout, deadline, request.until_disconnected, request.on_event)
        return await submit_and_wait(self.worker, self.metrics, work, waiter)
