"""The FastAPI app (served by ``python -m app.server``). Models load in the lifespan; ready only when warm."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles

from app.api.docs import install_docs
from app.api.failures import UnhandledErrorMiddleware
from app.api.openapi import install_openapi
from app.api.routes import attribute, info, jobs, predict, v2
from app.core import tracing
from app.core.config import Settings
from app.core.drain import Drain, DrainMiddleware, wait_thread
from app.core.errors import install_error_handlers
from app.core.image_threads import image_thread_pool, image_threads, processes_on_host
from app.core.keys import KeyShareMiddleware, load_keys, share_limit
from app.core.model_loading import ModelLoadError, apply_calibrations, load_models, pick_device, warm_up
from app.core.processes import host_cores
from app.core.prometheus import Metrics, MetricsMiddleware, weights_digest
from app.core.replica import ReplicaHeaderMiddleware
from app.core.request_id import RequestIdMiddleware, configure_logging
from app.core.tracing import TracingMiddleware
from app.jobs.runner import start_jobs
from app.service import Service
from app.worker.engine import Worker
from idg_core.call_shapes import CallShapes
from idg_core.models import ImageClassifier, keep_freed_memory
from idg_core.models.compiled import compiled_part
from idg_core.models.speed import model_precision, tune_all
from idg_serving.simulated import SharedTimeline, SimulatedAccelerator, Timeline

log = logging.getLogger("app")
STATIC = Path(__file__).with_name("static")


def create_app(settings: Settings | None = None, models: dict[str, ImageClassifier] | None = None) -> FastAPI:
    """Build the app; ``models`` replaces loading from ``settings.models`` (tests inject tiny ones)."""
    settings = settings or Settings()
    metrics = Metrics()
    drain = Drain()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.switch_interval_ms is not None:
            sys.setswitchinterval(settings.switch_interval_ms / 1000)
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        if settings.keep_freed_memory:
            keep_freed_memory()
        device = pick_device(settings.device)
        loaded = models if models is not None else await asyncio.to_thread(
            load_models, settings.models, device, settings.models_file, settings.models_file_any_path)
        await asyncio.to_thread(apply_calibrations, loaded, device, settings)  # IDG_CALIBRATION_FILE / IDG_CALIBRATE_IMAGES
        digests = await asyncio.to_thread(lambda: {name: weights_digest(m.net) for name, m in loaded.items()})  # as loaded
        try:
            loaded = tune_all(loaded, device, precision=settings.precision, channels_last=settings.channels_last, compile=settings.compile,
                              fold_bn=settings.fold_bn, compile_sizes=settings.compile_sizes, batch_images=settings.batch_images(device))
        except ValueError as err:
            raise ModelLoadError(str(err)) from err
        metrics.init_models(loaded)
        for name, m in loaded.items():
            metrics.set_model_info(name, m.source, model_precision(m, device), digests[name])
        if settings.simulated_call_ms is not None:
            # one device: the models' calls share one timeline (the processes' file, with IDG_PROCESSES); only a stream's
            # calls are booked on one
            path = settings.simulated_timeline
            timeline = (SharedTimeline(path) if path is not None else Timeline()) if settings.simulated_stream else None
            for m in loaded.values():
                m.net = SimulatedAccelerator(m.net, settings.simulated_call_ms, settings.simulated_image_ms,
                                             stream=settings.simulated_stream, timeline=timeline)
            log.warning("simulated device: every model call takes %g ms + %g ms per image (IDG_SIMULATED_CALL_MS)",
                        settings.simulated_call_ms, settings.simulated_image_ms)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = settings.cudnn_benchmark
        fixed = settings.fixed_sizes_on(device)
        shapes = {name: CallShapes(settings.sizes_for(device, m.max_batch, (part.sizes if (part := compiled_part(m)) else None))
                                   if fixed else (), use_graphs=settings.cuda_graphs and fixed and compiled_part(m) is None)
                  for name, m in loaded.items()}
        worker = Worker(
            loaded, device, metrics, max_batch_images=settings.batch_images(device), max_round_images=settings.round_images(device),
            batch_wait_ms=settings.batch_wait_ms, max_queue=settings.max_queue, max_predict_queue=settings.max_predict_queue,
            watchdog_grace_s=settings.watchdog_grace_s, shapes=shapes, pipeline_depth=settings.pipeline_depth,
            launch_ahead=settings.launch_ahead, log_results=settings.log_predictions,
        )
        # on the worker's own thread, where requests run: its malloc arena is the one the first request would grow
        # (its page faults made the first request slower when the warm-up ran elsewhere: docs/results/speed.md).
        # Compiled graphs are made before ready even with IDG_WARMUP=false: else the first requests would wait for them
        await asyncio.to_thread(worker.start, partial(warm_up, loaded, settings.batch_images(device), settings.warmup, shapes,
                                                      worker.run_on_device))
        for name, model in loaded.items():
            if (part := compiled_part(model)) is not None:
                metrics.track_compiled(name, part)
        threads, why = image_threads(settings.image_threads, host_cores(), processes_on_host())
        log.info("%d image thread(s) decode uploads and render answers (%s)", threads, why)
        with image_thread_pool(threads):  # closed on every way out, a failed start-up too
            app.state.service = service = Service(settings, loaded, worker, metrics, device)
            if settings.warmup:
                await service.warm_up_requests()
            app.state.jobs = await start_jobs(service, lambda: app.state.draining or not app.state.ready)
            if settings.gc_freeze:
                await asyncio.to_thread(gc.collect)
                gc.freeze()  # start-up's objects live on: the cyclic collector's full passes no longer walk them under traffic
            app.state.ready = True
            metrics.set_ready(True)
            log.info("ready: %s on %s", ", ".join(loaded), device)
            grpc_server = None
            try:  # IDG_GRPC_PORT: the Open Inference Protocol over gRPC (a failure to open it stops what started)
                grpc_server = await start_grpc(app, settings) if settings.grpc_port else None
                yield
            finally:
                app.state.ready = False
                metrics.set_ready(False)
                if grpc_server is not None:  # its calls in flight end first, while the worker still runs
                    await grpc_server.stop(settings.shutdown_grace_s)
                if settings.gc_freeze:
                    gc.unfreeze()  # an app stopped in a process that goes on (tests, a reload) can be collected
                await app.state.jobs.stop()  # its images in the worker are dropped and given back to the store
                if drain.drained:  # app.server drained the requests already and is stopping the worker
                    await wait_thread(drain.worker_stopper, 1.0)
                else:  # served some other way (plain uvicorn, tests): requests are gone, finish their jobs
                    log.info("shutting down: finishing in-flight work (grace %.0f s)", settings.shutdown_grace_s)
                    await asyncio.to_thread(worker.stop, settings.shutdown_grace_s)

    app = FastAPI(
        title="IDG service",
        version="0.1.0",
        description="Explain ImageNet classifiers with Integrated Decision Gradients (adaptive sampling) and its baselines.",
        lifespan=lifespan,
        redirect_slashes=False,  # POST /predict/ is a JSON 404 naming /predict (app.core.errors), not an empty 307
        docs_url=None,  # app.api.docs serves /docs and /redoc with local assets (FastAPI's load from a CDN)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.keys = load_keys(settings)  # a malformed key or keys file stops the start here
    if settings.tracing:
        tracing.enable()
    if settings.replicas_expected is not None:
        metrics.replicas_expected.set(settings.replicas_expected)
    metrics.request_timeout.set(settings.request_timeout_s)
    app.state.metrics = metrics
    app.state.ready = False
    app.state.draining = False
    app.state.drain = drain
    install_error_handlers(app)
    app.add_middleware(UnhandledErrorMiddleware)  # innermost: its JSON 500 gets the headers of the middleware around it
    if (share := share_limit(settings, app.state.keys)) is not None:  # several keys: none may take the whole queue
        app.add_middleware(KeyShareMiddleware, keys=app.state.keys, limit=share)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"], allow_headers=["*"])
    app.add_middleware(DrainMiddleware, drain=drain)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: counts the drain's 503s too
    app.add_middleware(TracingMiddleware)  # with IDG_TRACING: a server span per request (inside the request ID's scope)
    app.add_middleware(ReplicaHeaderMiddleware)  # X-IDG-Replica: which process (Ray Serve replica) answered
    app.add_middleware(RequestIdMiddleware)  # outermost: X-Request-ID on every answer, the ID in every log line meanwhile
    routers = [module.router for module in (predict, attribute, jobs, info, v2)]  # v2: the Open Inference Protocol
    for router in routers:
        app.include_router(router)
    # every route's counters at 0, so rate() sees its first failure (the routers', included without a prefix)
    metrics.init_routes(r.path for router in routers for r in router.routes if isinstance(r, APIRoute))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    install_docs(app)
    install_openapi(app, settings)  # the schema says what this server accepts

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        """The page's icon (browsers ask for it on every page load)."""
        return FileResponse(STATIC / "favicon.ico", media_type="image/x-icon")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        """The web page: drop an image, see the heatmap and the logit-α curve."""
        return FileResponse(STATIC / "index.html")

    return app


async def start_grpc(app: FastAPI, settings: Settings) -> Any:
    """The Open Inference Protocol's gRPC server (:mod:`app.api.oip_grpc`), listening; a clear start-up error where the
    grpc extra is not installed or the port cannot be had."""
    try:
        from app.api.oip_grpc import start_grpc as start
    except ImportError as err:
        raise ModelLoadError(f"IDG_GRPC_PORT={settings.grpc_port} needs grpcio, protobuf and tritonclient: pip install "
                             f"'idg-service[grpc]' ({err})") from err
    try:
        return await start(app, settings)
    except RuntimeError as err:
        raise ModelLoadError(str(err)) from err


configure_logging()  # served by plain uvicorn (python -m app.server configured it first, by IDG_LOG_FORMAT)
app = create_app()
