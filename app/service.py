"""The glue between routes and the worker: build plans, submit jobs, wait honestly, render."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from fastapi import Request
from PIL import Image
from torch import Tensor

from app.core.config import Settings
from app.core.errors import ApiError
from app.core.images import load_input
from app.core.metrics import Metrics
from app.schemas import AttributeCommon, AttributeResponse, ClassScore, Cost, Curve, Faithfulness, Timings
from app.worker.engine import QueueFull, Worker, work_units
from app.worker.jobs import Job, JobCancelled
from idg_core import METHODS, heatmap_png, overlay_png
from idg_core.faithfulness import faithfulness_plan, forward_cost, parse_metrics
from idg_core.methods import InvalidParameter, WorkBound
from idg_core.models import ImageClassifier
from idg_core.paths import resolve_baseline
from idg_core.postprocess import build_plan, postprocess_bound
from idg_core.postprocess.compose import check_postprocess
from idg_core.presets import preset_params
from idg_core.types import AttributionResult, Plan, Query

log = logging.getLogger(__name__)


def predict_plan(x: Tensor) -> Plan:
    """All class probabilities of one image ``x (C, H, W)``."""
    (ans,) = yield [Query.at(x.unsqueeze(0), 0, grad=False, output="logit", full=True, label="prediction")]
    assert ans.all_logits is not None
    return torch.softmax(ans.all_logits[0].float(), 0).cpu()


def attribute_plan(x: Tensor, baseline: Tensor, target: int | None, method: str, kwargs: dict[str, Any]) -> Plan:
    """Predict, pick the target (the predicted class by default), then run the method's plan."""
    probs = yield from predict_plan(x)
    chosen = int(probs.argmax()) if target is None else target
    result = yield from METHODS[method].plan(x, baseline, chosen, **kwargs)
    return probs, chosen, result


@dataclass(frozen=True)
class Extras:
    """What an attribution adds to its method: post-steps (IDGI, SmoothGrad) and the faithfulness score."""

    post: dict[str, Any]
    metrics: tuple[str, ...] = ()
    steps: int = 28
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)


def explain_plan(
    x: Tensor, baseline: Tensor, target: int | None, method: str, kwargs: dict[str, Any], extras: Extras, probs: Tensor | None = None,
) -> Plan:
    """:func:`attribute_plan` with post-steps and the faithfulness score, whose forward passes are
    queries like any other (they join the worker's shared model calls). With ``probs`` known (from
    /predict) the prediction pass is skipped. Returns ``(probs, target, result, scores)``."""
    if probs is None:
        probs = yield from predict_plan(x)
    chosen = int(probs.argmax()) if target is None else target
    result = yield from build_plan(method, x, baseline, chosen, **extras.post, **kwargs)
    scores: dict[str, float] = {}
    if extras.metrics:
        scores = yield from faithfulness_plan(x, result.attributions[0], int(probs.argmax()), metrics=extras.metrics,
                                              steps=extras.steps, mean=extras.mean, std=extras.std)
    return probs, chosen, result, scores


@dataclass
class Outcome:
    value: Any
    queued_ms: float
    compute_ms: float


class Service:
    """Everything a route needs: settings, models, the worker and the metrics."""

    def __init__(self, settings: Settings, models: dict[str, ImageClassifier], worker: Worker, metrics: Metrics, device: torch.device) -> None:
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

    def check_attribute(self, params: AttributeCommon) -> None:
        """Every check of an attribution request that needs no image (model, top_k, target, the
        method's parameters, post-steps, faithfulness options): :class:`ApiError` 4xx, before any work
        or any stream opens."""
        _, model = self.model(params.model)
        self.check_top_k(params.top_k)
        if params.target is not None and params.target >= model.num_classes:
            raise ApiError(422, f"target must be < {model.num_classes} (the model's classes), got {params.target}", code="invalid_parameter")
        self.work_bound(params.method, self.method_kwargs(params, model.num_classes))
        self.extras(params, model)

    def method_kwargs(self, params: AttributeCommon, num_classes: int) -> dict[str, Any]:
        """Every parameter the method runs with: the request's, over the preset's, over the
        method's defaults, validated by the method (422 naming what was wrong, or naming the
        method's parameters when the request gave one it does not take), within the service's bounds."""
        method = METHODS[params.method]
        given = params.method_values()
        foreign = [k for k in given if k not in method.params]
        if foreign:
            own = ", ".join(p.name for p in method.params if p.service)
            raise ApiError(422, f"{params.method} takes no parameter {foreign[0]!r}; its parameters are {own}", code="invalid_parameter")
        if "seed" in method.params:
            given["seed"] = params.seed
        if "num_classes" in method.params:
            given["num_classes"] = num_classes
        values = preset_params(params.method, params.preset, **given)
        for name in ("steps", "probe_steps", "max_iter"):
            if name in values and isinstance(values[name], int) and values[name] > self.settings.max_steps:
                raise ApiError(422, f"{name} must be <= {self.settings.max_steps}, got {values[name]}", code="invalid_parameter")
        try:
            return method.validate(**values)
        except InvalidParameter as err:
            raise ApiError(422, str(err), code="invalid_parameter") from err

    def work_bound(self, method: str, used: dict[str, Any]) -> WorkBound:
        """The most the method can cost with ``used`` (valid) parameters; 422 beyond ``max_passes``."""
        bound = METHODS[method].bound(used)
        limit = self.settings.max_passes or 4 * self.settings.max_steps
        if bound.forward > limit:
            raise ApiError(422, f"{method} with these parameters may cost up to {bound.forward} model passes, more than the "
                           f"limit of {limit}: lower steps, probe_steps, max_iter or adversarial_classes", code="invalid_parameter")
        return bound

    def build_attribute(
        self, params: AttributeCommon, model: ImageClassifier, x: Tensor, probs: Tensor | None = None,
    ) -> tuple[Plan, dict[str, Any], float]:
        """The request's plan, every parameter it runs with, and its work units at most (checked);
        with ``probs`` known (from /predict) the plan skips the prediction pass."""
        if params.target is not None and params.target >= model.num_classes:
            raise ApiError(422, f"target must be < {model.num_classes} (the model's classes), got {params.target}", code="invalid_parameter")
        kwargs = self.method_kwargs(params, model.num_classes)
        baseline = resolve_baseline(params.baseline, x.unsqueeze(0))[0]
        extras = self.extras(params, model)
        bound = postprocess_bound(self.work_bound(params.method, kwargs), extras.post)
        limit = self.settings.max_passes or 4 * self.settings.max_steps
        if bound.forward > limit:
            raise ApiError(422, f"{params.method} with smooth_samples={params.smooth_samples} may cost up to {bound.forward} model "
                           f"passes, more than the limit of {limit}: lower smooth_samples or steps", code="invalid_parameter")
        score_passes = forward_cost(extras.metrics, x.shape[-2], x.shape[-1], extras.steps) if extras.metrics else 0
        used = {k: v for k, v in kwargs.items() if v is not None}  # None: not used (AGI's explicit classes)
        used |= {"baseline": params.baseline, "preset": params.preset, **extras.post}
        if extras.metrics:
            used |= {"faithfulness": ",".join(extras.metrics), "faithfulness_steps": extras.steps}
        plan = explain_plan(x, baseline, params.target, params.method, kwargs, extras, probs)
        return plan, used, work_units((probs is None) + bound.forward + score_passes, bound.backward)

    def extras(self, params: AttributeCommon, model: ImageClassifier) -> Extras:
        """The post-steps and faithfulness score a request asks for (422 when they do not apply)."""
        post: dict[str, Any] = {}
        if params.postprocess == "idgi":
            post["postprocess"] = "idgi"
        if params.smooth_samples:
            post |= {"smooth_samples": params.smooth_samples, "smooth_std": params.smooth_std, "smooth_kind": params.smooth_kind,
                     "smooth_seed": params.seed}
        try:
            check_postprocess(params.method, params.postprocess, params.smooth_samples, params.smooth_std, params.smooth_kind)
            metrics = parse_metrics(params.faithfulness)
        except ValueError as err:
            raise ApiError(422, str(err), code="invalid_parameter") from err
        p = model.preprocessing
        return Extras(post, metrics, params.faithfulness_steps or self.settings.faithfulness_steps, tuple(p.mean), tuple(p.std))

    async def attribute(
        self, request: Request | None, data: bytes, params: AttributeCommon, received: float,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> AttributeResponse:
        """Decode, validate, queue, wait and render one attribution; raises :class:`ApiError`."""
        self.check_attribute(params)
        name, model = self.model(params.model)
        x = await load_input(data, model, self.settings, self.device)
        return await self.attribute_tensor(request, name, model, x, params, received, on_event)

    async def attribute_tensor(
        self, request: Request | None, name: str, model: ImageClassifier, x: Tensor, params: AttributeCommon, received: float,
        on_event: Callable[[dict[str, Any]], None] | None = None, probs: Tensor | None = None,
    ) -> AttributeResponse:
        """:meth:`attribute` of a decoded input ``x``; with ``probs`` (from /predict) no prediction pass."""
        plan, used, cost = self.build_attribute(params, model, x, probs)
        outcome = await self.run(request, name, plan, "attribute", priority=1, on_event=on_event, cost=cost)
        probs, target, result, scores = outcome.value
        faithfulness = None
        if scores:
            faithfulness = Faithfulness(insertion=scores.get("insertion"), deletion=scores.get("deletion"), steps=int(scores["steps"]))
            label = params.method + ("+idgi" if params.postprocess == "idgi" else "") + (f"+{params.smooth_kind}" if params.smooth_samples else "")
            for metric in ("insertion", "deletion"):
                if metric in scores:
                    self.metrics.faithfulness.labels(name, label, metric).observe(scores[metric])
        rendered_at = time.perf_counter()
        images = await asyncio.to_thread(render, x, result, params)
        render_ms = (time.perf_counter() - rendered_at) * 1000
        return AttributeResponse(
            model=name,
            method=params.method,
            prediction=self.top_k(model, probs, params.top_k),
            target=ClassScore(index=target, name=model.class_names[target], probability=float(probs[target])),
            parameters={**used, "target": target},
            precision=self.settings.precision_on(self.device),
            curve=curve(result, used["output"]),
            cost=Cost(forward_passes=result.forward_passes + 1 + score_passes(scores), backward_passes=result.backward_passes),
            faithfulness=faithfulness,
            timings=Timings(queued_ms=outcome.queued_ms, compute_ms=outcome.compute_ms, render_ms=render_ms,
                            total_ms=(time.perf_counter() - received) * 1000),
            **images,
        )

    async def run(
        self, request: Request | None, model: str, plan: Plan, kind: str, *, priority: int,
        on_event: Callable[[dict[str, Any]], None] | None = None, cost: float = 1.0,
    ) -> Outcome:
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
        watcher = asyncio.create_task(self._watch(request, job)) if request is not None else None
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
        # No ValueError -> 422 here: the parameters were checked before the job was queued (build_attribute
        # runs the methods' eager argument checks), so whatever the running plan raises is this request's 500.
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

    async def _watch(self, request: Request, job: Job) -> None:
        """Drop the job when its client goes away."""
        while not job.future.done():
            if await request.is_disconnected():
                log.info("client of job %d went away; dropping it", job.id)
                self.worker.cancel(job, "client_disconnected")
                return
            await asyncio.sleep(0.2)


def score_passes(scores: dict[str, float]) -> int:
    """Forward passes a faithfulness score took: steps + 1 per metric."""
    return sum(int(scores["steps"]) + 1 for k in scores if k != "steps")


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def render(x: Tensor, result: AttributionResult, params: AttributeCommon) -> dict[str, Any]:
    """PNGs and the optional raw array, as base64 (CPU work, run off the event loop)."""
    attr = result.attributions[0].detach().float().cpu()
    image = x.detach().float().cpu()
    out: dict[str, Any] = {"heatmap_png": None, "overlay_png": None, "attribution": None, "input_png": None}
    if params.return_input:
        buf = io.BytesIO()
        Image.fromarray((image.clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)).save(buf, format="PNG")
        out["input_png"] = b64(buf.getvalue())
    if params.return_heatmap:
        out["heatmap_png"] = b64(heatmap_png(attr, signed=params.signed, outlier_perc=params.outlier_perc))
    if params.return_overlay:
        out["overlay_png"] = b64(overlay_png(image, attr, opacity=params.opacity, signed=params.signed, outlier_perc=params.outlier_perc))
    if params.return_attribution:
        buf = io.BytesIO()
        np.save(buf, attr.numpy().astype(np.float16))
        out["attribution"] = {"format": "npy", "dtype": "float16", "shape": list(attr.shape), "data": b64(buf.getvalue())}
    return out


def curve(result: AttributionResult, output: str) -> Curve:
    """The response's curve; ``output`` ("logit" or "probability") is what the method differentiated,
    so what ``result.logits`` holds despite its name."""
    def row(t: Tensor) -> list[float]:
        return [float(v) for v in (t[0] if t.dim() == 2 else t)] if t.numel() else []

    values, probe_values = row(result.logits), row(result.probe_logits)
    return Curve.model_validate({
        "output": output, "probe_alphas": row(result.probe_alphas), "probe_values": probe_values, "alphas": row(result.alphas),
        "values": values, "importance": row(result.importance), "weights": row(result.weights),
        "probe_logits": probe_values, "logits": values,  # deprecated names, same numbers
    })
