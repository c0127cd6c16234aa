"""The same FastAPI app as a Ray Serve deployment: one replica per device, autoscaled, on one machine or many.

Each replica is one Ray actor (one process) that builds the app with the usual factory
(``app.main:create_app``, or another ``module:function`` returning the app, e.g. the tests' tiny one)
and runs its lifespan: models load and the worker thread starts in the replica's start-up, exactly
as under ``python -m app.server``. The routes, worker, batching and limits are the app's own; there is
no second copy. Settings come from ``IDG_*`` variables, which the Serve config passes through its
``runtime_env``. Ray's health check calls the app's own ``/health/ready`` handler.

    serve run deploy/ray/serve.yaml                    # this machine, 2 CPU replicas, port 8000
    serve deploy deploy/ray/serve.yaml -a http://HEAD:8265   # a running cluster

``ray[serve]`` is an optional extra (``pip install -e '.[ray]'``); nothing else imports this module.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from starlette.requests import Request

from app.api.routes.info import ready
from app.core.replica import set_replica_id

log = logging.getLogger("app.ray_serve")
DEFAULT_FACTORY = "app.main:create_app"


def load_factory(path: str) -> Callable[[], FastAPI]:
    """``module:function`` -> the function (called with no arguments, it returns the app)."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"factory must be 'module:function', got {path!r}")
    factory = getattr(importlib.import_module(module), name)
    if not callable(factory):
        raise TypeError(f"{path} is not callable")
    return factory


@serve.deployment(
    name="idg",
    # One worker per replica owns the device; these are the defaults, deploy/ray/serve.yaml overrides them.
    ray_actor_options={"num_cpus": 1},
    max_ongoing_requests=88,  # > the app's own bound (max_queue 64 + max_predict_queue 16): the app answers 503 first
    health_check_period_s=5,
    health_check_timeout_s=10,
    graceful_shutdown_timeout_s=30,
)
@serve.ingress()
class IDGReplica:
    """One replica: the app with its worker on this actor's device (its GPU when Ray assigned one)."""

    async def __init__(self, factory: str = DEFAULT_FACTORY) -> None:  # type: ignore[misc]  # Serve awaits an async __init__
        self._factory = factory
        context = serve.get_replica_context()
        set_replica_id(f"{context.deployment}#{context.replica_id.unique_id}")  # "idg#a1b2c3d4", on every answer as X-IDG-Replica

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Called by Serve after ``__init__``; Serve then runs the app's lifespan (models, warm-up, worker)."""
        app = load_factory(self._factory)()
        log.info("replica built its app from %s", self._factory)
        return app

    async def check_health(self) -> None:
        """Ray's health check = the app's ``/health/ready``: not ready, draining or a stuck worker fails it,
        and Serve replaces a replica that stays unhealthy."""
        answer = await ready(Request({"type": "http", "app": self.app, "headers": []}))  # type: ignore[attr-defined]
        if answer.status_code != 200:
            raise RuntimeError(f"not ready: {bytes(answer.body).decode(errors='replace')}")


def build(args: dict[str, Any]) -> Application:
    """App builder for Serve config files (``import_path: app.ray_serve:build``); ``args.factory`` picks the app."""
    return IDGReplica.bind(factory=str(args.get("factory", DEFAULT_FACTORY)))  # type: ignore[attr-defined]  # added by @serve.deployment
