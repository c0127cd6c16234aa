"""GET /models, /health/live, /health/ready and /metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.deps import get_service, has_api_key, require_api_key, require_api_key_for_metrics
from app.monitoring.prometheus import exposition
from app.schemas import ERROR_RESPONSES, Cost, ModelInfo, ModelsResponse, PresetInfo, RowInfo, method_parameters
from app.service import Service
from idg_core import METHODS
from idg_core.presets import DEFAULT_PRESET, PRESET_NAMES, PRESET_STANDING, PRESET_SUMMARY, PRESETS, ROWS, preset_cost, row_post
from idg_models.compiled import compiled_part
from idg_models.speed import model_precision

router = APIRouter()


@router.get("/models", response_model=ModelsResponse, dependencies=[Depends(require_api_key)],
            responses={c: ERROR_RESPONSES[c] for c in (401, 503)})
async def models(service: Annotated[Service, Depends(get_service)]) -> ModelsResponse:
    """Loaded models (the first is the default), the methods and the device."""
    infos = [
        ModelInfo(name=n, classes=m.num_classes, input_size=m.preprocessing.crop_size, resize_size=m.preprocessing.resize_size,
                  interpolation=m.preprocessing.interpolation, default=i == 0, source=m.source, class_names=m.class_names[:5],
                  resize_mode=m.preprocessing.resize_mode, mean=list(m.preprocessing.mean), std=list(m.preprocessing.std),
                  precision=model_precision(m, service.device), max_batch=m.max_batch,
                  precision_source=m.precision_source, calibration=m.calibration.to_json() if m.calibration else None,
                  compile_sizes=list(part.sizes) if (part := compiled_part(m)) else [],
                  compile_seconds=part.compile_seconds if part else None, call_sizes=list(service.worker.shapes[n].sizes),
                  warm_seconds=service.worker.shapes[n].warm_seconds,
                  cuda_graphs=bool(service.worker.shapes[n].graphs), unwarmed_calls=service.worker.shapes[n].unwarmed_calls)
        for i, (n, m) in enumerate(service.models.items())
    ]
    return ModelsResponse(models=infos, methods={k: v.summary for k, v in METHODS.items()},
                          method_parameters=method_parameters(service.settings.max_steps), presets=preset_infos(),
                          rows=row_infos(), device=str(service.device))


def preset_infos() -> list[PresetInfo]:
    """The presets, the default first: what each sets, costs (with the prediction) and where it stands."""
    def cost(method: str, preset: str) -> Cost:
        bound = preset_cost(method, preset).plus_forward(1)  # and the prediction's pass
        return Cost(forward_passes=bound.forward, backward_passes=bound.backward)

    order = sorted(PRESET_NAMES, key=lambda p: p != DEFAULT_PRESET)
    return [PresetInfo(name=p, default=p == DEFAULT_PRESET, summary=PRESET_SUMMARY[p], standing=PRESET_STANDING[p],
                       parameters={m: PRESETS[m][p] for m in METHODS}, cost={m: cost(m, p) for m in METHODS})
            for p in order]


def row_infos() -> list[RowInfo]:
    """The region rows beside the presets: the fields that ask for each, its cost (with the prediction) and standing."""
    def cost(f: dict[str, str]) -> Cost:
        bound = preset_cost(f["method"], f.get("preset", DEFAULT_PRESET), **row_post(f)).plus_forward(1)
        return Cost(forward_passes=bound.forward, backward_passes=bound.backward)

    return [RowInfo(name=name, request=fields, cost=cost(fields), standing=standing) for name, (fields, standing) in ROWS.items()]


@router.get("/health/live")
async def live() -> dict[str, str]:
    """200 while the process serves HTTP."""
    return {"status": "alive"}


@router.get("/health/ready", responses={503: {"description": "models not loaded and warm yet, shutting down, or the worker is "
                                                            "stuck"}})
async def ready(request: Request) -> JSONResponse:
    """200 while the process can answer interactive work (/predict, /attribute, /v2): once every model is loaded and warmed
    up, and not while shutting down or while the worker is stuck on a request past its deadline (503 then, as ``idg_ready``
    is 0 then). The job store is no part of it: while it cannot be reached the /jobs routes answer 503
    ``store_unavailable`` and ``idg_durable_job_store_up`` is 0 (its own alert), and this says ``job_store: unreachable``
    beside 200, so a load balancer keeps the replica for the interactive traffic it still serves. With ``IDG_API_KEY``
    set, a caller without the key gets the status alone: the model names, the store and the reason are for those who
    hold it."""
    if getattr(request.app.state, "ready", False):
        service: Service = request.app.state.service
        stuck = service.worker.stuck
        full = has_api_key(request)
        if stuck is not None:
            retry = str(max(1, round(service.settings.watchdog_grace_s)))
            body = {"status": "stuck", "reason": stuck} if full else {"status": "stuck"}
            return JSONResponse(body, status_code=503, headers={"Retry-After": retry})
        if not full:
            return JSONResponse({"status": "ready"})
        store = request.app.state.jobs.store.reachability
        answer: dict[str, object] = {"status": "ready", "models": list(service.models), "job_store": "up" if store.up else "unreachable"}
        if not store.up:
            answer["job_store_reason"] = f"unreachable since {store.down_since:.0f} (Unix time): {store.error}"
        return JSONResponse(answer)
    status = "draining" if getattr(request.app.state, "draining", False) else "starting"  # draining: shutting down
    return JSONResponse({"status": status}, status_code=503, headers={"Retry-After": "5"})


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(require_api_key_for_metrics)],
            responses={401: ERROR_RESPONSES[401]})
async def metrics(request: Request) -> Response:
    """Prometheus text format. Behind the API key when ``IDG_METRICS_NEED_KEY`` is set (with ``IDG_API_KEY``)."""
    return Response(exposition(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
