"""The one application call every door makes: a typed request (:mod:`app.service.calls`, built and checked here once)
and an image in; a prediction, an explanation, or a prediction then an explanation out, within the request's deadline
from its arrival. The doors (REST, the Open Inference Protocol, jobs) import neither the worker nor the image decoder;
the worker's refusals become :class:`ApiError` here, which each door words in its own form. What a request runs is
decided in :mod:`app.service.planning`, drawn in :mod:`app.service.render`; the plans themselves are
:mod:`idg_core.explain`'s."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from app.core.config import Settings
from app.core.deadline import past_deadline
from app.core.errors import SHUTTING_DOWN, ApiError, model_failure
from app.core.image_threads import in_image_thread
from app.core.images import load_input
from app.doors.request_id import current_request_id
from app.monitoring.prometheus import Metrics
from app.schemas import AttributeCommon, AttributeParams, AttributeResponse, PredictExplainParams, PredictParams, PredictResponse, Timings
from app.service.calls import (
    ATTRIBUTE_PRIORITY,
    PREDICT_PRIORITY,
    ExplainRequest,
    Image,
    OnEvent,
    PredictRequest,
    RequestContext,
    UntilDisconnected,
)
from app.service.explain_if import Facts, parse_condition
from app.service.planning import AttributePlan, check_top_k, plan_attribute, plan_explain_if
from app.service.render import NonFiniteAttribution, attribute_response, method_label, non_finite_message, render, top_classes
from app.service.stats import ModelStats
from app.service.visualization import check_visualization
from app.worker.engine import Worker
from app.worker.jobs import SHUTDOWN_REASON
from app.worker.waiting import Busy, Dropped, Failed, Late, Outcome, Refused, Submission, Waiter, submit_and_wait
from idg_core.explain import Explanation, predict_plan
from idg_core.types import to_device
from idg_models import ImageClassifier
from idg_models.speed import model_precision

log = logging.getLogger(__name__)
results_log = logging.getLogger("app.results")
T = TypeVar("T")


@dataclass(frozen=True)
class Checked:
    """A checked attribution request: the model's name, the model, and what the request runs."""

    name: str
    model: ImageClassifier
    planned: AttributePlan


@dataclass(frozen=True)
class Explained:
    """One image's explanation, before any rendering: the model's input ``x``, what was found, and where the time went."""

    x: Tensor
    found: Explanation
    queued_ms: float
    compute_ms: float


WARM_UP_PHOTO = Path(__file__).parents[1] / "static" / "samples" / "coffee.jpg"  # the page's thumbnail of samples/coffee.jpg
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
        self.stats = {name: ModelStats() for name in models}
        """Each model's submissions, succeeded and failed (Triton's statistics extension: ``GET /v2/models/stats``)."""

    def model(self, name: str | None) -> tuple[str, ImageClassifier]:
        key = name or next(iter(self.models))
        if key not in self.models:
            raise ApiError(404, f"unknown model {key!r}; loaded: {', '.join(self.models)}", code="unknown_model")
        return key, self.models[key]

    def context(self, received: float, *, timeout: float | None = None, until_disconnected: UntilDisconnected | None = None,
                on_event: OnEvent | None = None, priority: int | None = None) -> RequestContext:
        """The context of a request that arrived at ``received`` (its ``time.perf_counter()``); ``timeout``: the
        service's request timeout unless given."""
        return RequestContext(received, timeout or self.settings.request_timeout_s, until_disconnected, on_event, priority)

    def check_attribute(self, params: AttributeCommon) -> Checked:
        """Every check of an attribution request that needs no image: 4xx before any work is queued
        or any stream opens. Returns the model and what the request will run."""
        name, model = self.model(params.model)
        check_top_k(self.settings, params.top_k)
        check_visualization(params)
        return Checked(name, model, plan_attribute(self.settings, params, model))

    def explain_request(self, params: AttributeCommon, context: RequestContext) -> ExplainRequest:
        """The typed attribution request: checked once (422 and 404 here, before any image is read or work queued)."""
        checked = self.check_attribute(params)
        return ExplainRequest(checked.name, checked.model, params, checked.planned, context)

    def predict_request(self, params: PredictParams, context: RequestContext) -> PredictRequest:
        """The typed prediction request; with ``explain_if`` (/predict's fields) the explanation it runs when the
        condition holds, its parameters checked now."""
        name, model = self.model(params.model)
        check_top_k(self.settings, params.top_k)
        if not isinstance(params, PredictExplainParams):
            return PredictRequest(name, model, params.top_k, context)
        condition, explain = plan_explain_if(params)
        explained = None if explain is None else self.explain_request(explain, context)
        return PredictRequest(name, model, params.top_k, context, condition, explained)

    def explain_if_request(self, params: AttributeCommon, condition: str, context: RequestContext) -> PredictRequest:
        """Predict, then explain with ``params`` when ``condition`` (:mod:`app.service.explain_if`) holds (a job's images)."""
        try:
            parsed = parse_condition(condition)
        except ValueError as err:
            raise ApiError(422, str(err), code="invalid_parameter") from err
        explain = self.explain_request(params, context)
        return PredictRequest(explain.name, explain.model, params.top_k, context, parsed, explain)

    async def probabilities(self, request: PredictRequest, image: Image) -> Tensor:
        """Every class probability of one image (decoded within the request's deadline)."""
        x = await self._input(request.model, image, request.context)
        outcome = await self._classify(request.name, x, request.context)
        self.metrics.predictions.labels(request.name, "none").inc()
        return outcome.value

    async def predict(self, request: PredictRequest, image: Image) -> PredictResponse:
        """Decode, queue, wait: the top classes, and with a condition the explanation of the predicted class when
        it holds (predict-then-explain), all within the request's deadline."""
        x = await self._input(request.model, image, request.context)
        outcome = await self._classify(request.name, x, request.context)
        held = None if request.condition is None else request.condition(Facts.of(outcome.value))
        self.metrics.predictions.labels(request.name, {None: "none", True: "held", False: "not_held"}[held]).inc()
        explanation = None
        if held and request.explain is not None:
            explanation = await self._render(request.explain, await self._explain(request.explain, x, probs=outcome.value))
            self.metrics.explanations.labels(request.name).inc()
        return PredictResponse(
            model=request.name,
            top_k=top_classes(request.model, outcome.value, request.top_k),
            timings=Timings(queued_ms=outcome.queued_ms, compute_ms=outcome.compute_ms,
                            total_ms=(time.perf_counter() - request.context.received) * 1000),
            explained=held,
            explanation=explanation,
        )

    async def explanation(self, request: ExplainRequest, image: Image) -> Explained:
        """One image's explanation, not rendered (the Open Inference Protocol's tensors); a 500 ``model_error`` for
        an attribution that is not finite."""
        explained = await self._explain(request, await self._input(request.model, image, request.context))
        try:
            attr = await in_image_thread(self._on_host, request, explained.found)
        except NonFiniteAttribution as err:
            raise ApiError(500, str(err), code="model_error") from err
        explained.found.result.attributions = attr.unsqueeze(0)  # the host copy: the answer's encoding needs no second one
        return explained

    async def attribute(self, request: ExplainRequest, image: Image) -> AttributeResponse:
        """Decode, queue, wait and render one attribution (the /attribute answer)."""
        x = await self._input(request.model, image, request.context)
        return await self._render(request, await self._explain(request, x))

    async def _input(self, model: ImageClassifier, image: Image, context: RequestContext) -> Tensor:
        """The model's input: an encoded file decoded within the deadline, or the given pixels on the device."""
        if not isinstance(image, bytes):
            return to_device(image, self.device)
        try:
            return await load_input(image, model, self.settings, self.device, context.deadline(), context.timeout)
        except ApiError as err:
            if err.code == "deadline":  # past the deadline before any work was queued: counted as the worker counts its own
                self.metrics.rejections.labels("deadline").inc()
            raise

    async def _classify(self, name: str, x: Tensor, context: RequestContext) -> Outcome[Tensor]:
        outcome = await self.run(Submission(name, predict_plan(x), "predict", context.priority_of(PREDICT_PRIORITY)), context)
        self._observed(name, context, self.metrics.observe_prediction, outcome.value)  # the plan's probabilities: on the host
        return outcome

    async def _explain(self, request: ExplainRequest, x: Tensor, probs: Tensor | None = None) -> Explained:
        """Queue the plan of ``request`` on ``x`` (with ``probs`` known from a prediction: no prediction pass) and wait."""
        planned, context = request.planned, request.context
        plan = planned.plan(x, request.params, probs)
        priority = context.priority_of(ATTRIBUTE_PRIORITY)
        outcome = await self.run(Submission(request.name, plan, "attribute", priority, planned.cost(x, probs), planned.alone), context)
        found = outcome.value
        label = method_label(request.params, planned.steps_run)
        for metric, value in found.scores.items():
            self.metrics.faithfulness.labels(request.name, label, metric).observe(value)
        return Explained(x, found, outcome.queued_ms, outcome.compute_ms)

    async def _render(self, request: ExplainRequest, explained: Explained) -> AttributeResponse:
        rendered_at = time.perf_counter()
        try:
            images = await in_image_thread(self._rendered, request, explained)
        except NonFiniteAttribution as err:
            raise ApiError(500, str(err), code="model_error") from err
        now = time.perf_counter()
        timings = Timings(queued_ms=explained.queued_ms, compute_ms=explained.compute_ms, render_ms=(now - rendered_at) * 1000,
                          total_ms=(now - request.context.received) * 1000)
        return attribute_response(request.name, request.model, request.params, request.planned, explained.found,
                                  model_precision(request.model, self.device), timings, images)

    def _on_host(self, request: ExplainRequest, found: Explanation) -> Tensor:
        """``found``'s map copied to the host once (in an image thread: the copy waits for the device), checked finite
        (:class:`NonFiniteAttribution`) and observed for drift (never on the worker's thread, which feeds the device)."""
        attr = found.result.attributions[0].detach().float().cpu()
        if not bool(np.isfinite(attr.numpy()).all()):  # numpy's: 0.02 ms for a 224-pixel map, torch's 0.4 ms
            raise NonFiniteAttribution(non_finite_message(attr))
        self._observed(request.name, request.context, self.metrics.observe_explanation, attr, found.target, found.scores)
        return attr

    def _rendered(self, request: ExplainRequest, explained: Explained) -> dict[str, Any]:
        """The answer's images (:func:`render`) from the map's host copy (:meth:`_on_host`), with XRAI's regions where the map
        has them, in an image thread."""
        regions = explained.found.result.regions
        return render(explained.x, self._on_host(request, explained.found), request.params, regions[0] if regions else None)

    def _observed(self, name: str, context: RequestContext, observe: Callable[..., dict[str, object]], *args: Any) -> None:
        """``observe(name, *args)``, a drift metric (:class:`Metrics`), and its ``app.results`` line (IDG_LOG_PREDICTIONS);
        a metric that fails never costs the answer."""
        try:
            facts = observe(name, *args)
        except Exception:  # noqa: BLE001 - a metric never costs an answer
            log.warning("the drift metrics of a %s answer failed", name, exc_info=True)
            return
        if self.settings.log_predictions:
            fields = {"event": facts.get("event"), "model": name, **facts, "request_id": current_request_id(),
                      "ms": round((time.perf_counter() - context.received) * 1000, 1)}
            text = " ".join(f"{k}={v}" for k, v in fields.items() if k != "event" and v is not None)
            results_log.info("%s %s", fields["event"], text, extra={"fields": fields, "request_id": fields["request_id"]})

    async def warm_up_requests(self) -> None:
        """One default attribution of a bundled photo per model through the whole path (decode, queue, the
        plan's host steps, render) before ready: the first request after ready then costs what the hundredth
        does, not the lazy first use of decoders, resizing and rendering."""
        data = WARM_UP_PHOTO.read_bytes()
        for name in self.models:
            started = time.perf_counter()
            try:  # not bound by the request deadline, and never a reason not to start: the models are warm already
                request = self.explain_request(AttributeParams.model_validate({"model": name, "top_k": 1}),
                                               self.context(started, timeout=WARM_UP_TIMEOUT_S))
                await self.attribute(request, data)
            except Exception as err:  # noqa: BLE001 - a model that cannot explain this photo still serves (its errors are the requests')
                log.warning("warm-up request on %s failed (%s: %s); serving anyway", name, type(err).__name__, err)
                continue
            log.info("warm-up request on %s: %.0f ms", name, (time.perf_counter() - started) * 1000)

    async def run(self, work: Submission[T], context: RequestContext) -> Outcome[T]:
        """Submit ``work`` to the worker and wait for it within ``context``'s deadline (:func:`submit_and_wait`); the
        worker's refusals become the service's errors (:func:`refusal`)."""
        waiter = Waiter(context.timeout, context.deadline(), context.until_disconnected, context.on_event)
        stats = self.stats[work.model]
        try:
            outcome = await submit_and_wait(self.worker, self.metrics, work, waiter)
        except Refused as err:
            stats.failed(time.perf_counter() - context.received)
            raise refusal(err, context.timeout) from err
        stats.succeeded(time.perf_counter() - context.received, outcome.queued_ms / 1000, outcome.compute_ms / 1000)
        return outcome


def refusal(err: Refused, timeout: float) -> ApiError:
    """The service's error (status, code, sentence) for a refusal of the worker; each door words it in its own form."""
    if isinstance(err, Busy):
        return ApiError(503, str(err), headers={"Retry-After": str(err.retry_after)}, code="busy")
    if isinstance(err, Late):
        return past_deadline(timeout, err.detail)
    if isinstance(err, Dropped):
        message = SHUTTING_DOWN if err.reason == SHUTDOWN_REASON else str(err)
        return ApiError(503, message, headers={"Retry-After": "5"}, code="dropped")
    return ApiError(500, model_failure(err.error if isinstance(err, Failed) else err), code="model_error")
