"""Adversarial Gradient Integration (Pan et al. 2021, https://arxiv.org/abs/2105.05364),
as in the IDG authors' code: every FGSM step starts again from the original image."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.methods._common import Method, method_function
from idg_core.methods.params import SEED_MAX, InvalidParameter, Param, Params, output_param
from idg_core.types import AttributionResult, Output, Plan, Query


def adversarial_classes_for(target: int, count: int, num_classes: int, seed: int) -> list[int]:
    """``count`` distinct classes other than ``target``, drawn by a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_classes, generator=g).tolist()
    return [c for c in order if c != target][:count]


def _joint(values: dict[str, Any]) -> None:
    n = values["num_classes"]
    if values["adversarial_targets"] is None:
        if values["adversarial_classes"] > n - 1:
            raise InvalidParameter("adversarial_classes", f"adversarial_classes must be in [1, {n - 1}] (the classes other "
                                   f"than the target), got {values['adversarial_classes']}")
    elif any(not 0 <= c < n for c in values["adversarial_targets"]):
        raise InvalidParameter("adversarial_targets", f"adversarial_targets must be class indices in [0, {n - 1}], "
                               f"got {values['adversarial_targets']}")


PARAMS = Params("agi", (
    Param("epsilon", float, 0.05, "FGSM step in pixel units (0.05 in the authors' code)", low=0.0, high=1.0, low_open=True,
          why="a zero step never moves the image, so every iteration would be wasted"),
    Param("max_iter", int, 20, "Iterations per adversarial class, fewer when the attack succeeds; the cost is up to "
          "2 × max_iter × adversarial_classes gradient passes", low=1, step=True),
    Param("adversarial_classes", int, 1, "How many classes to attack, drawn with seed from the classes other than the target "
          "(the IDG paper used one)", low=1),
    Param("adversarial_targets", list, None, "Explicit classes to attack instead of a random draw", service=False),
    Param("num_classes", int, 1000, "Classes of the model (the service sets it from the model)", low=2, service=False),
    Param("seed", int, 0, "Seed of the adversarial class draw", low=0, high=SEED_MAX),
    Param("early_stop", bool, True, "End a class's iterations once the attack succeeds (the authors' code); false runs all max_iter"),
    output_param("probability"),
), joint=_joint)


def agi_bound(params: Mapping[str, Any]) -> WorkBound:
    """Most :func:`agi_plan` with ``params`` (every keyword given) can cost: two gradients per
    iteration, ``max_iter`` iterations per adversarial class (fewer when an attack succeeds)."""
    targets = params.get("adversarial_targets")
    classes = len(targets) if targets is not None else int(params["adversarial_classes"])
    passes = 2 * int(params["max_iter"]) * classes
    return WorkBound(passes, passes)


def agi_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); see :func:`agi`.
    ``baseline`` is not used."""
    p = PARAMS.validate(params)
    classes = p["adversarial_targets"]
    if classes is None:
        classes = adversarial_classes_for(target, p["adversarial_classes"], p["num_classes"], p["seed"])
    return _plan(x, target, classes, p["epsilon"], p["max_iter"], p["output"], p["early_stop"])


def _plan(x0: Tensor, label: int, classes: list[int], epsilon: float, max_iter: int, output: Output, early_stop: bool) -> Plan:
    total = torch.zeros_like(x0)
    passes = 0
    for adv_class in classes:
        if adv_class == label:
            continue
        point = x0
        for it in range(max_iter):
            adv, lab = yield [
                Query.at(point.unsqueeze(0), adv_class, grad=True, output=output, label=f"class {adv_class} iteration {it + 1}/{max_iter}"),
                Query.at(point.unsqueeze(0), label, grad=True, output=output),
            ]
            passes += 2
            stop = early_stop and int(adv.top1[0]) == adv_class
            if not stop:
                assert adv.grads is not None and lab.grads is not None
                point = torch.clamp(x0 + epsilon * adv.grads[0].sign(), 0.0, 1.0)
                total -= lab.grads[0] * (point - x0)
            del adv, lab  # views of a whole model call's outputs: not kept while the next call runs
            if stop:
                break
    return AttributionResult(attributions=total.unsqueeze(0), forward_passes=passes, backward_passes=passes)


agi = method_function("agi", agi_plan, PARAMS, """AGI: Σ over adversarial classes and FGSM iterations of
-∇p_target ⊙ (x_next - x0). ``x`` must be in pixel space [0, 1] (steps are clamped there); ``target`` plays
the role of the predicted class y0; ``baseline`` is ignored (AGI has none; None is accepted).""", uses_baseline=False)

METHOD = Method(agi, agi_plan, PARAMS, agi_bound, "Adversarial Gradient Integration",
                presets={"fast": {"max_iter": 20}, "paper": {"max_iter": 20}, "quality": {"max_iter": 20}})
