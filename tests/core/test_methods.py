"""Axioms and closed-form answers for every method, on tiny models."""

from __future__ import annotations

import gc
import importlib
import re
import weakref

import pytest
import torch
from torch import nn

from idg_core import METHODS, CallStats, agi, evaluate_queries, guided_ig, idg, ig, left_ig
from idg_core.postprocess.compose import build_plan
from idg_core.types import Answer, Query
from tests.models import Counting, Linear, SaturatingSum, SmallCNN, TwoRises


def _f(model: torch.nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    with torch.no_grad():
        return model(x)[:, target]


@pytest.mark.parametrize("rule", ["gausslegendre", "riemann_trapezoid", "riemann_middle"])
@pytest.mark.parametrize("model", [SaturatingSum(), SmallCNN()], ids=["1-relu(1-x)", "cnn"])
def test_ig_completeness(model: torch.nn.Module, rule: str) -> None:
    x = torch.rand(2, 3, 16, 16)
    res = ig(model, x, "black", [0, 1], steps=300, rule=rule)
    gap = _f(model, x, 0)[0] - _f(model, torch.zeros_like(x), 0)[0], _f(model, x, 1)[1] - _f(model, torch.zeros_like(x), 1)[1]
    sums = res.attributions.sum(dim=(1, 2, 3))
    assert sums.tolist() == pytest.approx([float(g) for g in gap], rel=2e-2, abs=2e-3)


def test_ig_on_the_ig_papers_saturating_model_matches_closed_form() -> None:
    # s = 2·mean(x) = 2 at x = ones: the output saturates at α = 0.5, IG puts 1/N on every pixel
    x = torch.ones(1, 1, 2, 2)
    res = ig(SaturatingSum(), x, "black", 0, steps=64, rule="riemann_middle")
    assert res.attributions.flatten().tolist() == pytest.approx([0.25] * 4, abs=1e-6)


# AGI is left out by construction: it has no baseline (x' is ignored) and sums -∇p_y ⊙ (x_k - x) over
# FGSM steps x_k that each start again at x, so on a linear model it gives neither w ⊙ (x - x') nor
# F(x) - F(x'). What it does satisfy there is its own closed form (test_agi_on_linear_softmax_*), and
# like every method it gives nothing to a feature the model ignores (test_a_feature_the_model_ignores_*).
@pytest.mark.parametrize("name", ["ig", "left_ig", "idg", "guided_ig"])
def test_linear_model_gives_w_times_delta(name: str) -> None:
    model = Linear()
    x, base = torch.rand(2, 3, 8, 8), torch.rand(2, 3, 8, 8)
    params: dict = {"output": "logit"}
    if name == "idg":  # uniform weights 1/M sum to 1 (an adaptive split of a straight line is noise)
        params |= {"uniform": True, "importance": "exact"}
    res = METHODS[name](model, x, base, [1, 3], **params)
    expected = torch.stack([model.w[1], model.w[3]]).detach() * (x - base)
    if name == "idg":  # IDG weighs by IF_j·w_j/M; on a line IF = F(x) - F(x') everywhere
        gap = (expected.flatten(1).sum(1)).view(-1, 1, 1, 1)
        expected = expected * gap / METHODS["idg"].params["steps"].default  # M: the method's own default
    if name == "left_ig":  # the cut-off keeps a prefix of the path: a positive multiple of w ⊙ Δ
        ratio = res.attributions / expected
        assert torch.allclose(ratio, ratio.flatten(1)[:, :1].view(-1, 1, 1, 1).expand_as(ratio), rtol=1e-3)
        return
    assert torch.allclose(res.attributions, expected, rtol=1e-3, atol=1e-4)


def test_left_ig_cuts_at_the_first_point_over_90_percent_of_the_max() -> None:
    # SaturatingSum at x = ones rises linearly to 1 at α = 0.5 then stays: cut-off where F > 0.9
    x = torch.ones(1, 1, 4, 4)
    res = left_ig(SaturatingSum(), x, "black", 0, steps=16)
    cut = 7  # F(α_k) = 2k/15: k = 7 is the first point above 0.9 (k = 6 gives 0.8)
    assert res.weights[0, :cut].tolist() == pytest.approx([1 / cut] * cut)
    assert res.weights[0, cut:].abs().sum() == 0
    assert res.attributions.sum().item() == pytest.approx(2 * 16 / 16, rel=1e-5)  # grad 2/16 each over α < 0.5


def test_guided_ig_with_max_dist_zero_is_left_riemann_ig() -> None:
    model, x = SmallCNN(), torch.rand(1, 3, 16, 16)
    gig = guided_ig(model, x, "black", 2, steps=20, max_dist=0.0, output="logit")
    ig_res = ig(model, x, "black", 2, steps=20, rule="riemann_left")
    assert torch.allclose(gig.attributions, ig_res.attributions, rtol=1e-4, atol=1e-6)


def test_guided_ig_moves_the_whole_way() -> None:
    model, x = SmallCNN(), torch.rand(1, 3, 16, 16)
    res = guided_ig(model, x, "black", 2, steps=15, fraction=0.25, max_dist=0.1, output="logit")
    gap = _f(model, x, 2) - _f(model, torch.zeros_like(x), 2)
    assert res.attributions.sum().item() == pytest.approx(gap.item(), rel=0.15, abs=0.05)


def test_idg_exact_importance_sums_to_the_quadrature_of_the_squared_slope() -> None:
    model, x = SmallCNN(), torch.rand(3, 3, 16, 16)
    res = idg(model, x, "mean", [0, 4, 7], steps=20, probe_steps=15, importance="exact")
    expected = (res.weights * res.importance**2).sum(1) / 20
    assert res.attributions.double().sum(dim=(1, 2, 3)).tolist() == pytest.approx(expected.tolist(), rel=1e-4)
    assert (res.attributions.sum(dim=(1, 2, 3)) >= 0).all()


def test_idg_sensitivity_flat_samples_contribute_nothing() -> None:
    # TwoRises is flat outside its rises: every sample whose importance is ~0 adds ~0
    x = torch.ones(1, 1, 4, 4)
    res = idg(TwoRises(), x, "black", 0, steps=50, probe_steps=50, importance="exact")
    flat = (res.alphas[0] < 0.05) | ((res.alphas[0] > 0.3) & (res.alphas[0] < 0.5)) | (res.alphas[0] > 0.95)
    assert (res.importance[0][flat].abs() < 1e-2).all()
    # and a feature that does not differ from the baseline gets exactly zero
    x2 = torch.ones(1, 1, 4, 4)
    x2[0, 0, 0, 0] = 0
    res2 = idg(TwoRises(), x2, "black", 0, steps=20, probe_steps=20)
    assert res2.attributions[0, 0, 0, 0] == 0


def test_idg_result_shapes_and_costs() -> None:
    res = idg(SmallCNN(), torch.rand(2, 3, 16, 16), "black", [1, 2], steps=12, probe_steps=9)
    assert res.attributions.shape == (2, 3, 16, 16)
    for field in (res.alphas, res.values, res.importance, res.weights):
        assert field.shape == (2, 12)
    assert res.probe_alphas.shape == (9,) and res.probe_values.shape == (2, 9)
    assert (res.forward_passes, res.backward_passes) == (2 * (9 + 12), 2 * 12)
    assert (res.alphas.diff(dim=1) > 0).all()


def _authors_idg(
    model: torch.nn.Module, inp: torch.Tensor, baseline: torch.Tensor, steps: int, batch_size: int, target: int,
) -> torch.Tensor:
    """An independent line-by-line port of the authors' published IDG (saliencyMethods.py)."""
    loops = steps // batch_size
    baseline_diff = inp - baseline
    # getSlopes
    alphas = torch.linspace(0, 1, steps).reshape(steps, 1, 1, 1)
    logits = torch.zeros(steps)
    for i in range(loops):
        s, e = i * batch_size, (i + 1) * batch_size
        with torch.no_grad():
            logits[s:e] = model(baseline + alphas[s:e] * baseline_diff)[:, target]
    slopes = torch.zeros(steps)
    x_diff = float(alphas.squeeze()[1] - alphas.squeeze()[0])
    for i in range(steps - 1):
        slopes[i + 1] = (logits[i + 1] - logits[i]) / x_diff
    # getAlphaParameters
    norm = (slopes - slopes.min()) / (slopes.max() - slopes.min())
    norm[0] = 0
    norm = norm / norm.sum()
    place_f = norm * steps
    place_i = place_f.type(torch.int)
    remaining = steps - int(place_i.sum())
    place_f[torch.where(place_i != 0)[0]] = -1
    order = torch.flip(torch.sort(place_f)[1], dims=[0])
    place_i[order[:remaining]] = 1
    new_alphas, substep = torch.zeros(steps), torch.zeros(steps)
    idx, start = 0, 0.0
    for n in place_i:
        n = int(n)
        if n == 0:
            continue
        new_alphas[idx : idx + n] = torch.linspace(start, start + x_diff, n + 1)[:n]
        substep[idx : idx + n] = x_diff / n
        idx += n
        start += x_diff
    # main pass
    a4 = new_alphas.reshape(steps, 1, 1, 1)
    grads, lg = torch.zeros(steps, *inp.shape[1:]), torch.zeros(steps)
    for i in range(loops):
        s, e = i * batch_size, (i + 1) * batch_size
        pts = (baseline + a4[s:e] * baseline_diff).requires_grad_(True)
        out = model(pts)[:, target]
        grads[s:e] = torch.autograd.grad(out, pts, grad_outputs=torch.ones_like(out))[0]
        lg[s:e] = out.detach()
    sl = torch.zeros(steps)
    for i in range(steps - 1):
        sl[i + 1] = (lg[i + 1] - lg[i]) / (new_alphas[i + 1] - new_alphas[i])
    grads = grads * sl.reshape(steps, 1, 1, 1) * substep.reshape(steps, 1, 1, 1)
    return (grads.mean(0) * baseline_diff[0]).squeeze()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_authors_placement_matches_a_port_of_the_published_code(seed: int) -> None:
    model = SmallCNN(seed=seed)
    torch.manual_seed(seed + 10)
    x, base = torch.rand(1, 3, 16, 16), torch.zeros(1, 3, 16, 16)
    expected = _authors_idg(model, x, base, steps=20, batch_size=10, target=3)
    ours = idg(model, x, base, 3, steps=20, probe_steps=20, placement="authors", batch_size=7)
    assert torch.allclose(ours.attributions[0], expected, atol=1e-5, rtol=1e-4)


def test_points_of_several_images_share_model_calls() -> None:
    model = Counting(SmallCNN())
    x = torch.rand(2, 3, 16, 16)
    stats = CallStats()
    both = idg(model, x, "black", [1, 6], steps=10, probe_steps=10, batch_size=64, stats=stats)
    assert model.calls == [20, 20]  # one probe call, one main call, both images in each
    assert stats.calls == 2 and stats.backward_images == 20
    model.calls.clear()
    one = idg(model, x[:1], "black", 1, steps=10, probe_steps=10, batch_size=64)
    two = idg(model, x[1:], "black", 6, steps=10, probe_steps=10, batch_size=64)
    assert torch.allclose(both.attributions[0], one.attributions[0], atol=1e-6)
    assert torch.allclose(both.attributions[1], two.attributions[0], atol=1e-6)


def test_batch_size_caps_every_model_call() -> None:
    model = Counting(SmallCNN())
    ig(model, torch.rand(3, 3, 16, 16), "black", 0, steps=10, batch_size=7)
    assert max(model.calls) <= 7 and sum(model.calls) == 30 and len(model.calls) == 5


def test_fixed_call_shapes_pad_every_call_and_change_no_attribution() -> None:
    """shapes= (graphed_shapes on a CPU: fixed sizes, no graphs): 2 images x 10 points per pass in calls of 16
    (16 + 4 padded to 16), counted in the shapes; the attributions are those of unpadded calls."""
    from idg_models.cuda_graphs import graphed_shapes

    model = Counting(SmallCNN())
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    shapes = graphed_shapes(model, (16,), 16)
    assert shapes.sizes == (16,) and shapes.graphs == {}
    got = idg(model, x, "black", [1, 6], steps=10, probe_steps=10, batch_size=64, shapes=shapes)
    assert model.calls == [16, 16, 16, 16] and shapes.real_rows == 40 and shapes.padded_rows == 24
    model.calls.clear()
    want = idg(model, x, "black", [1, 6], steps=10, probe_steps=10, batch_size=64)
    assert model.calls == [20, 20]
    assert torch.allclose(got.attributions, want.attributions, atol=1e-6)


def test_a_query_one_call_holds_whole_is_answered_with_views_of_it_and_a_split_one_the_same_numbers() -> None:
    """Booking copies no gradients for a query whose rows are all in one call: its answer shares the call's output
    (one storage for both queries' gradients); one split over calls (batch 7 cuts the 10-row query) gets its own
    buffer, holding what the unsplit evaluation holds, row for row."""
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.rand(2, 3, 16, 16)
    queries = [Query.path(x[0] * 0, x[0], torch.linspace(0, 1, 10, dtype=torch.float64), 1, grad=True, output="logit"),
               Query.at(x[1:].expand(4, 3, 16, 16), 6, grad=True, output="logit", full=True)]
    whole = evaluate_queries(model, queries, batch_size=64)
    assert whole[0].grads is not None and whole[1].grads is not None
    assert whole[0].grads.untyped_storage().data_ptr() == whole[1].grads.untyped_storage().data_ptr()
    split = evaluate_queries(model, queries, batch_size=7)  # calls of 7 + 3 + 4 rows: the first query in two
    assert split[0].grads is not None and split[1].grads is not None
    assert split[0].grads.untyped_storage().data_ptr() != split[1].grads.untyped_storage().data_ptr()
    for w, s in zip(whole, split, strict=True):
        assert torch.allclose(w.values, s.values, atol=1e-6) and torch.equal(w.top1, s.top1)
        assert w.grads is not None and s.grads is not None and torch.allclose(w.grads, s.grads, atol=1e-6)
    assert whole[1].all_logits is not None and split[1].all_logits is not None and whole[1].all_logits.shape == (4, 10)
    assert torch.allclose(whole[1].all_logits, split[1].all_logits, atol=1e-6) and whole[0].all_logits is None


@pytest.mark.parametrize("name", [*sorted(METHODS), "idg+idgi+smoothgrad"])
def test_a_plan_keeps_no_answer_while_its_next_model_call_runs(name: str) -> None:
    """Answers are views of a whole model call's outputs (for a query the call holds whole): a plan that kept one
    across its next step would keep the call's buffers alive (on a GPU, up to a 128-row batch of gradients per job).
    Each step is answered with views of larger buffers; once the plan has taken its next step they must be gone."""
    torch.manual_seed(0)
    x = torch.rand(3, 16, 16)
    plan = (build_plan("idg", x, torch.zeros_like(x), 3, postprocess="idgi", smooth_samples=3) if "+" in name
            else METHODS[name].plan(x, torch.zeros_like(x), 3))
    queries = next(plan)
    for _ in range(8):
        buffers = [(torch.randn(q.n + 64), torch.randn(q.n + 64, 3, 16, 16) if q.grad else None,
                    torch.zeros(q.n + 64, dtype=torch.long), torch.randn(q.n + 64, 10) if q.full else None,
                    *((torch.rand(q.n + 64, 5, 4, 4), torch.randn(q.n + 64, 5, 4, 4)) if q.features else (None, None)))
                   for q in queries]
        refs = [weakref.ref(t) for group in buffers for t in group if t is not None]
        answers = [Answer(v[: q.n], None if g is None else g[: q.n], t[: q.n], None if lg is None else lg[: q.n],
                          None if f is None else f[: q.n], None if fg is None else fg[: q.n])
                   for q, (v, g, t, lg, f, fg) in zip(queries, buffers, strict=True)]
        del buffers
        try:
            queries = plan.send(answers)
        except StopIteration:
            break
        finally:
            del answers
        gc.collect()
        assert all(r() is None for r in refs), f"{name} kept an answer of its last step while asking its next"
    plan.close()


def test_evaluator_leaves_no_parameter_gradients() -> None:
    model = SmallCNN()
    idg(model, torch.rand(1, 3, 16, 16), "black", 0, steps=5, probe_steps=5)
    assert all(p.grad is None for p in model.parameters())


def test_agi_is_seeded_and_stops_when_the_attack_succeeds() -> None:
    model, x = SmallCNN(), torch.rand(1, 3, 16, 16)
    a = agi(model, x, None, 0, num_classes=10, max_iter=5, seed=3)  # type: ignore[arg-type]
    b = agi(model, x, None, 0, num_classes=10, max_iter=5, seed=3)  # type: ignore[arg-type]
    assert torch.equal(a.attributions, b.attributions) and a.attributions.abs().sum() > 0
    # eps = 1 sign step flips a 10-class toy CNN's prediction quickly for some class
    counts = [
        agi(model, x, "black", 0, adversarial_targets=[t], num_classes=10, max_iter=20, epsilon=1.0).forward_passes
        for t in range(1, 10)
    ]
    assert min(counts) < 40
    quick = counts.index(min(counts)) + 1  # without early_stop the same attack runs every iteration
    counted = Counting(model)
    full = agi(counted, x, "black", 0, adversarial_targets=[quick], num_classes=10, max_iter=20, epsilon=1.0, early_stop=False)
    assert full.forward_passes == sum(counted.calls) == 40


def test_agi_on_linear_softmax_follows_the_closed_form() -> None:
    # one iteration: attribution = -∇p_y(x0) ⊙ (clamp(x0 + ε·sign(∇p_t(x0))) - x0)
    model, x = Linear(classes=3), torch.rand(1, 3, 8, 8) * 0.5 + 0.25
    label = int(model(x).argmax())
    adv = (label + 1) % 3
    res = agi(model, x, "black", label, adversarial_targets=[adv], num_classes=3, max_iter=1, epsilon=0.1)
    xr = x.clone().requires_grad_(True)
    p = torch.softmax(model(xr), 1)[0]
    g_adv = torch.autograd.grad(p[adv], xr, retain_graph=True)[0]
    g_lab = torch.autograd.grad(p[label], xr)[0]
    expected = -g_lab * (torch.clamp(x + 0.1 * g_adv.sign(), 0, 1) - x)
    assert torch.allclose(res.attributions, expected, atol=1e-7)


def test_agi_on_linear_softmax_sums_the_closed_form_over_classes_and_iterations() -> None:
    # p = softmax(W x + b): ∇p_c(x) = p_c · (w_c - Σ_k p_k w_k), in closed form (no autograd). Every
    # iteration steps from x0 along the sign of ∇p_adv at the previous point and adds
    # -∇p_label(previous point) ⊙ (new point - x0); the classes' sums add up
    model, x0 = Linear(classes=4), torch.rand(1, 3, 8, 8) * 0.5 + 0.25
    w = model.w.detach()
    label = int(model(x0).argmax())
    advs, eps, iters = [c for c in range(4) if c != label][:2], 0.1, 3

    def grad_p(x: torch.Tensor, c: int) -> torch.Tensor:
        with torch.no_grad():
            p = torch.softmax(model(x.unsqueeze(0)), 1)[0]
        return p[c] * (w[c] - torch.einsum("k,kchw->chw", p, w))

    expected = torch.zeros_like(x0[0])
    for adv in advs:
        point = x0[0]
        for _ in range(iters):
            g_adv, g_lab = grad_p(point, adv), grad_p(point, label)
            point = torch.clamp(x0[0] + eps * g_adv.sign(), 0, 1)
            expected -= g_lab * (point - x0[0])
    res = agi(model, x0, "black", label, adversarial_targets=advs, num_classes=4, max_iter=iters, epsilon=eps, early_stop=False)
    assert torch.allclose(res.attributions[0], expected, atol=1e-7) and expected.abs().sum() > 0
    assert res.forward_passes == res.backward_passes == 2 * iters * len(advs)
    # no baseline: the one given changes nothing
    assert torch.equal(res.attributions, agi(model, x0, "mean", label, adversarial_targets=advs, num_classes=4,
                                              max_iter=iters, epsilon=eps, early_stop=False).attributions)


class _LeftHalfOnly(nn.Module):
    """A SmallCNN that sees only the left half of the image: the right half is a dummy feature."""

    def __init__(self) -> None:
        super().__init__()
        self.net = SmallCNN()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.zeros_like(x)
        keep[..., :8] = 1
        return self.net(x * keep)


CAMS = ("gradcam", "gradcam_pp")
"""Maps of a layer, upsampled: not the input gradient's methods (tests/core/test_gradcam.py holds them)."""


@pytest.mark.parametrize("name", [n for n in METHODS if n not in CAMS])
def test_a_feature_the_model_ignores_gets_no_attribution(name: str) -> None:
    # sensitivity (b), the dummy axiom: it holds for every method of input gradients, AGI included (its ∇p_y is 0 there);
    # not for a CAM, whose layer lights masked positions by its biases and whose upsampling spreads the map
    model, x = _LeftHalfOnly(), torch.rand(1, 3, 16, 16)
    target = int(model(x).argmax())  # AGI attacks the predicted class: its first step always moves
    given = {"steps": 8, "probe_steps": 8, "max_iter": 5, "num_classes": 10, "classes": 3, "samples": 8, "paths": 2}
    kwargs = {k: v for k, v in given.items() if k in METHODS[name].parameters}
    res = METHODS[name](model, x, "black", target, **kwargs)
    assert (res.attributions[..., 8:] == 0).all()
    assert res.attributions[..., :8].abs().sum() > 0


@pytest.mark.parametrize(
    ("name", "kwargs", "word"),
    [
        ("idg", {"steps": 1}, "steps"),
        ("idg", {"probe_steps": 2}, "probe_steps"),
        ("idg", {"placement": "left"}, "placement"),
        ("idg", {"importance": "magic"}, "importance"),
        ("idg", {"batch_size": 0}, "batch_size"),
        ("ig", {"rule": "simpson"}, "rule"),
        ("ig", {"steps": 0}, "steps"),
        ("guided_ig", {"fraction": 1.5}, "fraction"),
        ("guided_ig", {"max_dist": -0.1}, "max_dist"),
        ("agi", {"epsilon": 2.0}, "epsilon"),
        ("agi", {"max_iter": 0}, "max_iter"),
        ("left_ig", {"output": "softmax"}, "output"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(name: str, kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        METHODS[name](SmallCNN(), torch.rand(1, 3, 16, 16), "black", 0, **kwargs)


@pytest.mark.parametrize("x", [torch.rand(3, 16, 16), torch.full((1, 3, 16, 16), float("nan")), torch.zeros(0, 3, 16, 16)])
def test_bad_images_raise(x: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="x must"):
        idg(SmallCNN(), x, "black", 0)


@pytest.mark.parametrize("target", [-1, 10, [0, 1, 2]])
def test_bad_targets_raise(target: object) -> None:
    with pytest.raises(ValueError, match="target"):
        idg(SmallCNN(), torch.rand(2, 3, 16, 16), "black", target, steps=4, probe_steps=4)  # type: ignore[arg-type]


def test_adaptive_ig_uses_idgs_samples_and_stays_complete() -> None:
    model, x = SmallCNN(), torch.rand(1, 3, 16, 16)
    ig_res = ig(model, x, "black", 4, steps=60, probe_steps=30, rule="adaptive")
    ref = idg(model, x, "black", 4, steps=60, probe_steps=30)
    assert torch.equal(ig_res.alphas, ref.alphas) and ig_res.weights.sum().item() == pytest.approx(1.0)
    assert (ig_res.forward_passes, ig_res.backward_passes) == (90, 60)
    gap = _f(model, x, 4) - _f(model, torch.zeros_like(x), 4)
    assert ig_res.attributions.sum().item() == pytest.approx(gap.item(), rel=0.1, abs=0.05)


@pytest.mark.parametrize(
    ("name", "kwargs", "words"),
    [
        ("guided_ig", {"fraction": 0.0}, "one feature at a time"),
        ("guided_ig", {"fraction": 0.005}, "fraction must be a number in [0.01, 1.0]"),
        ("agi", {"epsilon": 0.0}, "never moves the image"),
    ],
)
def test_degenerate_parameters_are_refused_saying_why(name: str, kwargs: dict, words: str) -> None:
    model = Counting(SmallCNN())
    with pytest.raises(ValueError, match=re.escape(words)):
        METHODS[name](model, torch.rand(1, 3, 16, 16), "black", 0, **kwargs)
    assert model.calls == []


def test_guided_ig_sub_steps_are_bounded_and_checkpointed(monkeypatch: pytest.MonkeyPatch) -> None:
    gig = importlib.import_module("idg_core.methods.guided_ig")
    substeps: list[int] = [0]
    real = gig._lower_quantile

    def counting(values: torch.Tensor, q: float) -> torch.Tensor:
        substeps[-1] += 1
        return real(values, q)

    monkeypatch.setattr(gig, "_lower_quantile", counting)
    model, x = SmallCNN(), torch.rand(3, 16, 16)
    plan = gig.guided_ig_plan(x, torch.zeros_like(x), 2, steps=6, fraction=0.01, max_dist=0.02, output="logit")
    queries, checkpoints = next(plan), 0
    try:
        while True:
            if not queries:
                checkpoints += 1
            else:
                substeps.append(0)  # a model call: the next step's sub-steps begin after it
            queries = plan.send(evaluate_queries(model, queries, 8))
    except StopIteration as stop:
        result = stop.value
    assert 0 < max(substeps) <= gig.substep_bound(0.01) == 102
    assert checkpoints == sum(max(0, (n - 1) // gig.CHECKPOINT_EVERY) for n in substeps) > 0
    same = guided_ig(model, x.unsqueeze(0), "black", 2, steps=6, fraction=0.01, max_dist=0.02, output="logit")
    assert torch.equal(result.attributions, same.attributions)


@pytest.mark.parametrize("name", list(METHODS))
def test_work_bound_is_known_before_and_holds(name: str) -> None:
    model = Counting(SmallCNN())
    params = METHODS[name].parameters | {"num_classes": 10, "steps": 12, "probe_steps": 7, "max_iter": 6, "adversarial_classes": 2,
                                         "classes": 3, "samples": 9, "paths": 2}
    kwargs = {k: v for k, v in params.items() if k in METHODS[name].parameters}
    bound = METHODS[name].bound(kwargs)
    res = METHODS[name](model, torch.rand(1, 3, 16, 16), "black", 3, batch_size=64, **kwargs)
    assert res.forward_passes <= bound.forward and res.backward_passes <= bound.backward
    if name != "agi":  # only AGI may stop early
        assert (res.forward_passes, res.backward_passes) == (bound.forward, bound.backward)


class _DeviceValues(torch.Tensor):
    """An answer's values as if they lived on a GPU: each copy to the host (``.cpu()``, ``.to("cpu")``, ``.tolist()``,
    ``.item()``, ``.numpy()``, ``int()``, ``float()``, ``bool()``) is counted, as each is a wait for the device there,
    and gives a plain host tensor."""

    copies = 0
    HOST = {torch.Tensor.cpu, torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.__int__,
            torch.Tensor.__float__, torch.Tensor.__bool__, torch.Tensor.__index__}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        to_host = func in cls.HOST or (func is torch.Tensor.to and "cpu" in [str(a) for a in (*args[1:], *kwargs.values())])
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if to_host:
            cls.copies += 1
            return out.as_subclass(torch.Tensor) if isinstance(out, torch.Tensor) else out
        return out.as_subclass(cls) if isinstance(out, torch.Tensor) else out


@pytest.mark.parametrize(("name", "want"), [("idg", [1, 1]), ("ig", [1])])
def test_each_step_copies_its_answers_values_to_the_host_once(name: str, want: list[int]) -> None:
    """On a GPU each copy of a step's values to the host waits for the device, and one made after the step has queued
    its own kernels waits for those too, behind the next model call (the H200's worker profile: three waits per IDG
    main step). The probe and the main pass each copy their values once; the answer equals the method's own."""
    model, x = SmallCNN(), torch.rand(3, 16, 16)
    plan = METHODS[name].plan(x, torch.zeros_like(x), 2, steps=6, probe_steps=4, output="logit")
    queries, copies = next(plan), []
    try:
        while True:
            answers = [Answer(a.values.as_subclass(_DeviceValues), a.grads, a.top1) for a in evaluate_queries(model, queries, 8)]
            before = _DeviceValues.copies
            queries = plan.send(answers)
            copies.append(_DeviceValues.copies - before)
    except StopIteration as stop:
        copies.append(_DeviceValues.copies - before)
        result = stop.value
    assert copies == want  # IDG: the probe, the main pass
    same = METHODS[name].function(model, x.unsqueeze(0), "black", 2, steps=6, probe_steps=4, output="logit")
    torch.testing.assert_close(result.attributions, same.attributions)
    torch.testing.assert_close(result.values, same.values)


def test_a_prediction_copies_its_logits_to_the_host_once() -> None:
    """The prediction pass of an explanation (its class probabilities): one copy of the logits to the host (on a GPU its
    finiteness check and its softmax there had waited for the device twice), the probabilities as before."""
    from idg_core.explain import predict_plan

    model, x = SmallCNN(), torch.rand(3, 16, 16)
    plan = predict_plan(x)
    (answer,) = evaluate_queries(model, next(plan), 8)
    assert answer.all_logits is not None
    before = _DeviceValues.copies
    with pytest.raises(StopIteration) as stop:
        plan.send([Answer(answer.values, None, answer.top1, answer.all_logits.as_subclass(_DeviceValues))])
    assert _DeviceValues.copies - before == 1
    probs = stop.value.value
    assert type(probs) is torch.Tensor and probs.device.type == "cpu"
    torch.testing.assert_close(probs, torch.softmax(model(x.unsqueeze(0))[0].detach(), 0))
