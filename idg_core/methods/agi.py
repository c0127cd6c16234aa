"""Adversarial Gradient Integration (Pan et al. 2021, https://arxiv.org/abs/2105.05364),
as in the IDG authors' code: every FGSM step starts again from the original image."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from idg_core._validation import check_float, check_int, check_output
from idg_core.evaluator import EvalStats
from idg_core.methods._common import WorkBound, run_method
from idg_core.types import AttributionResult, BaselineLike, Model, Output, Plan, Query


def adversarial_classes_for(target: int, count: int, num_classes: int, seed: int) -> list[int]:
    """``count`` distinct classes other than ``target``, drawn by a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_classes, generator=g).tolist()
    return [c for c in order if c != target][:count]


def agi_bound(params: Mapping[str, Any]) -> WorkBound:
    """Most :func:`agi_plan` with ``params`` (every keyword given) can cost: two gradients per
    iteration, ``max_iter`` iterations per adversarial class (fewer when an attack succeeds)."""
    targets = params.get("adversarial_targets")
    classes = len(targets) if targets is not None else int(params["adversarial_classes"])
    passes = 2 * int(params["max_iter"]) * classes
    return WorkBound(passes, passes)


def agi_plan(
    x: Tensor, baseline: Tensor, target: int, *, epsilon: float = 0.05, max_iter: int = 20,
    adversarial_classes: int = 1, adversarial_targets: Sequence[int] | None = None,
    num_classes: int = 1000, seed: int = 0, output: Output = "probability",
) -> Plan:
    """Plan for one image ``x (C, H, W)``; see :func:`agi`. ``baseline`` is not used."""
    check_float("epsilon", epsilon, 0.0, 1.0, low_open=True, why="a zero step never moves the image, so every iteration would be wasted")
    check_int("max_iter", max_iter, 1)
    check_int("num_classes", num_classes, 2)
    check_int("seed", seed, 0)
    if adversarial_targets is None:
        check_int("adversarial_classes", adversarial_classes, 1, num_classes - 1)
        classes = adversarial_classes_for(target, adversarial_classes, num_classes, seed)
    else:
        classes = [check_int("adversarial_targets", int(c), 0, num_classes - 1) for c in adversarial_targets]
    return _plan(x, target, classes, epsilon, max_iter, check_output(output))


def _plan(x0: Tensor, label: int, classes: list[int], epsilon: float, max_iter: int, output: Output) -> Plan:
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
            if int(adv.top1[0]) == adv_class:
                break
            assert adv.grads is not None and lab.grads is not None
            point = torch.clamp(x0 + epsilon * adv.grads[0].sign(), 0.0, 1.0)
            total -= lab.grads[0] * (point - x0)
    return AttributionResult(attributions=total.unsqueeze(0), forward_passes=passes, backward_passes=passes)


def agi(
    model: Model,
    x: Tensor,
    baseline: BaselineLike | None,
    target: int | Tensor | Iterable[int],
    *,
    epsilon: float = 0.05,
    max_iter: int = 20,
    adversarial_classes: int = 1,
    adversarial_targets: Sequence[int] | None = None,
    num_classes: int = 1000,
    seed: int = 0,
    output: Output = "probability",
    batch_size: int | None = None,
    stats: EvalStats | None = None,
) -> AttributionResult:
    """AGI: Σ over adversarial classes and FGSM iterations of -∇p_target ⊙ (x_next - x0).

    ``x`` must be in pixel space [0, 1] (steps are clamped there); ``target`` plays the role of the
    predicted class y0; ``baseline`` is ignored (AGI has none).

    Args:
        epsilon: in (0, 1], FGSM step size in pixel units (0.05 in the authors' code).
        max_iter: >= 1, iterations per adversarial class; stops early when the attack succeeds.
        adversarial_classes: how many classes to attack, drawn at random (seeded by ``seed``) from
            the ``num_classes`` classes other than the target. The IDG paper used one.
        adversarial_targets: explicit classes instead of a random draw.
    """
    return run_method(
        agi_plan, model, x, "black" if baseline is None else baseline, target, batch_size, stats, epsilon=epsilon, max_iter=max_iter,
        adversarial_classes=adversarial_classes, adversarial_targets=adversarial_targets,
        num_classes=num_classes, seed=seed, output=output,
    )
