"""The FastAPI app (served by ``python -m app.server``): its middleware and routes. The service behind them is put
together in its lifespan (:mod:`app.assembly`): models load there, and the app is ready only when warm."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles

from app.api.docs import install_docs
from app.api.failures import UnhandledErrorMiddleware
from app.api.openapi import install_openapi
from app.api.routes import attribute, info, jobs, predict, v2
from app.assembly import running
from app.core.config import Settings, SettingsError, load_settings
from app.core.errors import install_error_handlers
from app.doors import tracing
from app.doors.door import HTTP, JOB
from app.doors.drain import Drain, DrainMiddleware
from app.doors.keys import load_keys, share_limit
from app.doors.layer import Doors, HttpAdmission, HttpDoor
from app.doors.replica import ReplicaHeaderMiddleware
from app.doors.request_id import configure_logging
from app.monitoring.drift_reference import DriftReferenceError, load_reference
from app.monitoring.prometheus import Metrics
from idg_models import ImageClassifier

STATIC = Path(__file__).with_name("static")


def create_app(settings: Settings | None = None, models: dict[str, ImageClassifier] | None = None) -> FastAPI:
    """Build the app; ``models`` replaces loading from ``settings.models`` (tests inject tiny ones). Its lifespan
    (:func:`app.assembly.running`) loads the models, starts the worker and the service, and reports ready."""
    settings = settings or load_settings()
    metrics = Metrics()
    drain = Drain()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running(app, settings, metrics, drain, models):
            yield

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
    try:  # a malformed key or keys file, or tracing without its exporter, stops the start here, in one line
        app.state.keys = load_keys(settings)
        if settings.tracing:
            tracing.enable()
    except (ValueError, RuntimeError) as err:
        raise SettingsError(str(err)) from None
    if settings.replicas_expected is not None:
        metrics.replicas_expected.set(settings.replicas_expected)
    if settings.drift_reference is not None:  # what the drift alerts compare with
        try:
            metrics.set_drift_reference(load_reference(settings.drift_reference))
        except DriftReferenceError as err:
            raise SettingsError(str(err)) from None
    metrics.request_timeout.set(settings.request_timeout_s)
    metrics.init_tenants([key.name for key in app.state.keys] or [""])  # who may submit jobs: each key's count at 0
    app.state.metrics = metrics
    app.state.doors = doors = Doors(metrics, share_limit(settings, app.state.keys))  # what every door passes through
    app.state.ready = False
    app.state.draining = False
    app.state.drain = drain
    install_error_handlers(app)
    add_middleware(app, settings, doors, drain)
    add_routes(app, settings, doors)
    return app


def add_middleware(app: FastAPI, settings: Settings, doors: Doors, drain: Drain) -> None:
    """The middleware, innermost first: each one added wraps those before it."""
    app.add_middleware(UnhandledErrorMiddleware)  # innermost: its JSON 500 gets the headers of the middleware around it
    if doors.share is not None:  # several keys: none may take the whole queue (its calls over every door together)
        app.add_middleware(HttpAdmission, keys=app.state.keys)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"], allow_headers=["*"])
    app.add_middleware(DrainMiddleware, drain=drain)
    # the door every HTTP request passes through (app.doors.layer): X-Request-ID on every answer and the ID in every log
    # line meanwhile, the count (the drain's 503s too), the access log line, the server span (IDG_TRACING)
    app.add_middleware(HttpDoor, doors=doors)
    app.add_middleware(ReplicaHeaderMiddleware)  # outermost: X-IDG-Replica, which process (Ray Serve replica) answered


def add_routes(app: FastAPI, settings: Settings, doors: Doors) -> None:
    """The API's routers, the web page and its assets, the docs and the OpenAPI schema."""
    routers = [module.router for module in (predict, attribute, jobs, info, v2)]  # v2: the Open Inference Protocol
    for router in routers:
        app.include_router(router)
    # every route's counters at 0, so rate() sees its first failure (the routers', included without a prefix)
    doors.init_routes(HTTP, [r.path for router in routers for r in router.routes if isinstance(r, APIRoute)])
    doors.init_routes(JOB, ["image"])  # each image of a durable job (app.jobs.runner), as its answer's status
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


configure_logging()  # served by plain uvicorn (python -m app.server configured it first, by IDG_LOG_FORMAT)
app = create_app()
