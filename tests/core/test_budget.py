"""One budget (idg_core.budget): what an explanation may cost, known before it runs, bounds what it
then takes, counted the same way by the plan's result and by the model calls themselves: every method with every
post-step combination (noisy copies with their own or a shared probe, IDGI, RankMix, XRAI, Grad-CAM's blobs and
product, the blur) and faithfulness scores, its passes counted by a real model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from idg_core.budget import CAM_POSTPROCESS, GRAD_UNITS, WorkBound, explanation_bound, postprocess_bound, row_units, work_units
from idg_core.explain import ExplainOptions, explain_plan
from idg_core.methods import METHODS
from idg_core.model_calls import CallStats, run_plans
from idg_core.postprocess.compose import POSTPROCESS
from idg_core.postprocess.idgi import IDGI_METHODS
from tests.models import Linear, seeded


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


CLASSES = 4
SMOOTH = {"smooth_samples": 3, "smooth_std": 0.1, "smooth_kind": "smoothgrad", "smooth_seed": 0}


class Tally(nn.Module):
    """A small CNN of :data:`CLASSES` classes counting the images of every call and, of those, the ones whose input carries
    a gradient; its convolution is the CAM layer (:meth:`cam_target`) for the CAM methods."""

    def __init__(self) -> None:
        super().__init__()
        with seeded(0):
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4, CLASSES)
        self.forward_images = self.backward_images = 0

    def forward(self, x: Tensor) -> Tensor:
        self.forward_images += int(x.shape[0])
        self.backward_images += int(x.shape[0]) if x.requires_grad else 0
        return self.fc(torch.tanh(self.conv(x)).mean(dim=(2, 3)))

    def cam_target(self) -> tuple[Callable[[Tensor], Tensor], nn.Module]:
        return self.forward, self.conv


def small(method: str) -> dict[str, Any]:
    """``method``'s parameters with every count of passes small (its lowest, at least 3), for a model of 4 classes."""
    spec = METHODS[method]
    given: dict[str, Any] = {p.name: max(3, int(p.low or 0)) for p in spec.params if p.step}
    given |= {k: CLASSES for k in ("num_classes",) if k in spec.params}
    given |= {"adversarial_classes": 2} if "adversarial_classes" in spec.params else {}
    given |= {"classes": 3} if "classes" in spec.params else {}
    return spec.validate(**given)


def combinations() -> list[Any]:
    """Each method alone, with noisy copies (their own probes, and a shared one where the method has a probe), with each
    of the post-steps that apply to it, alone and with copies, and blurred (Grad-CAM's, on every method: alone; on a path
    method also with copies; on IDG with a shared probe and blurred too)."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for method, spec in METHODS.items():
        cases += [(method, {}), (method, dict(SMOOTH)), (method, {"blur_sigma": 1.0, **SMOOTH})]
        if spec.probe is not None:
            cases.append((method, {**SMOOTH, "smooth_probe": "shared"}))
        if method in IDGI_METHODS:
            for post in POSTPROCESS:
                if post != "none":
                    cases += [(method, {"postprocess": post}), (method, {"postprocess": post, **SMOOTH})]
        else:
            cases += [(method, {"postprocess": post}) for post in CAM_POSTPROCESS]
    cases += [("idg", {"postprocess": post, "blur_sigma": 1.0, **SMOOTH, "smooth_probe": "shared"}) for post in CAM_POSTPROCESS]
    return [pytest.param(method, post, id="-".join([method, *(f"{k}={v}" for k, v in post.items() if k not in ("smooth_std", "smooth_kind",
                                                                                                             "smooth_seed"))]))
            for method, post in cases]


@pytest.mark.parametrize(("method", "post"), combinations())
@pytest.mark.parametrize("metrics", [(), ("insertion", "deletion")], ids=["unscored", "scored"])
def test_every_pass_a_method_and_its_post_steps_take_is_within_the_bound(method: str, post: dict[str, Any],
                                                                         metrics: tuple[str, ...]) -> None:
    torch.manual_seed(0)
    x, params, model, stats = torch.rand(3, 8, 8), small(method), Tally(), CallStats()
    bound = explanation_bound(postprocess_bound(METHODS[method].bound(params), post), metrics, 8, 8, 5, predict=True)
    plan = explain_plan(x, torch.zeros_like(x), None, method, params, ExplainOptions(post, metrics, 5))
    (found,) = run_plans(model, [plan], 16, stats)
    assert model.forward_images == stats.forward_images == found.forward_passes
    assert model.backward_images == stats.backward_images
    assert model.forward_images <= bound.forward, (model.forward_images, bound)
    assert model.backward_images <= bound.backward, (model.backward_images, bound)
