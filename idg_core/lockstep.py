"""Run several plans as one: each round yields all their pending queries together (so their points
share model calls) and hands each plan its own answers; a plan that is done waits for the others."""

from __future__ import annotations

from typing import Any

from idg_core.types import Answer, PlanOf, Query


def lockstep(plans: list[PlanOf[Any]]) -> PlanOf[list[Any]]:
    """A plan whose result is the list of ``plans``' results, in order."""
    results: list[Any] = [None] * len(plans)
    pending: dict[int, list[Query]] = {}
    try:
        for i, p in enumerate(plans):
            _step(p, i, None, pending, results)
        while pending:
            owners = list(pending)
            answers: list[Answer] = yield [q for i in owners for q in pending[i]]
            pos = 0
            for i in owners:
                k = len(pending[i])
                _step(plans[i], i, answers[pos : pos + k], pending, results)
                pos += k
            del answers  # views of whole model calls' outputs: not kept while the next calls run
    finally:
        for p in plans:
            p.close()
    return results


def _step(plan: PlanOf[Any], i: int, answers: list[Answer] | None, pending: dict[int, list[Query]], results: list[Any]) -> None:
    try:
        pending[i] = plan.send(answers)  # type: ignore[arg-type]
    except StopIteration as stop:
        pending.pop(i, None)
        results[i] = stop.value
