"""The doors: the one layer around the service call that every way in passes through. The doors are REST and the Open
Inference Protocol over HTTP (:class:`HttpDoor`, ASGI middleware), the protocol over gRPC (:mod:`app.api.oip_grpc`'s
servicer) and the durable jobs' runner (:mod:`app.jobs.runner`, one call per job image). Each door is an object
(:mod:`app.doors.door`: :data:`~app.doors.door.HTTP`, :data:`~app.doors.door.GRPC`, :data:`~app.doors.door.JOB`) that
states its name, its status names, how an error maps to its status, which statuses the alerts read and where the
caller's API key is (:meth:`~app.doors.door.Door.given_key`); the layer runs any of them without knowing one by name.
Each adapts its protocol to :meth:`Doors.handle`, a context manager around one request, RPC or job image that does,
the same way for all of them:

- the request ID: the one given (``X-Request-ID``, gRPC metadata ``x-request-id``, else the protocol's request ``id``:
  :func:`adopt_request_id`; a job's submitting request's) when it is safe (:data:`app.doors.request_id.SAFE`), else a new
  one; bound into the logging context while the call runs, so every log line and result line names it
  (:class:`app.doors.request_id.RequestIdFilter`); the adapter returns it (``X-Request-ID``, metadata ``x-request-id``);
- admission: :meth:`Call.admit` takes one of the API key's share of the queue (``IDG_KEY_SHARE`` of ``IDG_MAX_QUEUE``,
  with several keys) for the work of HTTP and gRPC calls together, so one tenant's flood over gRPC is held to its share
  while another's HTTP calls find room (a job's images take none: ``IDG_JOBS_IN_FLIGHT`` bounds them, and the
  ``POST /jobs`` that submitted them took its slot);
- the count: ``idg_requests_total{door, route, status}`` and ``idg_request_seconds{door, route}``, ``status`` being the
  HTTP status (``"200"``, ``"503"``) or the gRPC status code's name (``"OK"``, ``"NOT_FOUND"``); the HTTP door's also
  under their first names, ``idg_http_requests_total{route, status}`` and ``idg_http_request_seconds{route}``;
- one access log line (logger ``app.requests``): ``POST /predict 200 in 3.2 ms``, ``gRPC ModelInfer OK in 3.2 ms``,
  ``job 0f3... image 2 200 in 3.2 ms``; none for the probes and scrapes (``quiet``);
- one server span (``IDG_TRACING``, :mod:`app.doors.tracing`): a caller's W3C ``traceparent`` (header or metadata)
  continues its trace, and the call's stages (decoding, the queue wait, the worker and its model calls, rendering)
  are its children; a job image's span (a consumer's) is a child of its ``POST /jobs``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import ApiError
from app.doors import tracing
from app.doors.asgi import HttpMiddleware, send_json_error
from app.doors.door import HTTP, Door
from app.doors.keys import Key, match
from app.doors.request_id import HEADER, QUIET, SAFE, bind_request_id, request_id_from, unbind_request_id
from app.monitoring.prometheus import Metrics

log = logging.getLogger("app.requests")

CALL = "idg_door_call"
"""The key in an HTTP request's ``scope["state"]`` of its :class:`Call`."""
_current: ContextVar[Call | None] = ContextVar("idg_door_call", default=None)


@dataclass(eq=False)
class Call:
    """One request, RPC or job image going through its door (:meth:`Doors.handle`). The adapter sets :attr:`status`
    (and may rename :attr:`route` and :attr:`name` once it knows them, add span :attr:`attributes`)."""

    doors: Doors
    door: Door
    route: str
    request_id: str
    name: str
    """The span's name."""
    line: str
    """The access log line's start (``POST /predict``)."""
    status: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    """Added to the span when the call ends."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Added to the access log line's fields (JSON logs)."""
    key: str | None = None
    """The name of the API key admitted on its share (:meth:`admit`), until the call ends."""
    given: bool = False
    """Whether the request ID was the caller's (else made, and a protocol's own ID read later may replace it)."""

    def admit(self, key: Key | None) -> None:
        """Take one of ``key``'s share of the queue for this call, or raise a 503 (``key_share``, ``Retry-After: 1``,
        counted in ``idg_rejections_total{reason="key_share"}``) while the key holds its whole share (every door's calls
        together). Nothing where no share is set (one key or none) or the call sends no configured key (its door's guard
        answers 401)."""
        doors = self.doors
        if doors.share is None or key is None or self.key is not None:
            return
        if doors.in_flight.get(key.name, 0) >= doors.share:
            doors.metrics.rejections.labels("key_share").inc()  # every door's refusal, under the route it refused too
            raise ApiError(503, f"the API key {key.name!r} has {doors.share} requests in flight, its share of the queue "
                           "(IDG_KEY_SHARE of IDG_MAX_QUEUE): retry when one has been answered",
                           headers={"Retry-After": "1"}, code="key_share")
        doors.in_flight[key.name] = doors.in_flight.get(key.name, 0) + 1
        self.key = key.name

    def _release(self) -> None:
        if self.key is not None:
            self.doors.in_flight[self.key] -= 1
            self.key = None


class Doors:
    """The layer every door passes through (one per app, ``app.state.doors``): the keys' shares of the queue in flight,
    and the request metrics of every door."""

    def __init__(self, metrics: Metrics, share: int | None = None) -> None:
        self.metrics = metrics
        self.share = share
        """Calls one API key may have in flight over every door (None: no share, one key or none is configured)."""
        self.in_flight: dict[str, int] = {}
        """Calls in flight per key name, admitted on its share (on the event loop only)."""
        self.requests = metrics.door_requests
        self.latency = metrics.door_latency
        self._counters: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        self._histograms: dict[tuple[str, str], tuple[Any, ...]] = {}
        """Each series' child, looked up once (prometheus_client's ``labels()`` was a third of a call's time here)."""

    def _count(self, door: Door, route: str, status: str, seconds: float) -> None:
        """One call in ``idg_requests_total`` and ``idg_request_seconds`` (an HTTP one also under the first names,
        ``idg_http_requests_total`` and ``idg_http_request_seconds``, which dashboards read)."""
        counters = self._counters.get((door.name, route, status))
        if counters is None:
            counters = self._counters[(door.name, route, status)] = (
                self.requests.labels(door.name, route, status),
                *([self.metrics.requests.labels(route, status)] if door.http_families else []))
        histograms = self._histograms.get((door.name, route))
        if histograms is None:
            histograms = self._histograms[(door.name, route)] = (
                self.latency.labels(door.name, route), *([self.metrics.latency.labels(route)] if door.http_families else []))
        for counter in counters:
            counter.inc()
        for histogram in histograms:
            histogram.observe(seconds)

    def init_routes(self, door: Door, routes: list[str]) -> None:
        """Create each route's counters at 0 for the statuses the alerts count (the door's :attr:`Door.alert_statuses`, so
        ``rate()`` sees the first failure)."""
        for route in routes:
            for status in door.alert_statuses:
                self.requests.labels(door.name, route, status)
            if door.http_families:
                self.metrics.init_routes([route])

    @contextmanager
    def handle(self, door: Door, route: str, *, request_id: str | None = None, carrier: Mapping[str, str] | None = None,
               name: str | None = None, line: str | None = None, quiet: bool = False,
               attributes: Mapping[str, Any] | None = None) -> Iterator[Call]:
        """Around one call through ``door`` to ``route``: its request ID (``request_id`` if safe, else a new one) in the
        log lines meanwhile, a server span (its parent from ``carrier``'s ``traceparent``), and when it ends its slot of the
        key's share freed, its count and latency, and its access log line (none when ``quiet``). The status counted is the
        one the adapter set; unset, an :class:`ApiError`'s as the door answers it (:meth:`Door.status_of`), the door's
        :attr:`Door.client_gone` for a cancelled call, its :attr:`Door.failed` for any other exception, else its
        :attr:`Door.success`."""
        rid = request_id_from(request_id)
        call = Call(self, door, route, rid, name=name or f"{door.name} {route}", line=line or f"{door.name} {route}",
                    given=rid == request_id)
        token: Token[str | None] = bind_request_id(rid)
        current = _current.set(call)
        started = time.perf_counter()
        try:
            traced = tracing.server_span(call.name, carrier, {"idg.door": door.name, "idg.request_id": rid, **(attributes or {})},
                                         consumer=door.consumer) if tracing.enabled() else nullcontext()
            with traced as span:
                try:
                    yield call
                except asyncio.CancelledError:
                    call.status = call.status or door.client_gone
                    raise
                except ApiError as err:
                    call.status = call.status or door.status_of(err)
                    raise
                except BaseException:
                    call.status = call.status or door.failed
                    raise
                finally:
                    call.status = call.status or door.success
                    call._release()  # noqa: SLF001 - the call's own slot
                    if span is not None:
                        tracing.end_server_span(span, call.name, {**call.attributes, "idg.status": call.status,
                                                                  "idg.request_id": call.request_id}, door.server_failure(call.status))
        finally:
            seconds = time.perf_counter() - started
            status = call.status or door.failed
            self._count(door, call.route, status, seconds)
            if not quiet:
                ms = round(seconds * 1000, 1)
                log.info("%s %s in %.1f ms", call.line, status, ms, extra={"fields": {
                    "door": door.name, "route": call.route, **call.fields, "status": int(status) if status.isdigit() else status,
                    "ms": ms}})
            _current.reset(current)
            unbind_request_id(token)


def adopt_request_id(given: str | None) -> None:
    """A protocol's own request ID read once its call began (the Open Inference Protocol's ``id`` in an HTTP body) as the
    call's, where the caller gave none (no ``X-Request-ID``) and it is safe: from now on in the call's log lines, and in
    its answer's ``X-Request-ID``, its span and its access line."""
    call = _current.get()
    if call is None or call.given or not given or not SAFE.fullmatch(given):
        return
    call.request_id, call.given = given, True
    bind_request_id(given)  # the door's own token restores the ID from before the call when it ends


class HttpDoor(HttpMiddleware):
    """HTTP's adapter (pure ASGI: no body buffering, so disconnect detection keeps working): each request through
    :meth:`Doors.handle` (door ``http``, its route), its ID in ``scope["state"]["request_id"]`` and the ``X-Request-ID``
    of its answer, whatever answers it (a route, an error handler, the drain).

    The status counted is the one the app sent; 499 when the client went away before the answer ended (whatever the app
    then sent went nowhere; a stream whose 200 headers went out counts too, with its latency up to when it ended), and
    500 when the app failed without answering. So 5xx counts only the server's own failures."""

    def __init__(self, app: ASGIApp, doors: Doors) -> None:
        super().__init__(app)
        self.doors = doors
        self._plain: dict[int, str] = {}

    def _plain_route(self, scope: Scope) -> str | None:
        """The path of a Starlette route or mount that answered (``/openapi.json``, ``/static/{path}``): FastAPI's own
        routes name themselves in ``scope["route"]``, these only by their endpoint."""
        endpoint = scope.get("endpoint")
        if endpoint is None:
            return None
        if id(endpoint) not in self._plain:
            for r in getattr(scope.get("app"), "routes", []):
                if getattr(r, "endpoint", None) is endpoint:
                    self._plain[id(endpoint)] = str(r.path)
                elif isinstance(r, Mount) and r.app is endpoint:
                    self._plain[id(endpoint)] = f"{r.path}/{{path}}"
        return self._plain.get(id(endpoint))

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == HEADER), None)
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]} if tracing.enabled() else None
        method, path = scope["method"], scope["path"]
        with self.doors.handle(HTTP, "unmatched", request_id=given, carrier=carrier, name=f"{method} {path}",
                               line=f"{method} {path}", quiet=QUIET.fullmatch(path) is not None,
                               attributes={"http.request.method": method, "url.path": path}) as call:
            call.fields.update(method=method, path=path)
            state = scope.setdefault("state", {})
            state["request_id"], state[CALL] = call.request_id, call
            status: int | None = None
            sent: int | None = None
            client_gone = finished = False

            async def _receive() -> Message:
                nonlocal client_gone
                message = await receive()
                if message["type"] == "http.disconnect" and not finished:
                    client_gone = True
                return message

            async def _send(message: Message) -> None:
                nonlocal status, sent, client_gone, finished
                if message["type"] == "http.response.start":
                    sent = message["status"]
                    if status is None:
                        status = 499 if client_gone else message["status"]
                    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                    message["headers"] = [*headers, (HEADER, call.request_id.encode())]
                try:
                    await send(message)
                except OSError:  # uvicorn's ClientDisconnected: the body had nowhere to go
                    client_gone = True
                    raise
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    finished = True

            try:
                await self.app(scope, _receive, _send)
            except ClientDisconnect:
                client_gone = True
                raise
            finally:
                fastapi_route = getattr(scope.get("route"), "path", None)
                call.route = fastapi_route or self._plain_route(scope) or "unmatched"
                answered = status is not None and (finished or not client_gone)
                call.status = str(status if answered and status is not None else 499 if client_gone else 500)
                if fastapi_route:
                    call.name = f"{method} {fastapi_route}"
                    call.attributes["http.route"] = fastapi_route
                call.attributes["http.response.status_code"] = sent or 500


def _leaves(routes: list[Any]) -> Iterator[BaseRoute]:
    """Every route that answers, inside the routers included (FastAPI's included routers match as one route)."""
    for route in routes:
        inner = getattr(getattr(route, "original_router", None), "routes", None)
        if inner is not None:
            yield from _leaves(inner)
        elif isinstance(route, BaseRoute):
            yield route


def _route_of(scope: Scope) -> BaseRoute | None:
    """The app's route that would answer this request (what routing puts in ``scope["route"]``), or None."""
    for route in _leaves(getattr(getattr(scope.get("app"), "router", None), "routes", [])):
        if route.matches(scope)[0] == Match.FULL:
            return route
    return None


WORK = ("/predict", "/attribute", "/v2/models/", "/jobs")
"""Paths whose POSTs take the worker's queue slots (a share of them per key)."""


class HttpAdmission(HttpMiddleware):
    """HTTP's adapter of the door's admission (:meth:`Call.admit`), inside the CORS middleware so its 503 carries CORS
    headers: a POST to a work route that sends a configured key takes a slot of that key's share, from its start to the
    end of its answer (a stream's too); past its share, a 503 with ``Retry-After`` (the queue is full, for that key: the
    status every work route documents for a full queue) while the other keys' calls still find room."""

    def __init__(self, app: ASGIApp, keys: list[Key]) -> None:
        super().__init__(app)
        self.keys = keys

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        call: Call | None = scope.get("state", {}).get(CALL)
        if call is None or scope["method"] != "POST" or not scope["path"].startswith(WORK):
            await self.app(scope, receive, send)
            return
        given = call.door.given_key({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]})
        try:
            call.admit(None if given is None else match(self.keys, given))  # no key or a wrong one: the route answers 401
        except ApiError as err:
            route = _route_of(scope)  # refused before routing: counted under the route it refused, not "unmatched"
            if route is not None:
                scope["route"] = route
            await send_json_error(send, err.status, err.message, err.code,
                                  [(k.lower().encode(), v.encode()) for k, v in err.headers.items()])
            return
        await self.app(scope, receive, send)
