"""The faithfulness score as a plan fragment agrees with idg_core.metrics at the same step count."""

from __future__ import annotations

import math

import pytest
import torch

from idg_core.budget import score_passes
from idg_core.faithfulness import faithfulness_plan, parse_metrics, pixels_per_step
from idg_core.metrics import deletion, insertion
from idg_core.model_calls import CallStats, run_plans
from idg_core.types import AttributionResult, Plan
from tests.models import Counting, SmallCNN


def _score_plan(x: torch.Tensor, attr: torch.Tensor, predicted: int, **kw: object) -> Plan:
    scores = yield from faithfulness_plan(x, attr, predicted, **kw)  # type: ignore[arg-type]
    return AttributionResult(attributions=attr.unsqueeze(0), weights=torch.tensor([[scores.get("insertion", -1.0),
                             scores.get("deletion", -1.0), float(scores.get("steps", -1))]]))


@pytest.mark.parametrize("steps", [7, 28, 256])
def test_agrees_with_rise_metrics_at_the_same_step_count(steps: int) -> None:
    torch.manual_seed(1)
    model = SmallCNN().eval()
    x = torch.rand(2, 3, 16, 16)
    attrs = torch.randn(2, 3, 16, 16)
    preds = model(x).argmax(1)
    stats = CallStats()
    out = run_plans(model, [_score_plan(x[i], attrs[i], int(preds[i]), steps=steps) for i in range(2)], 8, stats)
    step = pixels_per_step(16, 16, steps)
    sal = attrs.abs().sum(1)  # the metrics' saliency: |attribution| summed over channels
    ins, dele = insertion(model, x, sal, step=step), deletion(model, x, sal, step=step)
    n = math.ceil(256 / step)
    for i in range(2):
        got = out[i].weights[0]
        assert float(got[0]) == pytest.approx(ins[i].auc, abs=1e-6)
        assert float(got[1]) == pytest.approx(dele[i].auc, abs=1e-6)
        assert int(got[2]) == n
    assert stats.forward_images == 2 * score_passes(("insertion", "deletion"), 16, 16, steps) == 2 * 2 * (n + 1)
    assert stats.backward_images == 0


def test_one_metric_and_pooled_calls() -> None:
    model = Counting(SmallCNN().eval())
    x = torch.rand(3, 16, 16)
    run_plans(model, [_score_plan(x, torch.randn(3, 16, 16), 0, steps=8, metrics=["deletion"])], 64)
    assert model.calls == [9]  # 8 steps + the photo itself, one call


def test_parse_metrics() -> None:
    assert parse_metrics("deletion, insertion") == ("insertion", "deletion")
    assert parse_metrics("insertion") == ("insertion",)
    assert parse_metrics(None) == ()
    with pytest.raises(ValueError, match="'auc'"):
        parse_metrics("insertion,auc")
    with pytest.raises(ValueError, match="steps"):
        pixels_per_step(4, 4, 0)
