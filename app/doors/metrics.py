"""The doors' metrics (:mod:`app.doors.layer`): every door's requests by route and status and their latency, HTTP's also
under their first names, the refusals by reason (the worker's and the doors' own) and the slow clients' closed
connections. Declared here, gathered in the app's one registry by :class:`app.monitoring.prometheus.Metrics`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

ALERT_STATUSES = ("200", "500", "503", "504")
"""The HTTP statuses each route's counters start at 0 with: those the alerts count (the answers, the server's own
failures and the refusals)."""
REJECTION_REASONS = ("queue_full", "stalled", "stuck", "deadline", "shutting_down", "client_disconnected", "key_share",
                     "message_too_large")
"""Why requests were refused or dropped (``idg_rejections_total``): the worker's (its queue full, stalled, stuck, the
deadline, the shutdown, the client gone) and the doors' (an API key past its share of the queue, every door's; a gRPC
message over ``IDG_MAX_UPLOAD_BYTES``)."""
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560)
"""Up to 2560 s: the IDGSlowExplanations alert compares the p99 with half the request deadline (IDG_REQUEST_TIMEOUT_S),
which a histogram ending at 160 s could not reach past a deadline of 320 s."""


class DoorMetrics:
    """The doors' metric families (a part of :class:`app.monitoring.prometheus.Metrics`)."""

    def _declare_door_metrics(self, r: CollectorRegistry) -> None:
        self.requests = Counter("idg_http_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.latency = Histogram("idg_http_request_seconds", "HTTP latency by route", ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.door_requests = Counter(
            "idg_requests", "Requests by door (http, grpc, job), route (an HTTP route, a gRPC method, 'image' for a job's "
            "image) and status (the HTTP status, or the gRPC status code's name)", ["door", "route", "status"], registry=r)
        self.door_latency = Histogram("idg_request_seconds", "Request latency by door and route", ["door", "route"],
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.rejections = Counter(
            "idg_rejections", "Requests refused or dropped, by reason: the worker's (queue_full, stalled, stuck, deadline, "
            "shutting_down, client_disconnected) and the doors' (key_share: an API key past its share of the queue, over "
            "HTTP or gRPC; message_too_large: a gRPC message over IDG_MAX_UPLOAD_BYTES), each also counted under the route "
            "or RPC it refused", ["reason"], registry=r)
        self.read_timeouts = Counter(
            "idg_read_timeouts", "Connections closed because the client was too slow sending its request, by phase (headers, body)",
            ["phase"], registry=r)

    def _init_door_labels(self) -> None:
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason)
        for phase in ("headers", "body"):
            self.read_timeouts.labels(phase)
