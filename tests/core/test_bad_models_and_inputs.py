"""The library refuses, with a ValueError that says what is wrong, the models and inputs that had answered silently
wrong maps: logits that are not finite (NaN maps, or Guided IG's all-zero one), a NaN baseline, batch norm or dropout
left in training mode (maps that depended on the batch size), a model returning more rows than it was given (cut off
silently), a saliency map of the wrong shape in the metrics (broadcast silently). Inputs that had failed deep in torch
(an input that requires grad, a target of None) get an answer or a clear error."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from idg_core import agi, guided_ig, idg, ig, left_ig
from idg_core.metrics import deletion, insertion


def _cnn(classes: int = 5, extra: list[nn.Module] | None = None) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), *(extra or []), nn.Softplus(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                         nn.Linear(16, classes)).eval()


X = torch.rand(2, 3, 8, 8)
RUNS: dict[str, Callable[..., object]] = {
    "ig": lambda m, **kw: ig(m, X, "black", 0, steps=8, **kw),
    "left_ig": lambda m, **kw: left_ig(m, X, "black", 0, steps=8, **kw),
    "idg uniform": lambda m, **kw: idg(m, X, "black", 0, steps=8, uniform=True, **kw),
    "guided_ig": lambda m, **kw: guided_ig(m, X, "black", 0, steps=8, **kw),
    "agi": lambda m, **kw: agi(m, X, None, 0, max_iter=2, adversarial_classes=2, num_classes=5, **kw),
}


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_model_whose_logits_are_not_finite_is_refused(name: str, bad: float) -> None:
    model = _cnn()

    def broken(z: Tensor) -> Tensor:
        return model(z) * bad

    with pytest.raises(ValueError, match="the model's output or its gradient is not finite"):
        RUNS[name](broken)


def test_a_baseline_that_is_not_finite_is_refused() -> None:
    with pytest.raises(ValueError, match="baseline must be finite"):
        ig(_cnn(), X, torch.full((3, 8, 8), float("nan")), 0, steps=4)


@pytest.mark.parametrize("layer", [nn.BatchNorm2d(4), nn.Dropout(0.5)], ids=["batch norm", "dropout"])
def test_a_model_in_training_mode_is_refused_and_in_eval_mode_answers(layer: nn.Module) -> None:
    model = _cnn(extra=[layer]).train()
    with pytest.raises(ValueError, match=r"training mode \(1 .*call model.eval\(\) first"):
        ig(model, X, "black", 0, steps=4)
    if isinstance(layer, nn.BatchNorm2d):
        assert int(layer.num_batches_tracked) == 0  # refused before any call changed its statistics
    model.eval()
    by_one = ig(model, X, "black", 0, steps=4, batch_size=1).attributions
    assert torch.allclose(by_one, ig(model, X, "black", 0, steps=4, batch_size=8).attributions, atol=1e-6)


def test_a_model_without_such_layers_may_stay_in_training_mode() -> None:
    model = _cnn().train()  # nothing in it answers otherwise in training mode
    assert torch.isfinite(ig(model, X, "black", 0, steps=4).attributions).all()


@pytest.mark.parametrize(("shape_of", "says"), [
    (lambda out: out.reshape(-1, 3), r"\(batch, classes\) = \(8, classes\) for an input batch of 8, got \(16, 3\)"),
    (lambda out: out[:, 0], r"got \(8,\)"),
    (lambda out: out[:-1], r"got \(7, 6\)"),
    (lambda out: (out,), "got tuple"),
    (lambda out: out.round().long(), "torch.int64"),
], ids=["more rows", "one dimension", "fewer rows", "a tuple", "integers"])
def test_a_model_output_of_the_wrong_shape_is_refused_not_cut(shape_of: Callable[[Tensor], object], says: str) -> None:
    model = _cnn(classes=6)
    with pytest.raises(ValueError, match=says):
        ig(lambda z: shape_of(model(z)), X, "black", 1, steps=4, batch_size=8)


def test_an_input_that_requires_grad_is_explained_as_it_is() -> None:
    model = _cnn()
    asked = X.clone().requires_grad_(True)
    assert torch.equal(ig(model, asked, "black", 0, steps=4).attributions, ig(model, X, "black", 0, steps=4).attributions)


@pytest.mark.parametrize("target", [None, "1", 1.0], ids=["none", "a string", "a float"])
def test_a_target_that_is_no_class_index_is_refused_naming_it(target: object) -> None:
    with pytest.raises(ValueError, match="target must be"):
        ig(_cnn(), X, "black", target, steps=4)  # type: ignore[arg-type]


@pytest.mark.parametrize("metric", [deletion, insertion])
@pytest.mark.parametrize("shape", [(2, 1, 8), (2, 3, 8, 8), (1, 8, 8)], ids=["broadcastable", "per channel", "one map for two"])
def test_a_saliency_map_of_the_wrong_shape_is_refused(metric: Callable[..., object], shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"saliency must be \(B, H, W\) = \(2, 8, 8\)"):
        metric(_cnn(), X, torch.rand(shape), step=8)
