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
from app.schemas import ERROR_RESPONSES, PredictJSON, PredictParams, PredictResponse, Timings
from app.service import Service, predict_plan

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/predict", response_model=PredictResponse, responses=ERROR_RESPONSES, openapi_extra=body_docs(PredictParams, PredictJSON))
async def predict(request: Request, service: Annotated[Service, Depends(get_service)]) -> PredictResponse:
    """Classify an image: multipart ``file`` (+ fields) or JSON with a base64 ``image``."""
    received = time.perf_counter()
    data, params = await read_image_request(request, PredictParams, PredictJSON, service.settings.max_upload_bytes)
    try:
        return await _predict(request, service, data, params, received)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - any other failure is this request's JSON 500, logged once
        raise internal_error(err, "POST /predict") from err


async def _predict(request: Request, service: Service, data: bytes, params: PredictParams, received: float) -> PredictResponse:
    name, model = service.model(params.model)
    service.check_top_k(params.top_k)
    x = await load_input(data, model, service.settings, service.device)
    outcome = await service.run(request, name, predict_plan(x), "predict", priority=0)
    return PredictResponse(
        model=name,
        top_k=service.top_k(model, outcome.value, params.top_k),
        timings=Timings(queued_ms=outcome.queued_ms, compute_ms=outcome.compute_ms, total_ms=(time.perf_counter() - received) * 1000),
    )
