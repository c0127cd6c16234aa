"""The plans a request runs, with typed results that count their own model passes: a prediction,
and an explanation (prediction → method with its post-steps → faithfulness score). The service
submits them to its worker; the library can drive them with :func:`idg_core.model_calls.run_plans`
like any plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from idg_core.budget import explanation_passes
from idg_core.faithfulness import faithfulness_plan
from idg_core.postprocess import build_plan
from idg_core.preprocess import IMAGENET_MEAN, IMAGENET_STD
from idg_core.types import AttributionResult, PlanOf, Query


def predict_plan(x: Tensor) -> PlanOf[Tensor]:
    """All class probabilities ``(num_classes,)`` of one image ``x (C, H, W)``, on the CPU: one forward pass."""
    (ans,) = yield [Query.at(x.unsqueeze(0), 0, grad=False, output="logit", full=True, label="prediction")]
    assert ans.all_logits is not None
    # on the host at once: on a GPU one wait for the device (a check and softmax there would wait twice, the second
    # behind the next model call), and a thousand numbers cost the CPU microseconds
    logits = ans.all_logits[0].to("cpu", torch.float32)
    bad = int((~torch.isfinite(logits)).sum())
    if bad:  # softmax would make every probability NaN, and the ranking of the classes arbitrary
        raise ValueError(f"the model's logits are not finite ({bad} of {logits.numel()} NaN or infinite): no class can be "
                         "ranked (an overflow in reduced precision? try IDG_PRECISION=fp32)")
    return torch.softmax(logits, 0)


@dataclass(frozen=True)
class ExplainOptions:
    """What an explanation adds to its method: post-steps (``postprocess``, ``smooth_*`` keywords of
    :func:`idg_core.postprocess.build_plan`) and the faithfulness score (``metrics``, in ``steps``
    steps, the deletion substrate and the blur in the model's ``mean`` / ``std``)."""

    post: dict[str, Any] = field(default_factory=dict)
    metrics: tuple[str, ...] = ()
    steps: int = 28
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD


@dataclass
class Explanation:
    """What :func:`explain_plan` found: the class probabilities, the class explained, the method's
    result (after its post-steps) and the faithfulness AUCs asked for."""

    probs: Tensor
    target: int
    result: AttributionResult
    scores: dict[str, float]
    """``insertion`` / ``deletion`` AUCs, for the metrics asked (empty when none)."""
    score_steps: int
    """Steps of each faithfulness game (0 without a score)."""
    predicted: bool
    """Whether the plan ran the prediction pass (False when the probabilities were given)."""

    @property
    def forward_passes(self) -> int:
        """Images this plan pushed through the model: prediction, method, faithfulness games."""
        return explanation_passes(self.predicted, self.result.forward_passes, len(self.scores), self.score_steps)

    @property
    def backward_passes(self) -> int:
        return self.result.backward_passes


def explain_plan(
    x: Tensor, baseline: Tensor, target: int | None, method: str, params: dict[str, Any],
    options: ExplainOptions | None = None, probs: Tensor | None = None,
) -> PlanOf[Explanation]:
    """Explain one image ``x (C, H, W)``: predict (unless ``probs`` is given, e.g. by /predict),
    take the predicted class unless ``target`` is given, run ``method`` with ``params`` (validated
    by the caller: :meth:`idg_core.methods.Method.validate`) and its post-steps, then score the map.
    The score's forward passes are queries like any other, so a driver pools them with other plans'."""
    options = options or ExplainOptions()
    predicted = probs is None
    if probs is None:
        probs = yield from predict_plan(x)
    chosen = int(probs.argmax()) if target is None else target
    result = yield from build_plan(method, x, baseline, chosen, **options.post, **params)
    scores: dict[str, float] = {}
    if options.metrics:
        scores = yield from faithfulness_plan(x, result.attributions[0], int(probs.argmax()), metrics=options.metrics,
                                              steps=options.steps, mean=options.mean, std=options.std)
    steps = int(scores.pop("steps", 0))
    return Explanation(probs, chosen, result, scores, steps, predicted)
