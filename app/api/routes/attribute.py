"""POST /attribute: explain a prediction with IDG (default) or a baseline method."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from app.api.deps import get_service, require_api_key
from app.api.requests import body_docs, read_image_request
from app.core.images import model_input
from app.schemas import ERROR_RESPONSES, AttributeJSON, AttributeParams, AttributeResponse, ClassScore, Cost, Curve, Timings
from app.service import Service, curve, render

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/attribute", response_model=AttributeResponse, responses=ERROR_RESPONSES, openapi_extra=body_docs(AttributeParams, AttributeJSON))
async def attribute(request: Request, service: Annotated[Service, Depends(get_service)]) -> AttributeResponse:
    """Attribution heatmaps and the logit-α curve for one image: multipart ``file`` + form fields
    (``curl -F file=@photo.jpg -F method=idg -F target=207``) or JSON with a base64 ``image``."""
    received = time.perf_counter()
    data, params = await read_image_request(request, AttributeParams, AttributeJSON, service.settings.max_upload_bytes)
    name, model = service.model(params.model)
    x = await asyncio.to_thread(model_input, data, model, service.settings.max_image_pixels, service.device)
    service.check_top_k(params.top_k)
    plan, used = service.build_attribute(params, model, x)
    outcome = await service.run(request, name, plan, "attribute", priority=1)
    probs, target, result = outcome.value
    rendered_at = time.perf_counter()
    images = await asyncio.to_thread(render, x, result, params)
    render_ms = (time.perf_counter() - rendered_at) * 1000
    return AttributeResponse(
        model=name,
        method=params.method,
        prediction=service.top_k(model, probs, params.top_k),
        target=ClassScore(index=target, name=model.class_names[target], probability=float(probs[target])),
        parameters={**used, "target": target},
        curve=Curve(**curve(result)),
        cost=Cost(forward_passes=result.forward_passes + 1, backward_passes=result.backward_passes),
        timings=Timings(queued_ms=outcome.queued_ms, compute_ms=outcome.compute_ms, render_ms=render_ms,
                        total_ms=(time.perf_counter() - received) * 1000),
        **images,
    )
