"""The same FastAPI app as a Ray Serve deployment: one replica per device, autoscaled, on one machine or many.

Each replica is one Ray actor (one process) that builds the app with the usual factory
(``app.main:create_app``, or another ``module:function`` returning the app, e.g. the tests' tiny one)
and runs its lifespan: models load and the worker thread starts in the replica's start-up, exactly
as under ``python -m app.server``. The routes, worker, batching and limits are the app's own; there is
no second copy. Settings come from ``IDG_*`` variables, which the Serve config passes through its
``runtime_env``. Ray's health check calls the app's own ``/health/ready`` handler.

    serve run deploy/ray/serve.yaml                    # this machine, 2 CPU replicas, port 8000
    serve deploy deploy/ray/serve.yaml -a http://HEAD:8265   # a running cluster

Metrics: each replica serves its own Prometheus registry (the app's ``idg_*`` metrics) on a port of
its node (the first free one of ``IDG_REPLICA_METRICS_PORTS``), and registers that address with
:class:`MetricsTargets`, a small detached actor; any replica answers ``GET /metrics/targets`` with the
list in Prometheus's HTTP service-discovery format (``http_sd_configs``), so one scrape target per
replica, found by Prometheus itself. A replica's registration is refreshed by each health check and
dropped when it stops (or, if killed, once it is older than :data:`TARGET_MAX_AGE_S`).

``ray[serve]`` is an optional extra (``.venv/bin/pip install -e '.[ray]' torch==2.13.0``); nothing else imports this module.
"""

from __future__ import annotations

import errno
import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

import ray
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, start_http_server
from ray import serve
from ray.serve import Application
from starlette.requests import Request

from app.api.routes.info import ready
from app.doors.replica import set_replica_id

log = logging.getLogger("app.ray_serve")
DEFAULT_FACTORY = "app.main:create_app"
HEALTH_CHECK_PERIOD_S = 5
TARGET_MAX_AGE_S = 3 * HEALTH_CHECK_PERIOD_S  # a replica missing three refreshes is gone (killed, or its node lost)
TARGETS_ACTOR = "idg-metrics-targets"


@ray.remote(num_cpus=0)
class MetricsTargets:
    """The scrape address of each live replica's metrics, as Prometheus's HTTP service discovery wants it.

    Detached and named (:data:`TARGETS_ACTOR`, namespace ``idg``): replicas come and go, the list stays."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, float]] = {}

    def register(self, replica: str, address: str) -> None:
        self._seen[replica] = (address, time.monotonic())

    def remove(self, replica: str) -> None:
        self._seen.pop(replica, None)

    def targets(self, max_age_s: float = TARGET_MAX_AGE_S) -> list[dict[str, Any]]:
        now = time.monotonic()
        self._seen = {r: (a, t) for r, (a, t) in self._seen.items() if now - t <= max_age_s}
        return [{"targets": [address], "labels": {"replica": replica}} for replica, (address, _) in sorted(self._seen.items())]


def metrics_targets() -> Any:
    """The handle of the cluster's :class:`MetricsTargets` (started by the first replica that asks)."""
    return MetricsTargets.options(  # type: ignore[attr-defined]  # added by @ray.remote
        name=TARGETS_ACTOR, namespace="idg", get_if_exists=True, lifetime="detached").remote()


def serve_metrics(registry: CollectorRegistry, host: str, ports: range) -> Any:
    """Serve ``registry`` as Prometheus text on ``host`` at the first port of ``ports`` that is free (another replica of
    the node, or another program, may hold the ones before); the HTTP server (its ``server_port``). None free: a
    RuntimeError naming the setting, and the replica does not start."""
    for port in ports:
        try:
            server, _ = start_http_server(port, addr=host, registry=registry)
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            continue
        return server
    raise RuntimeError(f"no free port for this replica's metrics on {host} in IDG_REPLICA_METRICS_PORTS={ports.start}-"
                       f"{ports.stop - 1}: widen the range (every replica of a node takes one)")


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
    max_ongoing_requests=104,  # > the app's own bound (max_queue 64 + the prediction queue 32): the app answers 503 first
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
    health_check_timeout_s=10,
    graceful_shutdown_timeout_s=30,
)
@serve.ingress()
class IDGReplica:
    """One replica: the app with its worker on this actor's device (its GPU when Ray assigned one)."""

    async def __init__(self, factory: str = DEFAULT_FACTORY, metrics_host: str | None = None) -> None:  # type: ignore[misc]  # Serve awaits an async __init__
        self._factory = factory
        context = serve.get_replica_context()
        self._replica = f"{context.deployment}#{context.replica_id.unique_id}"
        set_replica_id(self._replica)  # "idg#a1b2c3d4", on every answer as X-IDG-Replica
        self._metrics_host = metrics_host or ray.util.get_node_ip_address()
        self._metrics_address: str | None = None
        self._metrics_server: Any = None
        self._targets = metrics_targets()

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Called by Serve after ``__init__``; Serve then runs the app's lifespan (models, warm-up, worker).
        Also starts this replica's metrics server (the first free port of IDG_REPLICA_METRICS_PORTS on its node) and
        registers it."""
        app = load_factory(self._factory)()
        log.info("replica built its app from %s", self._factory)
        self._metrics_server = serve_metrics(app.state.metrics.registry, self._metrics_host, app.state.settings.metrics_ports)
        self._metrics_address = f"{self._metrics_host}:{self._metrics_server.server_port}"
        self._targets.register.remote(self._replica, self._metrics_address)
        log.info("replica %s: its metrics at http://%s/metrics", self._replica, self._metrics_address)
        app.add_api_route("/metrics/targets", self.scrape_targets, methods=["GET"], tags=["info"],
                          summary="Every replica's own metrics address (Prometheus HTTP service discovery)")
        return app

    async def scrape_targets(self) -> JSONResponse:
        """``[{"targets": ["host:port"], "labels": {"replica": "idg#..."}}, ...]``: point Prometheus's
        ``http_sd_configs`` here, or curl each ``http://host:port/metrics``."""
        return JSONResponse(await self._targets.targets.remote())

    async def check_health(self) -> None:
        """Ray's health check = the app's ``/health/ready``: not ready, draining or a stuck worker fails it,
        and Serve replaces a replica that stays unhealthy. An unreachable job store does not (nor does it fail
        ``/health/ready``): it is no replica's fault, replacing them all would not bring it back, and each heals once
        it answers."""
        if self._metrics_address:
            self._targets.register.remote(self._replica, self._metrics_address)  # refreshed while the replica lives
        answer = await ready(Request({"type": "http", "app": self.app, "headers": []}))  # type: ignore[attr-defined]
        if answer.status_code != 200:
            raise RuntimeError(f"not ready: {bytes(answer.body).decode(errors='replace')}")

    def __del__(self) -> None:
        """Serve's graceful stop: leave the target list and close the metrics port."""
        try:
            self._targets.remove.remote(self._replica)
        except Exception:  # noqa: BLE001  # Ray may be going down with us; the entry then ages out
            log.debug("could not unregister %s", self._replica, exc_info=True)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()


def build(args: dict[str, Any]) -> Application:
    """App builder for Serve config files (``import_path: app.ray_serve:build``); ``args.factory`` picks the app."""
    host = args.get("metrics_host")
    return IDGReplica.bind(factory=str(args.get("factory", DEFAULT_FACTORY)), metrics_host=str(host) if host else None)  # type: ignore[attr-defined]  # added by @serve.deployment
