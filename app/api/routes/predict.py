"""POST /predict: top-k classes of one image."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from app.api.deps import get_service, require_api_key
from app.api.failures import internal_error
from app.api.requests import body_docs, read_image_request
from app.core.errors import ApiError
from app.core.images import load_input
from app.explain_if import Facts, parse_condition
from app.schemas import ERROR_RESPONSES, AttributeParams, PredictExplainParams, PredictJSON, PredictResponse, Timings
from app.service import Service, predict_plan
from idg_core.faithfulness import parse_metrics

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/predict", response_model=PredictResponse, responses=ERROR_RESPONSES, openapi_extra=body_docs(PredictExplainParams, PredictJSON))
async def predict(request: Request, service: Annotated[Service, Depends(get_service)]) -> PredictResponse:
    """Classify an image: multipart ``file`` (+ fields) or JSON with a base64 ``image``. With
    ``explain_if`` (e.g. ``confidence < 0.6``) the answer also carries the /attribute body for the
    predicted class when the condition holds, and only the prediction when it does not."""
    received = time.perf_counter()
    data, params = await read_image_request(request, PredictExplainParams, PredictJSON, service.settings.max_upload_bytes)
    try:
        return await _predict(request, service, data, params, received)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - any other failure is this request's JSON 500, logged once
        raise internal_error(err, "POST /predict") from err


async def _predict(request: Request, service: Service, data: bytes, params: PredictExplainParams, received: float) -> PredictResponse:
    name, model = service.model(params.model)
    service.check_top_k(params.top_k)
    try:
        condition = parse_condition(params.explain_if) if params.explain_if is not None else None
        parse_metrics(params.faithfulness)
    except ValueError as err:  # ConditionError included
        raise ApiError(422, str(err), code="invalid_parameter") from err
    explain = None
    if condition is not None:  # the explanation's parameters are checked before any work is queued
        explain = AttributeParams.model_validate({"model": params.model, "top_k": params.top_k, "method": params.method,
                                                  "preset": params.preset, "faithfulness": params.faithfulness})
        service.check_attribute(explain)
    x = await load_input(data, model, service.settings, service.device)
    outcome = await service.run(request, name, predict_plan(x), "predict", priority=0)
    held = None if condition is None else condition(Facts.of(outcome.value))
    service.metrics.predictions.labels(name, {None: "none", True: "held", False: "not_held"}[held]).inc()
    explanation = None
    if held and explain is not None:
        explanation = await service.attribute_tensor(request, name, model, x, explain, received, probs=outcome.value)
        service.metrics.explanations.labels(name).inc()
    return PredictResponse(
        model=name,
        top_k=service.top_k(model, outcome.value, params.top_k),
        timings=Timings(queued_ms=outcome.queued_ms, compute_ms=outcome.compute_ms, total_ms=(time.perf_counter() - received) * 1000),
        explained=held,
        explanation=explanation,
    )
