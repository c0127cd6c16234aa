"""One budget (idg_core.budget): what an explanation may cost, known before it runs, bounds what it
then takes, counted the same way by the plan's result and by the model calls themselves."""

from __future__ import annotations

import pytest
import torch

from idg_core.budget import GRAD_UNITS, WorkBound, explanation_bound, postprocess_bound, row_units, work_units
from idg_core.explain import ExplainOptions, explain_plan
from idg_core.methods import METHODS
from idg_core.model_calls import CallStats, run_plans
from tests.models import Linear


@pytest.mark.parametrize(("method", "post", "metrics", "predict"), [
    ("idg", {}, (), True),
    ("ig", {"smooth_samples": 2, "smooth_std": 0.1, "smooth_kind": "smoothgrad", "smooth_seed": 0}, ("insertion", "deletion"), True),
    ("guided_ig", {}, ("deletion",), False),
])
def test_an_explanation_takes_at_most_its_bound_and_counts_what_its_calls_took(
    method: str, post: dict[str, object], metrics: tuple[str, ...], predict: bool,
) -> None:
    torch.manual_seed(0)
    x = torch.rand(3, 8, 8)
    params = METHODS[method].validate(**{p.name: 4 for p in METHODS[method].params if p.step})
    bound = explanation_bound(postprocess_bound(METHODS[method].bound(params), post), metrics, 8, 8, 4, predict=predict)
    probs = None if predict else torch.full((4,), 0.25)
    stats = CallStats()
    plan = explain_plan(x, torch.zeros_like(x), None, method, params, ExplainOptions(post, metrics, 4), probs)
    (found,) = run_plans(Linear(), [plan], 64, stats)
    assert found.forward_passes == stats.forward_images <= bound.forward
    assert found.backward_passes == stats.backward_images <= bound.backward
    assert bound.units == work_units(bound.forward, bound.backward)


def test_work_units_weigh_a_gradient_image_as_grad_units_forward_images() -> None:
    assert row_units(5, grad=False) == 5 and row_units(5, grad=True) == 5 * GRAD_UNITS
    assert WorkBound(10, 4).times(3) == WorkBound(30, 12) and WorkBound(10, 4).plus_forward(2) == WorkBound(12, 4)
    assert postprocess_bound(WorkBound(10, 4, 1), {"smooth_samples": 0}) == WorkBound(10, 4, 1)
