"""Every door the service has, each an object that states what is its own: :data:`HTTP` (REST, the Open Inference
Protocol over HTTP, and Ray Serve, which serves the REST app), :data:`GRPC` (the Open Inference Protocol over gRPC) and
:data:`JOB` (one image of a durable job). The layer every door passes through (:mod:`app.doors.layer`,
:meth:`app.doors.layer.Doors.handle`) runs any of them without knowing one by name: it asks the door object.

A door states:

- its :attr:`Door.name`, the ``door`` label of ``idg_requests_total`` and ``idg_request_seconds`` (and of its span);
- its status names: a call's when nothing failed (:attr:`Door.success`), when it failed with no status set (a bug:
  :attr:`Door.failed`), when it was cancelled before its answer (:attr:`Door.client_gone`);
- how the service's error is answered as its status (:meth:`Door.status_of`) and which statuses are the server's side
  (:meth:`Door.server_failure`: the call's span is an error);
- the statuses the alert rules read, created at 0 for each of its routes at start-up (:attr:`Door.alert_statuses`);
- whether it also feeds the first, HTTP-only families ``idg_http_requests_total`` and ``idg_http_request_seconds``
  (:attr:`Door.http_families`), and whether its span is a consumer's (:attr:`Door.consumer`: a job's image, a child of
  the ``POST /jobs`` that submitted it);
- how it finds the caller's API key (:meth:`Door.given_key`: HTTP's ``X-API-Key`` or ``Authorization: Bearer`` header,
  the same names in gRPC's invocation metadata), or that its calls bring none, let in before they came
  (:attr:`Door.brings_key`: a job's image runs under the key its job was submitted with, checked by that ``POST /jobs``).
  One function decides every door's refusal from it (:func:`api_key_refusal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.core.errors import ApiError
from app.doors.keys import Key, api_key_in, match
from app.doors.metrics import ALERT_STATUSES

MESSAGE_TOO_LARGE = "message_too_large"
"""The error code (and ``idg_rejections_total`` reason) of a gRPC message over ``IDG_MAX_UPLOAD_BYTES``."""
GRPC_CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
              408: "DEADLINE_EXCEEDED", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
"""The gRPC status code (its name, ``grpc.StatusCode[name]``) of each of the service's HTTP statuses."""
GRPC_SERVER_FAILURES = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS", "UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"})
"""The gRPC codes of the server's side (HTTP's 5xx): a span with one is an error."""
GRPC_ALERT_STATUSES = ("OK", "INVALID_ARGUMENT", "NOT_FOUND", "INTERNAL", "UNKNOWN", "DATA_LOSS", "UNAVAILABLE",
                       "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "CANCELLED")
"""The gRPC statuses each RPC's counter starts at 0 with (so ``rate()`` sees the first of them): every one an alert rule
reads (tests/test_monitoring.py checks the rules against it), and the answers' and refusals' own."""


@dataclass(frozen=True)
class Door:
    """A door whose statuses are HTTP's (``"200"``, ``"503"``; ``"499"`` when the client went away)."""

    name: str
    """The ``door`` label of its calls' metrics, spans and access log lines."""
    success: str = "200"
    """A call's status when its adapter set none and nothing failed."""
    failed: str = "500"
    """A call's status when it failed with no status set (a bug: the server's own failure)."""
    client_gone: str = "499"
    """A call's status when it was cancelled before its answer (the client went away, or the server stopped it)."""
    alert_statuses: tuple[str, ...] = ALERT_STATUSES
    """The statuses each of its routes' counters start at 0 with: those the alert rules read."""
    http_families: bool = False
    """Whether its calls are also counted in ``idg_http_requests_total`` and ``idg_http_request_seconds``."""
    consumer: bool = False
    """Whether its span is a consumer's (work another request submitted) rather than a server's."""
    brings_key: bool = True
    """Whether each call brings the caller's API key (:meth:`given_key`), refused without a configured one
    (:func:`api_key_refusal`); False: its calls were let in before they came, under a key checked then."""

    def given_key(self, carrier: Mapping[str, str]) -> str | None:
        """The API key a call sends in ``carrier`` (its HTTP headers or its gRPC invocation metadata, names lower-case):
        ``x-api-key``, else ``authorization: Bearer <key>``; None where it sends none, or the door's calls bring none."""
        return api_key_in(carrier) if self.brings_key else None

    def status_of(self, err: ApiError) -> str:
        """The status of a call that ended with ``err``, as this door answers it."""
        return str(err.status)

    def server_failure(self, status: str) -> bool:
        """Whether ``status`` is the server's side (5xx): the call's span is an error."""
        return not status.isdigit() or int(status) >= 500


@dataclass(frozen=True)
class GrpcDoor(Door):
    """A door whose statuses are gRPC status codes' names (``"OK"``, ``"NOT_FOUND"``; ``"CANCELLED"`` when the client
    went away)."""

    success: str = "OK"
    failed: str = "INTERNAL"
    client_gone: str = "CANCELLED"
    alert_statuses: tuple[str, ...] = GRPC_ALERT_STATUSES

    def status_of(self, err: ApiError) -> str:
        return grpc_status_name(err)

    def server_failure(self, status: str) -> bool:
        """Whether ``status`` is one of the server's side's codes (:data:`GRPC_SERVER_FAILURES`)."""
        return status in GRPC_SERVER_FAILURES


def grpc_status_name(err: ApiError) -> str:
    """The gRPC status code's name of the service's error: a busy queue (or a key's share) is RESOURCE_EXHAUSTED (retry
    later), as is a message over the size limit (grpc's own code for it), not ready or shutting down UNAVAILABLE (retry
    elsewhere), any other 4xx INVALID_ARGUMENT."""
    if (err.status == 503 and err.code in ("busy", "key_share")) or (err.status == 413 and err.code == MESSAGE_TOO_LARGE):
        return "RESOURCE_EXHAUSTED"
    return GRPC_CODES.get(err.status, "INVALID_ARGUMENT" if 400 <= err.status < 500 else "INTERNAL")


def api_key_refusal(door: Door, keys: list[Key], carrier: Mapping[str, str]) -> ApiError | None:
    """The 401 of a call through ``door`` (any door) that brings ``carrier`` (:meth:`Door.given_key`) where ``keys`` are
    the configured ones; None where none is configured (open to all), the call sends one of them, or the door's calls
    bring none (:attr:`Door.brings_key`: let in before they came)."""
    if not door.brings_key or not keys:
        return None
    given = door.given_key(carrier)
    if given is not None and match(keys, given) is not None:
        return None
    if given is None:
        return ApiError(401, "this service needs an API key: send it as X-API-Key or 'Authorization: Bearer <key>'", code="unauthorized")
    return ApiError(401, "the API key is wrong", code="unauthorized")


HTTP = Door("http", http_families=True)
"""REST and the Open Inference Protocol over HTTP (:class:`app.doors.layer.HttpDoor`), Ray Serve's replicas too."""
GRPC = GrpcDoor("grpc")
"""The Open Inference Protocol over gRPC (:mod:`app.api.oip_grpc`)."""
JOB = Door("job", consumer=True, brings_key=False)
"""One image of a durable job (:mod:`app.jobs.runner`), its status its answer's; it runs under the key its job was
submitted with, checked by the ``POST /jobs`` that submitted it."""
DOORS = (HTTP, GRPC, JOB)
"""Every door, each once."""
