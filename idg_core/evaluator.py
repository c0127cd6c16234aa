"""Deprecated name of :mod:`idg_core.model_calls` (the model-call engine), renamed so that it is not confused
with :mod:`idg_core.evaluation` (the benchmark tool). Importing it warns once; it will be removed."""

from __future__ import annotations

import warnings

from idg_core.model_calls import (
    CallStats,
    PlanState,
    PreparedCall,
    Rows,
    RowSelect,
    answer_rows,
    book_call,
    booked_answers,
    default_batch_size,
    empty_answers,
    evaluate_queries,
    prepare_call,
    run_call,
    run_plans,
)

__all__ = ["CallStats", "PlanState", "PreparedCall", "RowSelect", "Rows", "answer_rows", "book_call", "booked_answers",
           "default_batch_size", "empty_answers", "evaluate_queries", "prepare_call", "run_call", "run_plans"]

warnings.warn("idg_core.evaluator is renamed idg_core.model_calls; import it from there", DeprecationWarning, stacklevel=2)
