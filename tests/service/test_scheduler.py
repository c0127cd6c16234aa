"""The scheduling rules alone (app.worker.scheduler): no worker, no threads, no model; plan states with
made-up steps, and the call each rule picks. The same rules seen through a live worker:
tests/service/test_worker.py, tests/service/jobs/test_jobs_api.py (background work)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.worker.scheduler import BACKGROUND, Scheduler, Selection
from idg_core.call_shapes import CallShapes
from idg_core.model_calls import PlanState
from idg_core.types import Query


@dataclass(eq=False)
class FakeJob(PlanState):
    """A plan state whose current step is given: ``steps`` is its queries as (rows, gradient)."""

    model: str
    steps: list[tuple[int, bool]]
    priority: int = 1
    enqueued: float = 0.0
    cancel_reason: str | None = None
    in_flight: int = 0
    passed_over: int = 0
    alone: bool = False
    served: int = 0

    def __post_init__(self) -> None:
        self.pending = [Query.at(torch.zeros(n, 1, 1, 1), 0, grad=grad, output="logit") for n, grad in self.steps]
        self.answers = [None] * len(self.pending)
        self.taken = 0
        self.result = None


def _rows(selection: Selection[FakeJob] | None) -> list[tuple[FakeJob, int]]:
    assert selection is not None
    return [(job, sum(b - a for _, a, b in rows)) for job, rows in selection.work]


def test_predictions_go_first_then_the_oldest_and_the_call_is_bounded() -> None:
    older = FakeJob("m", [(5, False)], enqueued=1.0)
    newer = FakeJob("m", [(5, False)], enqueued=2.0)
    predict = FakeJob("m", [(2, False)], priority=0, enqueued=3.0)
    scheduler = Scheduler(["m"], call_images=8)
    assert _rows(scheduler.select([newer, older, predict], calls_in_flight=False)) == [(predict, 2), (older, 5), (newer, 1)]
    assert newer.rows == 4 and older.rows == 0
    assert _rows(scheduler.select([newer, older, predict], calls_in_flight=False)) == [(newer, 4)]
    assert scheduler.select([newer, older, predict], calls_in_flight=False) is None  # every row taken


def test_a_model_limit_and_fixed_call_sizes_bound_the_call() -> None:
    job = FakeJob("m", [(20, False)])
    assert _rows(Scheduler(["m"], call_images=16, max_batch={"m": 4}).select([job], calls_in_flight=False)) == [(job, 4)]
    # sizes 8 and 16: 13 rows would pad 3 of 16 (within a quarter), 9 rows would pad 7: take 8
    shapes = {"m": CallShapes(sizes=(8, 16))}
    scheduler = Scheduler(["m"], call_images=32, shapes=shapes)
    assert scheduler.call_size("m", 13) == 13 and scheduler.call_size("m", 9) == 8 and scheduler.call_size("m", 40) == 16


def test_a_call_is_of_one_kind_and_a_job_passed_over_decides_the_next_kind() -> None:
    gradients = FakeJob("m", [(100, True)], enqueued=1.0)
    forward = FakeJob("m", [(1, False), (3, True)], enqueued=2.0)
    scheduler = Scheduler(["m"], call_images=8)
    first = scheduler.select([gradients, forward], calls_in_flight=False)
    assert first is not None and first.grad and _rows(first) == [(gradients, 8)]
    assert forward.passed_over == 1  # it had rows, of the other kind
    second = scheduler.select([gradients, forward], calls_in_flight=False)
    assert second is not None and not second.grad and _rows(second) == [(forward, 1)]  # its turn, not after all 100
    assert forward.passed_over == 0 and gradients.passed_over == 1
    third = scheduler.select([gradients, forward], calls_in_flight=False)
    assert third is not None and third.grad and _rows(third) == [(gradients, 8)]  # both want gradients: the older fills the call
    assert forward.ready_rows(True) == 3 and forward.ready_rows(False) == 0


def test_models_take_turns_at_the_most_urgent_priority() -> None:
    slow = [FakeJob("vit", [(50, False)], enqueued=float(i)) for i in range(3)]
    small = FakeJob("cnn", [(50, False)], enqueued=10.0)
    scheduler = Scheduler(["vit", "cnn"], call_images=8)
    picked = [scheduler.select([*slow, small], calls_in_flight=False) for _ in range(4)]
    assert [s.model for s in picked if s is not None] == ["vit", "cnn", "vit", "cnn"]
    background = FakeJob("vit", [(5, False)], priority=BACKGROUND)
    scheduler = Scheduler(["vit", "cnn"], call_images=8)
    selected = scheduler.select([background, small], calls_in_flight=False)
    assert selected is not None and selected.model == "cnn"  # the urgent model first, whatever the turn


def test_background_rows_do_not_queue_behind_a_call_holding_a_requests_rows() -> None:
    request = FakeJob("m", [(4, False)], priority=1, in_flight=1)  # its rows are in a call on the device
    request.take()
    background = FakeJob("m", [(5, False)], priority=BACKGROUND)
    scheduler = Scheduler(["m"], call_images=8)
    assert scheduler.select([request, background], calls_in_flight=True) is None  # the request's next step goes first
    assert _rows(scheduler.select([request, background], calls_in_flight=False)) == [(background, 5)]  # the device is idle
    other = FakeJob("m", [(2, False)], priority=1)  # a request with rows waiting shares the call with background rows
    background = FakeJob("m", [(5, False)], priority=BACKGROUND)
    assert _rows(scheduler.select([request, other, background], calls_in_flight=True)) == [(other, 2), (background, 5)]


def test_cancelled_jobs_and_jobs_without_rows_give_nothing() -> None:
    cancelled = FakeJob("m", [(3, False)], cancel_reason="deadline")
    empty = FakeJob("m", [(0, False)])
    assert Scheduler(["m"], call_images=8).select([cancelled, empty], calls_in_flight=False) is None
    assert Scheduler.next_kind([]) is False


def test_a_job_marked_alone_shares_no_call_and_its_calls_are_sized_by_its_own_rows() -> None:
    """Guided IG's map follows its gradients' last bits, which follow the call's size: its rows never join another
    job's call, nor another's its; the first call goes to the older, then it has calls of its own rows only."""
    older = FakeJob("m", [(3, True)], enqueued=1.0)
    alone = FakeJob("m", [(2, True)], enqueued=2.0, alone=True)
    newer = FakeJob("m", [(4, True)], enqueued=3.0)
    scheduler = Scheduler(["m"], call_images=16)
    assert _rows(scheduler.select([older, alone, newer], calls_in_flight=False)) == [(older, 3), (newer, 4)]
    assert alone.rows == 2 and alone.passed_over == 0  # left out, not for its kind
    assert _rows(scheduler.select([older, alone, newer], calls_in_flight=False)) == [(alone, 2)]


def test_calls_alone_and_shared_calls_take_turns_and_jobs_alone_take_turns_among_themselves() -> None:
    """One Guided IG request must not hold every newer request of its kind for its whole run (nor the oldest of two
    Guided IG requests the other): with more rows than a call, the turns alternate."""
    shapes = {"m": CallShapes(sizes=(1, 4, 16))}
    sized = Scheduler(["m"], call_images=16, shapes=shapes)
    big = FakeJob("m", [(20, True)], enqueued=1.0, alone=True)
    company = FakeJob("m", [(20, True)], enqueued=2.0)
    calls = [_rows(sized.select([big, company], calls_in_flight=False)) for _ in range(4)]
    assert calls == [[(big, 16)], [(company, 16)], [(big, 4)], [(company, 4)]]  # each call sized by its own rows
    a, b = FakeJob("m", [(40, True)], enqueued=1.0, alone=True), FakeJob("m", [(40, True)], enqueued=2.0, alone=True)
    scheduler = Scheduler(["m"], call_images=16)
    assert [_rows(scheduler.select([a, b], calls_in_flight=False)) for _ in range(4)] == [[(a, 16)], [(b, 16)], [(a, 16)], [(b, 16)]]
    predict = FakeJob("m", [(2, True)], priority=0, enqueued=9.0)  # a more urgent job is not made to wait its turn
    assert _rows(scheduler.select([a, b, predict], calls_in_flight=False)) == [(predict, 2)]
    assert _rows(scheduler.select([a, b, predict], calls_in_flight=False)) == [(a, 8)]
