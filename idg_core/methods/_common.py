"""What every method shares: turning a per-image plan into a batched public function."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from idg_core._validation import check_int, prepare_batch
from idg_core.evaluator import CallStats, default_batch_size, run_plans
from idg_core.methods.params import Params
from idg_core.paths import allocate_samples, place_samples, probe_alphas
from idg_core.types import AttributionResult, BaselineLike, Model, Output, Plan, Query

PlanFactory = Callable[..., Plan]


@dataclass(frozen=True)
class WorkBound:
    """The most one image's plan can cost, known from its parameters before it runs."""

    forward: int
    """Images pushed through the model (those with a gradient included)."""
    backward: int
    """Of those, images back-propagated."""
    host_steps: int = 0
    """Passes over every feature on the host between model calls (Guided IG's sub-steps)."""


def run_method(
    plan: PlanFactory,
    model: Model,
    x: Tensor,
    baseline: BaselineLike,
    target: int | Tensor | Iterable[int],
    batch_size: int | None,
    stats: CallStats | None = None,
    **params: Any,
) -> AttributionResult:
    """Validate, build one plan per image and drive them all through shared model calls
    (``batch_size`` None: :func:`default_batch_size` of the input's device)."""
    preprocessing = getattr(model, "preprocessing", None)  # an ImageClassifier's: its "mean" baseline
    x, base, targets = prepare_batch(x, baseline, target, getattr(preprocessing, "mean", None))
    batch_size = default_batch_size(x.device) if batch_size is None else batch_size
    check_int("batch_size", batch_size, 1)
    plans = [plan(x[i], base[i], targets[i], **params) for i in range(x.shape[0])]
    return AttributionResult.concat(run_plans(model, plans, batch_size, stats))


def method_function(
    name: str, plan: PlanFactory, params: Params, doc: str, *, uses_baseline: bool = True,
) -> Callable[..., AttributionResult]:
    """The public, batched function of a method: ``name(model, x, baseline, target, *, <params>,
    batch_size=None, stats=None)``. Its signature (as ``help`` and ``inspect`` show it) and the
    ``Args`` of its docstring come from ``params``; ``doc`` is the formula and what it means.
    ``uses_baseline`` False: the method has no baseline, and ``baseline`` may be None."""

    def function(
        model: Model, x: Tensor, baseline: BaselineLike | None, target: int | Tensor | Iterable[int], *,
        batch_size: int | None = None, stats: CallStats | None = None, **kwargs: Any,
    ) -> AttributionResult:
        if baseline is None:
            if uses_baseline:
                raise ValueError(f"{name} needs a baseline: 'black', 'mean', a number or a tensor")
            baseline = "black"  # unused by the method, but the batch checks want one
        return run_method(plan, model, x, baseline, target, batch_size, stats, **kwargs)

    function.__name__ = function.__qualname__ = name
    function.__module__ = plan.__module__
    function.__signature__ = params.signature(inspect.signature(function))  # type: ignore[attr-defined]
    shared = ("    batch_size: most images per model call, >= 1 (default: 8 on CPU, 128 on CUDA); the points of all images are pooled.\n"
              "    stats: a CallStats that counts the model calls and passes.")
    function.__doc__ = f"{doc.strip()}\n\nArgs:\n{params.doc()}\n{shared}\n"
    return function


def adaptive_samples(
    baseline: Tensor, diff: Tensor, target: int, steps: int, probe_steps: int, placement: str, output: Output,
) -> Generator[list[Query], list, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """IDG's adaptive sampling as a plan fragment (``yield from`` it): probe the path at
    ``probe_steps`` uniform points (forward only), allocate ``steps`` samples by slope and place
    them. Returns ``(alphas, weights, probe_alphas, probe_values)``."""
    pa = probe_alphas(probe_steps)
    (probe,) = yield [Query.path(baseline, diff, pa, target, grad=False, output=output, label="probe")]
    alphas, weights = place_samples(allocate_samples(probe.values, steps), probe_steps, placement)
    return alphas, weights, pa, probe.values.detach().cpu().double()
