"""Local Attribution (Zhu et al., "Enhancing Model Interpretability with Local Attribution over
Global Exploration", ACM MM 2024, https://arxiv.org/abs/2408.07736), from the authors' code
(``LMBTough/LA``, ``saliency/la.py``): AGI's adversarial integration kept local. Each step is
``x0 + (x0 / spatial_range) ⊙ sign(g)`` clamped to [0, 1], a per-pixel step proportional to the
pixel, always from the original image; every step adds ``-∇p_y0 ⊙ (x_next - x0)``. It runs
``classes - 1`` targeted attacks (toward drawn classes, ``g = ∇p_t``) and one untargeted attack
(``g = -∇p_y0``), ``max_iter`` steps each, with no early stop.

Differences from the published code, on purpose: the classes are drawn with ``seed`` (the code seeds
``random`` but draws with an unseeded ``numpy``); a batch indexes its own row's class (the code's
``prob[:, targeted].sum()`` sums a B × B block, mixing the images of a batch: ``gather`` here); the
two gradients of a targeted step are two passes here (the code back-propagates one forward twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.methods._common import Method, method_function
from idg_core.methods.agi import adversarial_classes_for
from idg_core.methods.params import InvalidParameter, Param, Params, output_param
from idg_core.types import AttributionResult, Output, Plan, Query


def _joint(values: dict[str, Any]) -> None:
    if values["classes"] - 1 > values["num_classes"] - 1:
        raise InvalidParameter("classes", f"classes must be <= {values['num_classes']} (one untargeted attack and up to "
                               f"num_classes - 1 targeted ones), got {values['classes']}")


PARAMS = Params("la", (
    Param("max_iter", int, 20, "Steps of each attack (no early stop); the cost is (2 × (classes - 1) + 1) × max_iter gradient "
          "passes", low=1, step=True),
    Param("classes", int, 20, "Attacks: classes - 1 toward classes drawn with seed, and one untargeted (the code's "
          "sampling_times)", low=1, step=True),
    Param("spatial_range", float, 20.0, "Step size divisor: each step moves a pixel by its own value / spatial_range", low=1e-3,
          high=1e6, why="the step is the pixel divided by it: a smaller divisor moves every pixel past the [0, 1] clamp all the "
          "same, and one near 0 made the step infinite or NaN (0 / 0 in float32); a larger one moves no pixel enough to "
          "change the model's output (1e308 answered a map of zeros)"),
    Param("num_classes", int, 1000, "Classes of the model (the service sets it from the model)", low=2, service=False),
    Param("seed", int, 0, "Seed of the class draw", low=0),
    output_param("probability"),
), joint=_joint)


def la_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`la_plan` with ``params`` (every keyword given): no early stop, so exact."""
    passes = (2 * (int(params["classes"]) - 1) + 1) * int(params["max_iter"])
    return WorkBound(passes, passes)


def la_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` in pixel space (``params``: :data:`PARAMS`, checked now);
    see :func:`la`. ``baseline`` is not used."""
    p = PARAMS.validate(params)
    classes = adversarial_classes_for(target, p["classes"] - 1, p["num_classes"], p["seed"])
    return _plan(x, target, classes, p["max_iter"], p["spatial_range"], p["output"])


def _plan(x0: Tensor, label: int, classes: list[int], max_iter: int, spatial_range: float, output: Output) -> Plan:
    step = x0 / spatial_range
    total = torch.zeros_like(x0)
    passes = 0
    for adv_class in [*classes, None]:  # None: the untargeted attack, last as in the authors' code
        point = x0
        for it in range(max_iter):
            name = "untargeted" if adv_class is None else f"class {adv_class}"
            queries = [Query.at(point.unsqueeze(0), label, grad=True, output=output, label=f"{name} step {it + 1}/{max_iter}")]
            if adv_class is not None:
                queries.insert(0, Query.at(point.unsqueeze(0), adv_class, grad=True, output=output))
            answers = yield queries
            passes += len(queries)
            lab = answers[-1].grads
            assert lab is not None
            direction = -lab[0] if adv_class is None else answers[0].grads[0]  # type: ignore[index]
            point = torch.clamp(x0 + step * direction.sign(), 0.0, 1.0)
            total -= lab[0] * (point - x0)
            del answers, lab, direction  # views of a whole model call's outputs: not kept while the next call runs
    return AttributionResult(attributions=total.unsqueeze(0), forward_passes=passes, backward_passes=passes)


la = method_function("la", la_plan, PARAMS, """Local Attribution: Σ over classes - 1 targeted and one untargeted local
attack of -∇p_y0 ⊙ (x_next - x0), steps x0 / spatial_range per pixel. ``x`` must be in pixel space [0, 1];
``target`` plays the role of the predicted class y0; ``baseline`` is ignored (None is accepted).""", uses_baseline=False)

METHOD = Method(la, la_plan, PARAMS, la_bound, "Local Attribution: local adversarial integration (LA, ACM MM 2024)",
                presets={"fast": {"max_iter": 10, "classes": 10}, "paper": {"max_iter": 20, "classes": 20},
                         "quality": {"max_iter": 20, "classes": 20}})
