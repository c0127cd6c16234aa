"""Prometheus metrics, one registry per app (so several apps can live in one process, as in tests).

With several server processes (``IDG_PROCESSES``), ``python -m app.server`` sets ``PROMETHEUS_MULTIPROC_DIR``
before it starts them: prometheus_client then keeps every value in a file per process there, and
:func:`exposition` answers the sum over all of them (a gauge by its ``multiprocess_mode``: ``livesum`` over
the live processes, ``livemin`` for readiness, ``livemax`` for a start-up cost), whichever process the
scrape reached.

Every labelled counter is created at 0 at start-up for every label value it can take (each route with the statuses the
alerts count, each model and its class ranges, each rejection reason, job image outcome, job store operation, callback
outcome and tenant), so ``rate()`` and ``increase()`` see the first failure after a start (a series that appears at 1 has
no earlier sample to count from); tests/service/test_counters_at_start.py enumerates them."""

from __future__ import annotations

import hashlib
import os
import platform
import threading
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from app.core.device_time import SharedDeviceTime, read_all

if TYPE_CHECKING:  # the module itself stays light: a server process of several imports it first (not_ready_yet)
    import torch

    from idg_models.compiled import FixedBatchCompiled

# the labels known at start: every route with the statuses the alerts count (the answers, the server's own failures and
# the refusals), each rejection reason (app.worker), durable-job outcome, job store operation (app.jobs.runner), callback
# outcome (app.jobs.callbacks) and tenant (the API keys' names)
ALERT_STATUSES = ("200", "500", "503", "504")
REJECTION_REASONS = ("queue_full", "stalled", "stuck", "deadline", "shutting_down", "client_disconnected", "key_share",
                     "message_too_large")
"""Why requests were refused or dropped (``idg_rejections_total``): the worker's (its queue full, stalled, stuck, the
deadline, the shutdown, the client gone) and the doors' (an API key past its share of the queue, every door's; a gRPC
message over ``IDG_MAX_UPLOAD_BYTES``)."""
JOB_OUTCOMES = ("answered", "failed", "retried", "lost")
StoreOperation = Literal["claim", "upkeep", "release", "finish", "get_job", "callback_sent"]
"""The job store operations counted apart in ``idg_durable_job_store_errors_total`` (the runner's ``_store`` takes one)."""
STORE_OPERATIONS: tuple[StoreOperation, ...] = get_args(StoreOperation)
CALLBACK_OUTCOMES = ("delivered", "refused", "failed")
"""The first word of a callback's outcome (:func:`app.jobs.callbacks.deliver`)."""
CONDITIONS = ("held", "not_held", "none")
HEALTH_PARTS = ("loaded", "worker")
"""The parts of readiness (``idg_ready``, ``/health/ready``): whether the process can answer interactive work. The job
store is none of them: its own gauge, ``idg_durable_job_store_up``, and alert say when it is down."""

DRIFT_CLASS_BINS = 20
SHARE_BUCKETS = tuple(i / 20 for i in range(1, 21))

DEVICE_BUSY_HELP = (
    "Seconds the device was busy with model calls (until their results were on the host): rate() of it is its busy "
    "fraction. A call running over a second is booked while it runs. With several server processes on the device, the "
    "union of their calls' times (from launch to result, as each host sees them), not their sum")
DEVICE_IDLE_HELP = (
    "Seconds the device had no model call to run, by what it waited for: no_work (no worker held a request: they were "
    "still arriving or being decoded; more clients or more server processes fill it) or host (a worker held requests "
    "and was still preparing their next call: planning, gathering points, booking the last call, the batch wait). With "
    "several server processes, the device's own idle time (no process had a call on it)")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560)
"""Up to 2560 s: the IDGSlowExplanations alert compares the p99 with half the request deadline (IDG_REQUEST_TIMEOUT_S),
which a histogram ending at 160 s could not reach past a deadline of 320 s."""


def service_version() -> str:
    """The installed idg-service's version ("unknown" from a checkout that was never installed)."""
    try:
        return metadata.version("idg-service")
    except metadata.PackageNotFoundError:
        return "unknown"


class Metrics:
    """Counters and histograms of the HTTP side and of the worker, and prometheus_client's standard metrics
    (``process_*``, ``python_*``): this process's, or with several server processes each live one's, labelled by its
    ``pid`` (:class:`ServerProcessesCollector`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self.multiprocess = Path(folder) if folder else None
        """Several server processes share this folder of metrics (``python -m app.server`` with ``IDG_PROCESSES``)."""
        if not self.multiprocess:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
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
        self.requests = Counter("idg_http_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.latency = Histogram("idg_http_request_seconds", "HTTP latency by route", ["route"], buckets=LATENCY_BUCKETS, registry=r)
        # every door's requests (app.core.door): the HTTP ones above are also counted here, with gRPC's and the job images'
        self.door_requests = Counter(
            "idg_requests", "Requests by door (http, grpc, job), route (an HTTP route, a gRPC method, 'image' for a job's "
            "image) and status (the HTTP status, or the gRPC status code's name)", ["door", "route", "status"], registry=r)
        self.door_latency = Histogram("idg_request_seconds", "Request latency by door and route", ["door", "route"],
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("idg_queue_depth", "Requests admitted and not finished (queued or running)", registry=r,
                                 multiprocess_mode="livesum")
        self.batch_images = Histogram("idg_batch_images", "Images per model call", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.batch_requests = Histogram(
            "idg_batch_requests", "Requests sharing one worker round", buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.model_calls = Counter("idg_model_calls", "Model calls by model", ["model"], registry=r)
        self.call_rows = Counter("idg_call_rows", "Rows of model calls by model: real (path points) or padding up to a fixed call "
                                 "size (IDG_FIXED_CALL_SIZES)", ["model", "kind"], registry=r)
        self.unwarmed_calls = Gauge("idg_unwarmed_calls", "Model calls since ready at a batch size the warm-up did not run (with "
                                    "fixed call sizes this stays 0; each such call may cost cuDNN seconds on a GPU)", ["model"],
                                    registry=r, multiprocess_mode="livesum")
        self.process_device_busy = Counter(
            "idg_process_device_busy_seconds", "Seconds the worker spent in model calls (until their results were on the host), "
            "summed over the server processes: where several share one device their calls overlap there and this passes 1 a "
            "second (idg_device_busy_seconds_total is the device's own)", registry=r)
        self.process_device_idle = Counter(
            "idg_process_device_idle_seconds", "Seconds between a process's own model calls, by what it waited for (see "
            "idg_device_idle_seconds_total), summed over the server processes: the others' calls may fill them", ["cause"],
            registry=r)
        if not self.multiprocess:  # several processes: the device's own, from their shared file (exposition)
            self.device_busy = Counter("idg_device_busy_seconds", DEVICE_BUSY_HELP, registry=r)
            self.device_idle = Counter("idg_device_idle_seconds", DEVICE_IDLE_HELP, ["cause"], registry=r)
        self.rejections = Counter(
            "idg_rejections", "Requests refused or dropped, by reason: the worker's (queue_full, stalled, stuck, deadline, "
            "shutting_down, client_disconnected) and the doors' (key_share: an API key past its share of the queue, over "
            "HTTP or gRPC; message_too_large: a gRPC message over IDG_MAX_UPLOAD_BYTES), each also counted under the route "
            "or RPC it refused", ["reason"], registry=r)
        self.job_seconds = Histogram(
            "idg_job_seconds", "Time in the worker per request, by kind", ["kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.job_images = Counter(
            "idg_durable_job_images", "Images of durable jobs (POST /jobs) this process handled, by outcome: answered (a 200 "
            "answer stored), failed (an error answer stored), retried (given back to the store to try later: busy, deadline, "
            "shutdown), lost (its claim was lost: the job was deleted or another process took it over)", ["outcome"], registry=r)
        self.jobs_finished = Counter("idg_durable_jobs_finished", "Durable jobs whose last image this process answered", registry=r)
        self.job_store_errors = Counter(
            "idg_durable_job_store_errors", "Job store operations that failed (the store unreachable or refusing), by operation",
            ["operation"], registry=r)
        self.jobs_submitted = Counter("idg_durable_jobs_submitted", "Durable jobs submitted, by the name of the API key that "
                                      "submitted them (empty without keys)", ["tenant"], registry=r)
        self.job_callbacks = Counter("idg_durable_job_callbacks", "Job callbacks by outcome: delivered (answered 2xx), "
                                     "refused (4xx), failed (a 3xx, 5xx, 408, 425, 429 or no answer at every try)", ["outcome"], registry=r)
        self.job_store_up = Gauge("idg_durable_job_store_up", "1 while the job store answers, 0 from a failed operation (unreachable, "
                                  "or locked past IDG_JOBS_STORE_TIMEOUT_S) until one succeeds again", registry=r,
                                  multiprocess_mode="livemin")
        self.job_images_in_flight = Gauge("idg_durable_job_images_in_flight", "Images of durable jobs in the workers now",
                                          registry=r, multiprocess_mode="livesum")
        self.device_memory = Gauge("idg_device_memory_bytes", "Device memory: CUDA allocated and peak (summed over the server "
                                   "processes)", ["device", "kind"], registry=r, multiprocess_mode="livesum")
        self.ready = _ready_gauge(r)
        self.ready_processes = Gauge("idg_ready_processes", "Server processes ready now (IDG_PROCESSES; auto's second on a GPU "
                                     "joins once the first is warm, and idg_ready is 0 until it has)", registry=r,
                                     multiprocess_mode="livesum")
        self.faithfulness = Histogram(
            "idg_faithfulness", "Faithfulness scores of returned maps (insertion / deletion AUC in [0, 1]) by model, method and metric",
            ["model", "method", "metric"], buckets=tuple(i / 20 for i in range(1, 21)), registry=r)
        self.predictions = Counter(
            "idg_predictions", "Predictions answered by /predict, by model and explain_if outcome (held, not_held, none: no condition)",
            ["model", "condition"], registry=r)
        self.explanations = Counter("idg_explanations", "Explanations returned by /predict because explain_if held, by model",
                                    ["model"], registry=r)
        self.read_timeouts = Counter(
            "idg_read_timeouts", "Connections closed because the client was too slow sending its request, by phase (headers, body)",
            ["phase"], registry=r)
        self.compile_seconds = Gauge("idg_compile_seconds", "Start-up seconds spent compiling a model's graphs (IDG_COMPILE)",
                                     ["model"], registry=r, multiprocess_mode="livemax")
        self.compile_late_graphs = Gauge(
            "idg_compile_late_graphs", "Graphs compiled after warm-up, under traffic (should stay 0: calls are padded to the "
            "compiled batch sizes)", ["model"], registry=r, multiprocess_mode="livesum")
        # drift: what the model predicts and how its explanations look, by model, compared with the reference by the rules
        self.predicted_classes = Counter(
            "idg_predicted_classes", f"Predictions by model and top-1 class: the class index for a model of at most "
            f"{DRIFT_CLASS_BINS} classes, else the range of indices (1/{DRIFT_CLASS_BINS} of them) it falls in: a fixed set "
            "of labels per model, comparable over time", ["model", "classes"], registry=r)
        self.confidence = Histogram("idg_prediction_confidence", "Top-1 probability of each prediction, by model", ["model"],
                                    buckets=SHARE_BUCKETS, registry=r)
        self.concentration = Histogram(
            "idg_attribution_concentration", "Share of each explanation's attribution mass (|attribution| summed over "
            "channels) in its top 5% of pixels, by model: 0.05 for a map spread evenly, 1 for one on a few pixels",
            ["model"], buckets=SHARE_BUCKETS, registry=r)
        # the drift reference (IDG_DRIFT_REFERENCE, app.core.drift_reference): what the drift alerts compare traffic with
        self.drift_reference_classes = Gauge(
            "idg_drift_reference_class_share", "Share of the reference's predictions (IDG_DRIFT_REFERENCE) in each class range "
            "of idg_predicted_classes_total, by model", ["model", "classes"], registry=r, multiprocess_mode="livemax")
        self.drift_reference = Gauge(
            "idg_drift_reference", "The reference's mean (IDG_DRIFT_REFERENCE) by model and quantity: confidence (the top-1 "
            "probability, idg_prediction_confidence) or concentration (idg_attribution_concentration)", ["model", "quantity"],
            registry=r, multiprocess_mode="livemax")
        self.drift_reference_faithfulness = Gauge(
            "idg_drift_reference_faithfulness", "The reference's mean faithfulness (IDG_DRIFT_REFERENCE) by model, method and "
            "metric (idg_faithfulness)", ["model", "method", "metric"], registry=r, multiprocess_mode="livemax")
        self.executions: dict[str, int] = {}
        """Model calls run per model in this process (:meth:`model_called`): Triton's ``execution_count``."""
        self._num_classes: dict[str, int] = {}
        self._compiled: dict[str, FixedBatchCompiled] = {}
        self._health = dict.fromkeys(HEALTH_PARTS, True) | {"loaded": False}
        self._health_lock = threading.Lock()
        self._init_labels()

    def _init_labels(self) -> None:
        import torch  # imported by then in every process that builds an app

        self.build_info.labels(service_version(), platform.python_version(), torch.__version__).set(1)
        self.processes_expected.set(int(os.environ.get(EXPECTED_PROCESSES, "1")))
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason)
        for outcome in JOB_OUTCOMES:
            self.job_images.labels(outcome)
        for operation in STORE_OPERATIONS:
            self.job_store_errors.labels(operation)
        for outcome in CALLBACK_OUTCOMES:
            self.job_callbacks.labels(outcome)
        for cause in ("no_work", "host"):
            self.process_device_idle.labels(cause)
            if not self.multiprocess:
                self.device_idle.labels(cause)
        for phase in ("headers", "body"):
            self.read_timeouts.labels(phase)

    def init_tenants(self, tenants: Iterable[str]) -> None:
        """Create each tenant's count of submitted jobs at 0: the API keys' names, or "" (no keys)."""
        for tenant in tenants:
            self.jobs_submitted.labels(tenant)

    def init_routes(self, routes: Iterable[str]) -> None:
        """Create each route's request counters at 0 for the statuses the alerts count (:data:`ALERT_STATUSES`)."""
        for route in routes:
            for status in ALERT_STATUSES:
                self.requests.labels(route, status)

    def init_models(self, models: Mapping[str, object]) -> None:
        """Create each loaded model's counters at 0 (its class ranges too, where it says how many classes it has)."""
        for name, model in models.items():
            classes = getattr(model, "num_classes", None)
            if isinstance(classes, int) and classes > 0:
                self._num_classes[name] = classes
                for b in range(min(classes, DRIFT_CLASS_BINS)):
                    self.predicted_classes.labels(name, class_range(b, classes))
            self.model_calls.labels(name)
            self.explanations.labels(name)
            for kind in ("real", "padding"):
                self.call_rows.labels(name, kind)
            for condition in CONDITIONS:
                self.predictions.labels(name, condition)

    def model_called(self, model: str, calls: int = 1) -> None:
        """``calls`` model calls of ``model`` ran (the worker's thread): ``idg_model_calls_total`` and the statistics'
        executions (:attr:`executions`)."""
        self.model_calls.labels(model).inc(calls)
        self.executions[model] = self.executions.get(model, 0) + calls

    def observe_prediction(self, model: str, probs: torch.Tensor) -> dict[str, object]:
        """The drift metrics of one prediction, ``probs`` every class probability on the host; what they saw
        (class, probability)."""
        top = int(probs.argmax())
        n = self._num_classes.get(model, probs.numel())
        probability = float(probs[top])
        self.predicted_classes.labels(model, class_range(top * min(n, DRIFT_CLASS_BINS) // n, n)).inc()
        self.confidence.labels(model).observe(probability)
        return {"event": "prediction", "class": top, "probability": round(probability, 4)}

    def observe_explanation(self, model: str, attributions: torch.Tensor, target: int,
                            scores: Mapping[str, float]) -> dict[str, object]:
        """The drift metrics of one explanation, ``attributions`` its map on the host (``(C, H, W)``); what they saw
        (target, concentration, faithfulness scores)."""
        share = concentration(attributions)
        if share is not None:
            self.concentration.labels(model).observe(share)
        return {"event": "explanation", "concentration": None if share is None else round(share, 4), "target": target,
                **{f"faithfulness_{k}": round(v, 4) for k, v in scores.items()}}

    def set_drift_reference(self, reference: Mapping[str, Any]) -> None:
        """Export a drift reference (:func:`app.core.drift_reference.load_reference`'s) for the drift alerts."""
        for model, ref in reference["models"].items():
            for classes, share in ref["classes"].items():
                self.drift_reference_classes.labels(model, classes).set(share)
            self.drift_reference.labels(model, "confidence").set(ref["confidence"])
            if ref.get("concentration") is not None:
                self.drift_reference.labels(model, "concentration").set(ref["concentration"])
            for method, scores in ref.get("faithfulness", {}).items():
                for metric, value in scores.items():
                    self.drift_reference_faithfulness.labels(model, method, metric).set(value)

    def set_model_info(self, name: str, source: str, precision: str, digest: str) -> None:
        self.model_info.labels(name, source, precision, digest).set(1)

    def set_ready(self, ready: bool) -> None:
        """This process's models loaded and warm and it is not draining (or not): see :meth:`set_health`."""
        self.set_health(loaded=ready)

    def set_health(self, **parts: bool) -> None:
        """Parts of this process's readiness (:data:`HEALTH_PARTS`): ``loaded`` (models loaded and warm, not draining) and
        ``worker`` (not stuck past a deadline), as ``/health/ready`` answers them. ``idg_ready`` and this process's
        count in ``idg_ready_processes`` are 1 only while every part is true (written only when that changes)."""
        unknown = set(parts) - set(HEALTH_PARTS)
        if unknown:
            raise ValueError(f"unknown readiness parts {sorted(unknown)}, expected some of {HEALTH_PARTS}")
        with self._health_lock:
            before = all(self._health.values())
            self._health.update(parts)
            ready = all(self._health.values())
            if ready != before or "loaded" in parts:  # loaded: the first write (start-up) and every transition it makes
                self.ready.set(int(ready))
                self.ready_processes.set(int(ready))

    @property
    def health(self) -> dict[str, bool]:
        with self._health_lock:
            return dict(self._health)

    def track_compiled(self, model: str, part: FixedBatchCompiled) -> None:
        """Export a compiled model's start-up cost and its count of graphs compiled under traffic (brought up to
        date after each of its calls, :meth:`after_call`: a value, not a function, so a multiprocess scrape sees it)."""
        self._compiled[model] = part
        self.compile_seconds.labels(model).set(part.compile_seconds or 0.0)
        self.compile_late_graphs.labels(model).set(part.late_graphs)

    def after_call(self, model: str, unwarmed_calls: int) -> None:
        """The gauges a model call may have moved."""
        self.unwarmed_calls.labels(model).set(unwarmed_calls)
        if (part := self._compiled.get(model)) is not None:
            self.compile_late_graphs.labels(model).set(part.late_graphs)

    def book_busy(self, seconds: float) -> None:
        """This process's device busy time (its calls; with one process, the device's too)."""
        self.process_device_busy.inc(seconds)
        if not self.multiprocess:
            self.device_busy.inc(seconds)

    def book_idle(self, no_work: float, host: float) -> None:
        """An idle gap between this process's calls, split by what it waited for (with one process, the device's too)."""
        for cause, seconds in (("no_work", no_work), ("host", host)):
            self.process_device_idle.labels(cause).inc(seconds)
            if not self.multiprocess:
                self.device_idle.labels(cause).inc(seconds)

    def device_marks(self, device: object) -> SharedDeviceTime | None:
        """With several server processes: the file where this process marks its calls on ``device`` and whether it holds
        requests, whence the device's own busy and idle time (:mod:`app.core.device_time`); None with one process."""
        if self.multiprocess is None:
            return None
        return SharedDeviceTime.of(self.multiprocess, str(device))

    def sample_device_memory(self, device: torch.device) -> None:
        if device.type == "cuda":
            import torch

            self.device_memory.labels(str(device), "allocated").set(torch.cuda.memory_allocated(device))
            self.device_memory.labels(str(device), "peak").set(torch.cuda.max_memory_allocated(device))


def class_range(b: int, classes: int) -> str:
    """The label of bin ``b`` of a model's ``classes`` (see ``idg_predicted_classes``): "7", or "50-99"."""
    bins = min(classes, DRIFT_CLASS_BINS)
    if bins == classes:
        return str(b)
    lo, hi = -(-b * classes // bins), -(-(b + 1) * classes // bins) - 1
    return f"{lo}-{hi}"


def concentration(attributions: torch.Tensor, top: float = 0.05) -> float | None:
    """Share of ``attributions``' mass (``(C, H, W)`` or ``(H, W)``: absolute values summed over channels) in its ``top``
    share of pixels; None for a map with no mass or not finite."""
    import numpy as np

    a = attributions.detach().float().abs()
    m = (a.sum(0) if a.dim() == 3 else a).flatten().cpu().numpy()
    total = float(m.sum(dtype=np.float64))
    if not total > 0 or total == float("inf"):
        return None
    k = max(1, round(top * m.size))
    # the k largest by a partial sort: 0.2 ms for a 224-pixel map where torch's topk took 1 ms of an image thread
    return min(1.0, float(np.partition(m, m.size - k)[m.size - k :].sum(dtype=np.float64)) / total)


def weights_digest(module: torch.nn.Module) -> str:
    """The first 12 hex digits of a SHA-256 over ``module``'s parameters and buffers (names, shapes, dtypes, bytes)."""
    import torch

    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:12]


EXPECTED_PROCESSES = "IDG_PROCESSES_EXPECTED"
"""Set by ``python -m app.server``'s launcher for its processes: how many it runs (``idg_processes_expected``)."""


def _ready_gauge(registry: CollectorRegistry | None) -> Gauge:
    return Gauge("idg_ready", "1 when models are loaded and warm (in every server process)", registry=registry,
                 multiprocess_mode="livemin")


def not_ready_yet() -> None:
    """A server process of several says at once that it is not ready (``idg_ready`` 0 in its file), so the minimum
    over the processes is 0 until it is, not only the minimum over the processes already serving."""
    _ready_gauge(None).set(0)


class DeviceTimeCollector(Collector):
    """With several server processes: ``idg_device_busy_seconds_total`` and ``idg_device_idle_seconds_total{cause}``,
    the device's own time from the processes' shared files (:mod:`app.core.device_time`), summed over the devices
    there are files for (one: the processes of a server share its device)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def collect(self) -> Iterable[Metric]:
        devices = read_all(self.folder).values()
        busy = CounterMetricFamily("idg_device_busy_seconds", DEVICE_BUSY_HELP)
        busy.add_metric([], sum(d["busy"] for d in devices))
        idle = CounterMetricFamily("idg_device_idle_seconds", DEVICE_IDLE_HELP, labels=["cause"])
        for cause in ("no_work", "host"):
            idle.add_metric([cause], sum(d[cause] for d in devices))
        return [busy, idle]


class ServerProcessesCollector(Collector):
    """With several server processes: prometheus_client's ``process_*`` metrics (memory, CPU, open files, start time) of
    each live one, read from its ``/proc`` entry at the scrape and labelled with its ``pid``, and ``python_info`` once
    (the processes run one Python). A process that died is gone from the next scrape. The ``python_gc_*`` metrics are a
    process's own state (not in ``/proc``) and are left out."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for pid in live_pids(self.folder):
            for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():  # type: ignore[misc]
                out = families.setdefault(family.name, Metric(family.name, family.documentation, family.type, family.unit))
                for sample in family.samples:
                    out.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        return [*families.values(), *PlatformCollector(registry=None).collect()]


def live_pids(folder: Path) -> list[int]:
    """The server processes alive now: those with a file of live gauges in ``folder`` (the launcher deletes a dead one's,
    ``mark_process_dead``) and a ``/proc`` entry."""
    pids = {path.stem.rsplit("_", 1)[-1] for path in folder.glob("gauge_live*_*.db")}
    return sorted(int(pid) for pid in pids if pid.isdigit() and Path(f"/proc/{pid}").exists())


def exposition(registry: CollectorRegistry) -> bytes:
    """``/metrics``: this app's registry, or with ``PROMETHEUS_MULTIPROC_DIR`` set, every server process's values and
    the device's own time (:class:`DeviceTimeCollector`)."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        every = CollectorRegistry()
        MultiProcessCollector(every)
        every.register(DeviceTimeCollector(Path(folder)))
        every.register(ServerProcessesCollector(Path(folder)))
        return generate_latest(every)
    return generate_latest(registry)
