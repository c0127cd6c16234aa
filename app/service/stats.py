"""Per-model counts of the work the service submitted, as Triton's statistics extension reports them
(``GET /v2/models/stats``): how many submissions succeeded and failed, and the nanoseconds they spent from the
request's arrival, waiting in the queue and computing. A submission is one image's prediction or explanation (a
prediction then its explanation counts twice): Triton's ``inference_count``. Its ``execution_count`` is the model's
executions, the worker's model calls (:attr:`app.monitoring.prometheus.Metrics.executions`): one call runs the rows of many
images and requests together (a batch), and an explanation's steps take several. Updated on the event loop only: no lock."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)

    def json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    """One model's counts since the process started."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute: Duration = field(default_factory=Duration)
    last_inference_ms: int = 0

    def succeeded(self, total_s: float, queued_s: float, compute_s: float) -> None:
        self.success.add(total_s)
        self.queue.add(queued_s)
        self.compute.add(compute_s)
        self.last_inference_ms = int(time.time() * 1000)

    def failed(self, total_s: float) -> None:
        self.fail.add(total_s)

    def triton(self, name: str, version: str, executions: int) -> dict[str, Any]:
        """Triton's ``ModelStatistics`` as its JSON, ``executions`` the model calls run (Triton's ``execution_count``: a
        batch is one, whatever images it holds); the host stages it has no counterpart for here at 0."""
        none = Duration().json()
        return {
            "name": name, "version": version, "last_inference": self.last_inference_ms,
            "inference_count": self.success.count, "execution_count": executions,
            "inference_stats": {
                "success": self.success.json(), "fail": self.fail.json(), "queue": self.queue.json(),
                "compute_input": {"count": self.compute.count, "ns": 0}, "compute_infer": self.compute.json(),
                "compute_output": {"count": self.compute.count, "ns": 0}, "cache_hit": none, "cache_miss": none,
            },
            "batch_stats": [],
        }
