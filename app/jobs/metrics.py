"""The durable jobs' metrics (:mod:`app.jobs`): their images by outcome, jobs finished and submitted, the job store's
failed operations and whether it answers, callbacks by outcome. Declared here, gathered in the app's one registry by
:class:`app.monitoring.prometheus.Metrics`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge

JOB_OUTCOMES = ("answered", "failed", "retried", "lost")
StoreOperation = Literal["claim", "upkeep", "release", "finish", "get_job", "callback_sent"]
"""The job store operations counted apart in ``idg_durable_job_store_errors_total`` (the runner's ``_store`` takes one)."""
STORE_OPERATIONS: tuple[StoreOperation, ...] = get_args(StoreOperation)
CALLBACK_OUTCOMES = ("delivered", "refused", "failed")
"""The first word of a callback's outcome (:func:`app.jobs.callbacks.deliver`)."""


class JobMetrics:
    """The durable jobs' metric families (a part of :class:`app.monitoring.prometheus.Metrics`)."""

    def _declare_job_metrics(self, r: CollectorRegistry) -> None:
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

    def _init_job_labels(self) -> None:
        for outcome in JOB_OUTCOMES:
            self.job_images.labels(outcome)
        for operation in STORE_OPERATIONS:
            self.job_store_errors.labels(operation)
        for outcome in CALLBACK_OUTCOMES:
            self.job_callbacks.labels(outcome)

    def init_tenants(self, tenants: Iterable[str]) -> None:
        """Create each tenant's count of submitted jobs at 0: the API keys' names, or "" (no keys)."""
        for tenant in tenants:
            self.jobs_submitted.labels(tenant)
