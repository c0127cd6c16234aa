"""The typed requests every door builds once and hands to :class:`app.service.Service`: what runs (the model, the
method with its checked parameters, post-steps, metrics and cost bound) and for whom (its arrival, deadline,
client and priority). They are frozen: built and checked once, then read by the service and the worker only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from app.core.deadline import deadline_of
from app.schemas import AttributeCommon
from app.service.explain_if import Condition
from app.service.planning import AttributePlan
from idg_models import ImageClassifier

UntilDisconnected = Callable[[], Awaitable[None]]
"""Returns once the request's client has gone away (never, while it stays): see
:func:`app.api.requests.until_disconnected`."""
OnEvent = Callable[[dict[str, Any]], None]
"""Where a request's progress events go (``queued``, ``started``, ``progress``): /attribute/stream's."""
Image = bytes | Tensor
"""One image of a request: an encoded file (decoded by the service, within the deadline), or ``(3, S, S)`` pixels
in [0, 1] on the CPU, as the model's crop (the Open Inference Protocol's ``input``)."""

PREDICT_PRIORITY = 0
ATTRIBUTE_PRIORITY = 1
BACKGROUND_PRIORITY = 2
"""The worker's priorities: predictions first, then attributions, then background work (the images of jobs)."""


@dataclass(frozen=True)
class RequestContext:
    """Who a request's work runs for: when it arrived (``received``, its ``time.perf_counter()``) and how long it may
    take from then (``timeout``, seconds: its deadline counts from arrival, decoding and queueing included), its
    client (``until_disconnected`` returns once it went away), where its progress events go, and its priority
    (None: predictions before attributions; :data:`BACKGROUND_PRIORITY` for a job's images)."""

    received: float
    timeout: float
    until_disconnected: UntilDisconnected | None = None
    on_event: OnEvent | None = None
    priority: int | None = None

    def deadline(self) -> float:
        """The ``time.monotonic()`` by which the request must be answered."""
        return deadline_of(self.received, self.timeout)

    def priority_of(self, default: int) -> int:
        return default if self.priority is None else self.priority


@dataclass(frozen=True)
class ExplainRequest:
    """An attribution request, checked: the model, the request's parameters (what to render) and ``planned``, what
    it runs (the method's checked parameters, the post-steps, the faithfulness metrics, the most it may cost)."""

    name: str
    model: ImageClassifier
    params: AttributeCommon
    planned: AttributePlan
    context: RequestContext

    @property
    def method(self) -> str:
        return self.params.method


@dataclass(frozen=True)
class PredictRequest:
    """A prediction request, checked: the model, how many classes to answer and, for predict-then-explain, the
    condition on the prediction (:mod:`app.service.explain_if`) and the explanation it runs when it holds."""

    name: str
    model: ImageClassifier
    top_k: int
    context: RequestContext
    condition: Condition | None = None
    explain: ExplainRequest | None = None
