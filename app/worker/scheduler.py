"""The scheduling rules: which rows go into the next model call. Pure: no threads, no clock, no device;
given the jobs that wait and whether calls are on the device, :meth:`Scheduler.select` decides the next
call (its model, its kind and the rows each job gives it), so the rules are tested without a worker
(tests/service/test_scheduler.py). The worker's device loop (:mod:`app.worker.engine`) asks it before
every call.

The rules, in order:

- **Background work waits for a request's next step.** A call of only background rows (priority
  :data:`BACKGROUND`: durable jobs' images) is not queued behind a call that holds a request's rows:
  the request's next step goes first (at the cost of a short device gap).
- **Most urgent first, then the oldest.** Jobs are ordered by (priority, arrival): ``/predict`` (0)
  before attributions (1) before background work (2).
- **Models take turns** (:meth:`Scheduler.next_model`) among those with work at the most urgent
  priority, so a slow model with a long queue takes every other call, not every call.
- **Kinds take turns** (:meth:`Scheduler.next_kind`): one call is forward-only or with gradients; a job
  left out of a call for needing the other kind decides the kind of the next one.
- **Size**: at most ``call_images`` rows, the model's own ``max_batch`` and the largest warmed size;
  with fixed call sizes, the size that pads least for the rows available (:meth:`CallShapes.fill`).
- **Alone**: a job marked ``alone`` (a method whose answer follows the last bits of its gradients, Guided IG)
  shares no call: a call holds its rows only, sized by them (a call's size changes its gradients' last bits, so
  its map is the one it gets with nothing else running). Such calls and shared calls of one model take turns while
  both have work at the most urgent priority (the first call goes to the older), and the jobs marked alone take
  turns among themselves (the one served longest ago first): one Guided IG request does not hold every newer
  request of its kind for its whole run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from idg_core.call_shapes import CallShapes
from idg_core.model_calls import Rows
from idg_core.types import Query

BACKGROUND = 2
"""Priority of background work (durable jobs' images): a call of only such rows is not queued behind a call
that holds a request's rows, so the request's next step goes first (at the cost of a short device gap)."""


class Schedulable(Protocol):
    """What the scheduler reads of a job (:class:`app.worker.jobs.Job`), and the one thing it changes:
    the rows it takes into the call (``take``) and ``passed_over``."""

    model: str
    priority: int
    enqueued: float
    cancel_reason: str | None
    in_flight: int
    passed_over: int
    pending: list[Query] | None
    taken: int
    alone: bool
    served: int

    @property
    def rows(self) -> int: ...

    @property
    def next_grad(self) -> bool: ...

    def take(self, budget: int | None = None, grad: bool | None = None) -> Rows: ...

    def ready_rows(self, grad: bool) -> int: ...


J = TypeVar("J", bound=Schedulable)


@dataclass
class Selection(Generic[J]):
    """The next model call: its model, its kind (gradient or not) and the rows each job gives it."""

    model: str
    grad: bool
    work: list[tuple[J, Rows]] = field(default_factory=list)


class Scheduler:
    """Decides each model call from the jobs that wait. Its only state is the model of the last call
    (models take turns)."""

    def __init__(self, models: Sequence[str], call_images: int, *, max_batch: Mapping[str, int | None] | None = None,
                 shapes: Mapping[str, CallShapes] | None = None) -> None:
        self.models = list(models)
        self.call_images = max(1, call_images)
        self.max_batch = dict(max_batch or {})
        """A model's own limit on images per call (``model.max_batch``), where it has one."""
        self.shapes = {name: (shapes or {}).get(name) or CallShapes() for name in self.models}
        self.last_model: str | None = None
        self.calls = 0
        """Calls selected so far; a job's ``served`` is the number of the last that took its rows."""
        self.alone_last: dict[str, bool] = {}
        """Per model, whether its last call was a job's alone: such calls and shared ones take turns."""

    def select(self, active: Sequence[J], calls_in_flight: bool) -> Selection[J] | None:
        """The next call from the ``active`` jobs (rows are taken from them), or None: nothing to run now
        (no rows, or only background rows while a request's rows are in a call on the device)."""
        waiting = [j for j in active if j.rows and j.cancel_reason is None]
        if not waiting:
            return None
        if (calls_in_flight and min(j.priority for j in waiting) >= BACKGROUND
                and any(j.priority < BACKGROUND and j.in_flight for j in active)):
            return None  # a request waits on a call in flight: its next step must not queue behind background work
        ordered = sorted(waiting, key=lambda j: (j.priority, j.enqueued))
        model = self.next_model(ordered)
        mine = [j for j in ordered if j.model == model]
        grad = self.next_kind(mine)
        if any(j.alone for j in mine):
            joining: set[J] | None = set(self.joining(model, [j for j in mine if j.next_grad == grad]))
        else:  # the common case, at the cost it had before jobs could be alone: a shared call
            joining, self.alone_last[model] = None, False
        self.calls += 1
        budget = self.call_size(model, sum(j.ready_rows(grad) for j in (mine if joining is None else joining)))
        selection: Selection[J] = Selection(model, grad)
        for job in mine:
            if job.next_grad != grad:
                job.passed_over += 1  # the next call is of its kind (at its priority)
            elif budget > 0 and (joining is None or job in joining):
                job.passed_over, job.served = 0, self.calls
                rows = job.take(budget, grad)
                budget -= sum(b - a for _, a, b in rows)
                selection.work.append((job, rows))
        return selection

    def joining(self, model: str, of_kind: Sequence[J]) -> list[J]:
        """The jobs whose rows the next call of ``model`` may take, from those whose next rows are of its kind (in
        order): one job marked alone, or every job not so marked; the two take turns at the most urgent priority."""
        if not of_kind:
            return []
        top = of_kind[0].priority
        alone = [j for j in of_kind if j.alone and j.priority == top]
        shared = [j for j in of_kind if not j.alone]
        last = self.alone_last.get(model)
        contested = any(j.priority == top for j in shared)
        if alone and (not contested or last is False or (last is None and of_kind[0].alone)):
            self.alone_last[model] = True
            return [min(alone, key=lambda j: (j.served, j.enqueued))]
        self.alone_last[model] = False
        return shared

    def call_size(self, model: str, available: int) -> int:
        """Rows the next call of ``model`` takes when ``available`` are ready."""
        limit = min(self.call_images, self.max_batch.get(model) or self.call_images)
        shapes = self.shapes[model]
        if shapes.largest is not None:
            limit = min(limit, shapes.largest)
        return min(limit, shapes.fill(min(available, limit)))

    @staticmethod
    def next_kind(jobs: Sequence[Schedulable]) -> bool:
        """Whether the next call takes gradients: the kind the first job (in order) with rows needs
        next, unless a job at its priority was left out of a call for needing the other kind; then
        the kind of the first such job. Without the turn, a job whose next rows are of the other
        kind would wait for as long as the jobs before it keep needing theirs: a Guided IG request
        arriving while another runs its 400 gradient steps would wait for all 400 before its
        forward prediction pass (and then share their calls, one row each)."""
        waiting = [j for j in jobs if j.rows]
        if not waiting:
            return False
        top = waiting[0].priority
        passed = next((j for j in waiting if j.priority == top and j.passed_over), waiting[0])
        return passed.next_grad

    def next_model(self, ordered: Sequence[Schedulable]) -> str:
        """Round-robin between the models with work at the most urgent priority, so a model with a long
        queue (a slow ViT) takes every other call, not every call, from another (a small CNN)."""
        top = ordered[0].priority
        waiting = {j.model for j in ordered if j.priority == top}
        names = self.models
        start = names.index(self.last_model) + 1 if self.last_model in names else 0
        model = next(n for n in names[start:] + names[:start] if n in waiting)
        self.last_model = model
        return model

