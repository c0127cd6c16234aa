"""The worker's metrics (:mod:`app.worker`): its queue, its model calls and their rows, the device's busy and idle time
(this process's, and with one process the device's own), the time requests spend in it, device memory and compiled
graphs. Declared here, gathered in the app's one registry by :class:`app.monitoring.prometheus.Metrics`."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.doors.metrics import LATENCY_BUCKETS

DEVICE_BUSY_HELP = (
    "Seconds the device was busy with model calls (until their results were on the host): rate() of it is its busy "
    "fraction. A call running over a second is booked while it runs. With several server processes on the device, the "
    "union of their calls' times (from launch to result, as each host sees them), not their sum")
DEVICE_IDLE_HELP = (
    "Seconds the device had no model call to run, by what it waited for: no_work (no worker held a request: they were "
    "still arriving or being decoded; more clients or more server processes fill it) or host (a worker held requests "
    "and was still preparing their next call: planning, gathering points, booking the last call, the batch wait). With "
    "several server processes, the device's own idle time (no process had a call on it)")
IDLE_CAUSES = ("no_work", "host")


class WorkerMetrics:
    """The worker's metric families (a part of :class:`app.monitoring.prometheus.Metrics`)."""

    multiprocess: Path | None
    """Several server processes share this folder of metrics: the device's own time comes from their shared files."""

    def _declare_worker_metrics(self, r: CollectorRegistry) -> None:
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
        self.job_seconds = Histogram(
            "idg_job_seconds", "Time in the worker per request, by kind", ["kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.device_memory = Gauge("idg_device_memory_bytes", "Device memory: CUDA allocated and peak (summed over the server "
                                   "processes)", ["device", "kind"], registry=r, multiprocess_mode="livesum")
        self.compile_seconds = Gauge("idg_compile_seconds", "Start-up seconds spent compiling a model's graphs (IDG_COMPILE)",
                                     ["model"], registry=r, multiprocess_mode="livemax")
        self.compile_late_graphs = Gauge(
            "idg_compile_late_graphs", "Graphs compiled after warm-up, under traffic (should stay 0: calls are padded to the "
            "compiled batch sizes)", ["model"], registry=r, multiprocess_mode="livesum")

    def _init_worker_labels(self) -> None:
        for cause in IDLE_CAUSES:
            self.process_device_idle.labels(cause)
            if not self.multiprocess:
                self.device_idle.labels(cause)
