"""IDGI and SmoothGrad / VarGrad post-steps on models whose answers are known in closed form."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from idg_core.budget import postprocess_bound
from idg_core.methods import METHODS
from idg_core.model_calls import CallStats, run_plans
from idg_core.postprocess import build_plan, idgi
from idg_core.postprocess.smoothgrad import noisy_copies
from tests.models import Counting, Linear, SmallCNN, tiny_classifier


class Quadratic(nn.Module):
    """Class 0: F(x) = Σ a ⊙ x²; class 1: 0."""

    def __init__(self, a: Tensor) -> None:
        super().__init__()
        self.a = a

    def forward(self, x: Tensor) -> Tensor:
        f = (self.a * x * x).flatten(1).sum(1)
        return torch.stack([f, torch.zeros_like(f)], 1)


def _run(model: nn.Module, plan_args: dict, x: Tensor, base: Tensor, target: int = 0, batch: int = 64,
         stats: CallStats | None = None) -> torch.Tensor:
    method = plan_args.pop("method")
    (res,) = run_plans(model, [build_plan(method, x, base, target, **plan_args)], batch, stats)
    return res


def test_idgi_on_a_linear_model_is_w_squared_share_of_the_output_change() -> None:
    # F = w·x + b: every gradient is w, so IDGI = w² / ‖w‖² · (F(x) - F(x')) with trapezoid points at α = 0 and 1
    torch.manual_seed(0)
    model = Linear((3, 4, 4), classes=2).double()
    x, base = torch.rand(3, 4, 4, dtype=torch.float64), torch.zeros(3, 4, 4, dtype=torch.float64)
    res = _run(model, {"method": "ig", "postprocess": "idgi", "steps": 9, "rule": "riemann_trapezoid"}, x, base)
    w = model.w[0].detach()
    expected = w * w / (w * w).sum() * (w * x).sum()
    torch.testing.assert_close(res.attributions[0], expected)
    plain = _run(model, {"method": "ig", "steps": 9, "rule": "riemann_trapezoid"}, x, base)
    assert not torch.allclose(plain.attributions[0], expected)  # IG itself is w ⊙ x: IDGI changed it


def test_idgi_on_a_quadratic_model_with_idg_and_left_ig() -> None:
    # F = Σ a x² on the path from x/4 to x, points (1/4 + 3α/4) x: g ∝ a x (never zero), so every
    # step gives (a x)² / Σ(a x)² of its change, whatever the method's sample positions
    a = torch.linspace(-1, 2, 48, dtype=torch.float64).view(3, 4, 4)
    model = Quadratic(a)
    x = torch.rand(3, 4, 4, dtype=torch.float64) + 0.5
    base = x / 4
    share = (a * x) ** 2 / ((a * x) ** 2).sum()
    for method, kw in (("idg", {"steps": 12, "probe_steps": 12}), ("left_ig", {"steps": 10}), ("ig", {"steps": 7})):
        res = _run(model, {"method": method, "postprocess": "idgi", **kw}, x, base)
        alphas, logits = res.alphas[0], res.values[0]
        change = float(logits[alphas.argmax()] - logits[alphas.argmin()])
        torch.testing.assert_close(res.attributions[0], share * change, msg=method)
        assert float(res.attributions.sum()) == pytest.approx(change)  # completeness on the sampled path


def test_idgi_costs_no_model_pass_and_refuses_non_path_methods() -> None:
    model = SmallCNN()
    x, base = torch.rand(3, 16, 16), torch.zeros(3, 16, 16)
    plain, post = CallStats(), CallStats()
    _run(model, {"method": "idg", "steps": 6, "probe_steps": 6}, x, base, stats=plain)
    r = _run(model, {"method": "idg", "steps": 6, "probe_steps": 6, "postprocess": "idgi"}, x, base, stats=post)
    assert (post.forward_images, post.backward_images, post.calls) == (plain.forward_images, plain.backward_images, plain.calls)
    assert r.forward_passes == 12
    with pytest.raises(ValueError, match="path method"):
        build_plan("agi", x, base, 0, postprocess="idgi", num_classes=10)


def test_idgi_skips_zero_gradient_steps() -> None:
    alphas = torch.tensor([0.0, 0.5, 1.0])
    grads = torch.zeros(3, 1, 1, 2)
    grads[1, 0, 0, 0] = 2.0
    out = idgi(alphas, torch.tensor([0.0, 1.0, 4.0]), grads)
    torch.testing.assert_close(out, torch.tensor([[[3.0, 0.0]]]))  # only step 1 -> 2 (change 3) counts


def test_smoothgrad_and_vargrad_on_a_linear_model_and_their_points_share_calls() -> None:
    model = Linear((3, 4, 4), classes=2).double()
    x, base = torch.rand(3, 4, 4, dtype=torch.float64), torch.zeros(3, 4, 4, dtype=torch.float64)
    w = model.w[0].detach()
    noisy = noisy_copies(x, 5, 0.2, 3)
    common = {"method": "ig", "steps": 4, "smooth_samples": 5, "smooth_std": 0.2, "smooth_seed": 3}
    sg = _run(model, {**common}, x, base)
    torch.testing.assert_close(sg.attributions[0], (w * noisy).mean(0))  # IG of a linear model is w ⊙ (x - x')
    vg = _run(model, {**common, "smooth_kind": "vargrad"}, x, base)
    torch.testing.assert_close(vg.attributions[0], (w * noisy).var(0, unbiased=False))
    assert (sg.forward_passes, sg.backward_passes) == (20, 20)
    counted = Counting(model)
    _run(counted, {**common}, x, base, batch=64)
    assert counted.calls == [20]  # 5 copies x 4 points in one model call


def test_copies_sharing_idgs_probe_pay_it_once_and_sample_where_the_image_itself_moves() -> None:
    """``smooth_probe="shared"``: one probe of the image (its 6 points), then 3 copies x 5 main points, all counted; with
    no noise every copy is the image, so the map is plain IDG's exactly; with noise every copy samples at the image's own
    alphas (the copies' own probes would each place them anew)."""
    a = torch.linspace(-1, 2, 48, dtype=torch.float64).view(3, 4, 4)
    model = Quadratic(a)
    x = torch.rand(3, 4, 4, dtype=torch.float64) + 0.5
    base = x / 4
    idg = {"method": "idg", "steps": 5, "probe_steps": 6}
    plain = _run(model, dict(idg), x, base)
    same = _run(model, {**idg, "smooth_samples": 3, "smooth_std": 0.0, "smooth_probe": "shared"}, x, base)
    torch.testing.assert_close(same.attributions, plain.attributions)
    counted = Counting(model)
    noisy = _run(counted, {**idg, "smooth_samples": 3, "smooth_std": 0.3, "smooth_probe": "shared"}, x, base)
    assert counted.calls == [6, 15]  # the probe once, then the copies' main points in one call
    assert (noisy.forward_passes, noisy.backward_passes) == (6 + 3 * 5, 3 * 5)
    own = _run(model, {**idg, "smooth_samples": 3, "smooth_std": 0.3}, x, base)
    assert (own.forward_passes, own.backward_passes) == (3 * 11, 3 * 5)
    cnn, image, black = SmallCNN(), torch.rand(3, 16, 16), torch.zeros(3, 16, 16)
    idg = {"method": "idg", "steps": 6, "probe_steps": 8, "smooth_samples": 2, "smooth_std": 0.5}
    alone = _run(cnn, {"method": "idg", "steps": 6, "probe_steps": 8}, image, black)
    torch.testing.assert_close(_run(cnn, {**idg, "smooth_probe": "shared"}, image, black).alphas, alone.alphas)
    assert not torch.allclose(_run(cnn, dict(idg), image, black).alphas, alone.alphas)  # a copy's own probe places them anew
    bound = postprocess_bound(METHODS["idg"].bound(METHODS["idg"].validate(steps=5, probe_steps=6)), {"smooth_samples": 3,
                                                                                                       "smooth_probe": "shared"})
    assert (bound.forward, bound.backward) == (21, 15)
    for method, kw in (("ig", {}), ("idg", {"uniform": True})):  # no probe to share
        with pytest.raises(ValueError, match="probe"):
            _run(model, {"method": method, **kw, "smooth_samples": 2, "smooth_probe": "shared"}, x, base)


def test_smooth_idgi_compose_and_bad_options() -> None:
    x, base = torch.rand(3, 16, 16), torch.zeros(3, 16, 16)
    res = _run(SmallCNN(), {"method": "idg", "steps": 4, "probe_steps": 4, "postprocess": "idgi", "smooth_samples": 2}, x, base)
    assert res.attributions.shape == (1, 3, 16, 16) and res.forward_passes == 16
    for bad, msg in (({"smooth_kind": "median"}, "smooth_kind"), ({"postprocess": "gradcam"}, "postprocess"),
                     ({"smooth_samples": -1}, "smooth_samples")):
        with pytest.raises(ValueError, match=msg):
            build_plan("ig", x, base, 0, **bad)
    assert set(METHODS) >= {"idg", "ig", "left_ig"}


def test_the_evaluation_runs_the_variants_on_a_tiny_model(tmp_path) -> None:  # noqa: ANN001
    from PIL import Image

    from idg_evaluation import EvalConfig, evaluate_folder
    from idg_evaluation.runner import VARIANTS

    assert set(VARIANTS) == {"IDG+IDGI", "IG+IDGI", "IDG+SmoothGrad"}
    small = {
        n: (m, {**kw, "steps": 4} | ({"probe_steps": 4} if m == "idg" else {}) | ({"smooth_samples": 2} if "smooth_samples" in kw else {}))
        for n, (m, kw) in VARIANTS.items()
    }
    path = tmp_path / "n01440764_sample.png"
    Image.new("RGB", (40, 36), (60, 200, 90)).save(path)
    cfg = EvalConfig(model="tiny", methods=small, rise_step=256, metrics=("insertion", "deletion"), batch_size=16)
    (record,) = evaluate_folder(tiny_classifier(), [path], tmp_path / "out", cfg, workers=0, progress=False)
    m = record["methods"]
    assert m["IDG+SmoothGrad"]["forward_passes"] == 2 * 8 and m["IDG+IDGI"]["forward_passes"] == 8 and m["IG+IDGI"]["backward_passes"] == 4
    assert all(0 <= e["insertion"] <= 1 for e in m.values())
