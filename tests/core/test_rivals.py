"""The rivals of issue #31 as method files: Expected Gradients (completeness in expectation), IDG along
EG paths (the mean of IDG from each reference, its paths sharing model calls) and LA (the authors'
loop, per image, with the batch bug fixed); composable post-steps and the blur control."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from idg_core import METHODS
from idg_core.methods.agi import adversarial_classes_for
from idg_core.methods.eg import gaussian_blur, reference_images
from idg_core.methods.params import InvalidParameter
from idg_core.model_calls import run_plans
from idg_core.postprocess import build_plan
from tests.models import Counting, Linear, SmallCNN


def _f(model: torch.nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    with torch.no_grad():
        return model(x)[:, target]


def test_eg_is_complete_against_its_references_on_a_linear_model() -> None:
    # ∇F is constant: each draw gives w ⊙ (x - x'_j), whatever α_j: Σ EG = F(x) - mean_j F(x'_j) exactly
    model, x = Linear(), torch.rand(1, 3, 8, 8)
    for kind in ("blur", "noise"):
        res = METHODS["eg"](model, x, None, 2, samples=16, references=kind, seed=3)
        refs = reference_images(x[0], kind, 16, 3)
        expected = _f(model, x, 2)[0] - _f(model, refs, 2).mean()
        assert abs(float(res.attributions.sum() - expected)) < 1e-4


def test_eg_is_complete_in_expectation_on_a_nonlinear_model() -> None:
    # α_j ~ U(0, 1): E_α[∇F(x'_j + α Δ_j)·Δ_j] = F(x) - F(x'_j), so the sum converges to F(x) - mean_j F(x'_j)
    model, x = SmallCNN().eval(), torch.rand(1, 3, 16, 16)
    n = 3000
    res = METHODS["eg"](model, x, None, 4, samples=n, references="noise", seed=0, batch_size=512)
    refs = reference_images(x[0], "noise", n, 0)
    expected = float(_f(model, x, 4)[0] - _f(model, refs, 4).mean())
    spread = float((_f(model, x, 4)[0] - _f(model, refs, 4)).std())
    assert abs(float(res.attributions.sum()) - expected) < 4 * spread / n**0.5 + 0.02 * abs(expected)


def test_eg_references_are_seeded_blurred_copies_or_noise() -> None:
    x = torch.rand(3, 20, 20)
    a, b = reference_images(x, "blur", 4, 1), reference_images(x, "blur", 4, 1)
    assert torch.equal(a, b) and a.shape == (4, 3, 20, 20)
    assert not torch.equal(reference_images(x, "noise", 4, 1), reference_images(x, "noise", 4, 2))
    flat = torch.full((3, 20, 20), 0.3)
    assert torch.allclose(gaussian_blur(flat, 5.0), flat, atol=1e-6)  # a blur keeps a constant image
    assert gaussian_blur(x, 3.0).std() < x.std()


def test_idg_on_eg_paths_is_the_mean_of_idg_from_each_reference_in_shared_calls() -> None:
    model, x = Counting(SmallCNN().eval()), torch.rand(1, 3, 16, 16)
    res = METHODS["idg_eg"](model, x, None, 1, paths=3, steps=6, probe_steps=5, seed=2, batch_size=256)
    assert model.calls == [15, 18]  # one probe call and one gradient call for all three paths
    refs = reference_images(x[0], "blur", 3, 2)
    each = [METHODS["idg"](model.model, x, r.unsqueeze(0), 1, steps=6, probe_steps=5).attributions for r in refs]
    assert torch.allclose(res.attributions, torch.stack(each).mean(0), atol=1e-6)
    assert (res.forward_passes, res.backward_passes) == (3 * 11, 3 * 6)


def _authors_la(model: torch.nn.Module, data: torch.Tensor, classes: list[int], max_iter: int, spatial_range: float) -> torch.Tensor:
    """``saliency/la.py`` of LMBTough/LA for one image with its class draw given (and gather, not [:, t])."""
    init_pred = model(data).argmax(-1)
    step = data.clone() / spatial_range
    out = torch.zeros_like(data)
    for t in [*classes, None]:
        adv = data.clone()
        for _ in range(max_iter):
            adv = adv.detach().requires_grad_(True)
            prob = F.softmax(model(adv), -1)
            untarget = torch.autograd.grad(prob.gather(1, init_pred.view(-1, 1)).sum(), adv, retain_graph=t is not None)[0]
            direction = -untarget if t is None else torch.autograd.grad(prob[:, t].sum(), adv)[0]
            adv = torch.clamp(data + step * direction.sign(), 0, 1)
            out += -untarget * (adv - data)
    return out


def test_la_follows_the_authors_loop_and_each_image_keeps_its_own_class() -> None:
    model, x = SmallCNN().eval(), torch.rand(2, 3, 16, 16)
    targets = model(x).argmax(1).tolist()
    res = METHODS["la"](model, x, None, targets, max_iter=3, classes=4, spatial_range=10.0, num_classes=10, seed=5)
    for i, t in enumerate(targets):
        classes = adversarial_classes_for(t, 3, 10, 5)
        expected = _authors_la(model, x[i : i + 1], classes, 3, 10.0)
        assert torch.allclose(res.attributions[i : i + 1], expected, atol=1e-6)
        alone = METHODS["la"](model, x[i : i + 1], None, t, max_iter=3, classes=4, spatial_range=10.0, num_classes=10, seed=5)
        assert torch.allclose(res.attributions[i], alone.attributions[0], atol=1e-6)  # the batch does not mix images
    assert res.forward_passes == 2 * (2 * 3 + 1) * 3


def test_la_refuses_a_spatial_range_that_would_make_its_step_infinite() -> None:
    """A divisor near 0 made a black pixel's step 0 / 0 (NaN in float32) and the answer a 500; below 1e-3 it is refused,
    and at 1e-3 a black image and a white one get finite attributions (the clamp holds every step in [0, 1])."""
    model = SmallCNN()
    with pytest.raises(InvalidParameter, match="spatial_range"):
        METHODS["la"](model, torch.zeros(1, 3, 32, 32), None, 0, max_iter=1, classes=2, spatial_range=5e-324, num_classes=10)
    for x in (torch.zeros(1, 3, 32, 32), torch.ones(1, 3, 32, 32)):
        res = METHODS["la"](model, x, None, 0, max_iter=2, classes=2, spatial_range=1e-3, num_classes=10)
        assert bool(torch.isfinite(res.attributions).all())


@pytest.mark.parametrize("spatial_range", [math.inf, 1e308, 2e6], ids=["infinite", "1e308", "past 1e6"])
def test_la_refuses_a_spatial_range_whose_step_moves_nothing(spatial_range: float) -> None:
    """inf and 1e308 had been accepted: every step x / spatial_range was 0, and the answer a map of zeros after all the
    attacks' passes."""
    with pytest.raises(InvalidParameter, match=r"spatial_range must be a number in \[0.001, 1000000.0\]"):
        METHODS["la"](SmallCNN(), torch.rand(1, 3, 32, 32), None, 0, max_iter=1, classes=2, spatial_range=spatial_range, num_classes=10)


def test_no_float_parameter_takes_infinity() -> None:
    floats = [p for m in METHODS.values() for p in m.params if p.kind is float]
    assert len(floats) >= 5
    for p in floats:
        with pytest.raises(InvalidParameter, match=p.name):
            p.check(math.inf)


def test_idgi_and_smoothgrad_compose_on_a_method_and_blur_comes_last() -> None:
    model, x = Counting(SmallCNN().eval()), torch.rand(3, 16, 16)
    base = torch.zeros_like(x)
    kw = {"steps": 6, "probe_steps": 5}
    both = run_plans(model, [build_plan("idg", x, base, 1, postprocess="idgi", smooth_samples=3, smooth_std=0.1, **kw)], 256)[0]
    assert model.calls == [15, 18]  # three noisy copies, their probes and gradients pooled
    assert (both.forward_passes, both.backward_passes) == (33, 18)
    blurred = run_plans(model, [build_plan("idg", x, base, 1, postprocess="idgi", smooth_samples=3, smooth_std=0.1,
                                           blur_sigma=2.0, **kw)], 256)[0]
    assert torch.allclose(blurred.attributions[0], gaussian_blur(both.attributions[0], 2.0), atol=1e-6)
