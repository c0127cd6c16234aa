"""The server processes' metrics (:mod:`app.processes.launch`): what runs (build, models), how many processes and
replicas should answer, readiness, the request deadline the alerts compare latency with. Declared here, gathered in
the app's one registry by :class:`app.monitoring.prometheus.Metrics`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge


def ready_gauge(registry: CollectorRegistry | None) -> Gauge:
    return Gauge("idg_ready", "1 when models are loaded and warm (in every server process)", registry=registry,
                 multiprocess_mode="livemin")


class ProcessMetrics:
    """The server processes' metric families (a part of :class:`app.monitoring.prometheus.Metrics`)."""

    def _declare_process_metrics(self, r: CollectorRegistry) -> None:
        self.build_info = Gauge("idg_build_info", "1, labelled with the service's version, Python's and PyTorch's",
                                ["version", "python", "torch"], registry=r, multiprocess_mode="livemax")
        self.model_info = Gauge(
            "idg_model_info", "1 per loaded model, labelled with its source, precision and a digest of its weights (the first "
            "12 hex digits of a SHA-256 over its parameters and buffers as loaded: a new digest is a new model version)",
            ["model", "source", "precision", "digest"], registry=r, multiprocess_mode="livemax")
        self.replicas_expected = Gauge(
            "idg_replicas_expected", "Replicas of this service that should answer (IDG_REPLICAS_EXPECTED; 0 when unset: no alert): "
            "fewer up targets than this is IDGReplicasMissing", registry=r, multiprocess_mode="livemax")
        self.request_timeout = Gauge(
            "idg_request_timeout_seconds", "Each request's deadline (IDG_REQUEST_TIMEOUT_S): IDGSlowExplanations fires when the "
            "p99 latency of explanations is over half of it", registry=r, multiprocess_mode="livemax")
        self.processes_expected = Gauge(
            "idg_processes_expected", "Server processes this server should run (IDG_PROCESSES; 1 for one process): "
            "idg_ready_processes below it while above 0 means some are down or still loading", registry=r,
            multiprocess_mode="livemax")
        self.ready = ready_gauge(r)
        self.ready_processes = Gauge("idg_ready_processes", "Server processes ready now (IDG_PROCESSES; auto's second on a GPU "
                                     "joins once the first is warm, and idg_ready is 0 until it has)", registry=r,
                                     multiprocess_mode="livesum")
