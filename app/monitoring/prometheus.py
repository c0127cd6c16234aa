"""Prometheus metrics, one registry per app (so several apps can live in one process, as in tests): each part declares
its own families (:mod:`app.processes.metrics`, :mod:`app.doors.metrics`, :mod:`app.worker.metrics`,
:mod:`app.jobs.metrics`, :mod:`app.monitoring.drift_metrics`) and :class:`Metrics` gathers them, with what they share (the
registry, readiness, the device's marks, the drift observations).

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
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from app.doors.metrics import ALERT_STATUSES, LATENCY_BUCKETS, REJECTION_REASONS, DoorMetrics
from app.jobs.metrics import CALLBACK_OUTCOMES, JOB_OUTCOMES, STORE_OPERATIONS, JobMetrics, StoreOperation
from app.monitoring.drift_metrics import CONDITIONS, DRIFT_CLASS_BINS, SHARE_BUCKETS, DriftMetrics
from app.processes.metrics import ProcessMetrics, ready_gauge
from app.worker.device_time import SharedDeviceTime, read_all
from app.worker.metrics import DEVICE_BUSY_HELP, DEVICE_IDLE_HELP, WorkerMetrics

if TYPE_CHECKING:  # the module itself stays light: a server process of several imports it first (not_ready_yet)
    import torch

    from idg_models.compiled import FixedBatchCompiled

__all__ = ["ALERT_STATUSES", "CALLBACK_OUTCOMES", "CONDITIONS", "DRIFT_CLASS_BINS", "EXPECTED_PROCESSES", "HEALTH_PARTS",
           "JOB_OUTCOMES", "LATENCY_BUCKETS", "REJECTION_REASONS", "SHARE_BUCKETS", "STORE_OPERATIONS", "Metrics",
           "StoreOperation", "class_range", "concentration", "exposition", "not_ready_yet", "service_version", "weights_digest"]
"""What the rest imports from here: the metrics of every part, and the labels each part's counters start with."""

HEALTH_PARTS = ("loaded", "worker")
"""The parts of readiness (``idg_ready``, ``/health/ready``): whether the process can answer interactive work. The job
store is none of them: its own gauge, ``idg_durable_job_store_up``, and alert say when it is down."""


def service_version() -> str:
    """The installed idg-service's version ("unknown" from a checkout that was never installed)."""
    try:
        return metadata.version("idg-service")
    except metadata.PackageNotFoundError:
        return "unknown"


class Metrics(ProcessMetrics, DoorMetrics, WorkerMetrics, JobMetrics, DriftMetrics):
    """Every part's metric families, each declared by the part that owns it (the server processes
    :mod:`app.processes.metrics`, the doors :mod:`app.doors.metrics`, the worker :mod:`app.worker.metrics`, the
    durable jobs :mod:`app.jobs.metrics`, the answers and drift :mod:`app.monitoring.drift_metrics`), gathered in one registry
    with prometheus_client's standard metrics (``process_*``, ``python_*``): this process's, or with several server
    processes each live one's, labelled by its ``pid`` (:class:`ServerProcessesCollector`)."""

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
        for declare in (self._declare_process_metrics, self._declare_door_metrics, self._declare_worker_metrics,
                        self._declare_job_metrics, self._declare_drift_metrics):
            declare(r)
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
        self._init_door_labels()
        self._init_worker_labels()
        self._init_job_labels()

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
        """Export a drift reference (:func:`app.monitoring.drift_reference.load_reference`'s) for the drift alerts."""
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
        requests, whence the device's own busy and idle time (:mod:`app.worker.device_time`); None with one process."""
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


def not_ready_yet() -> None:
    """A server process of several says at once that it is not ready (``idg_ready`` 0 in its file), so the minimum
    over the processes is 0 until it is, not only the minimum over the processes already serving."""
    ready_gauge(None).set(0)


class DeviceTimeCollector(Collector):
    """With several server processes: ``idg_device_busy_seconds_total`` and ``idg_device_idle_seconds_total{cause}``,
    the device's own time from the processes' shared files (:mod:`app.worker.device_time`), summed over the devices
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
