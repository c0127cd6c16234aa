"""POST /predict: top-k classes of one image."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from app.api.deps import get_service, require_api_key
from app.api.failures import alone
from app.api.requests import body_docs, read_image_request, until_disconnected
from app.schemas import ERROR_RESPONSES, PredictExplainParams, PredictJSON, PredictResponse
from app.service import Service

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post(
    "/predict", response_model=PredictResponse, responses=ERROR_RESPONSES, openapi_extra=body_docs(PredictExplainParams, PredictJSON),
)
async def predict(request: Request, service: Annotated[Service, Depends(get_service)]) -> PredictResponse:
    """Classify an image: multipart ``file`` (+ fields) or JSON with a base64 ``image``. With
    ``explain_if`` (e.g. ``confidence < 0.6``) the answer also carries the /attribute body for the
    predicted class when the condition holds, and only the prediction when it does not."""
    received = time.perf_counter()
    data, params = await read_image_request(request, PredictExplainParams, PredictJSON, service.settings.max_upload_bytes)
    call = service.predict_request(params, service.context(received, until_disconnected=until_disconnected(request)))
    return await alone(service.predict(call, data), "POST /predict")
