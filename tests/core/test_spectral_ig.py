"""Spectral IG against a port of its authors' code (github.com/leekwoon/sig, MIT, commit 07fd4d0:
``cleanig/explainer/path_utils.py`` ``SpectralPathGenerator`` and ``cleanig/explainer/ig.py`` ``compute_ig``),
and its axioms where they hold."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from idg_core import METHODS, CallStats, ig, spectral_ig
from idg_core.methods.spectral_ig import PAPER
from tests.models import Linear, SmallCNN

# --- the authors' code, ported line by line (their per-channel SVD and DCT states, the gate, compute_ig) ---


def _ref_component_scale(strength: Tensor, alpha: float, overlap: float, schedule: str, k: float = 12.0) -> Tensor:
    alpha_tensor = torch.as_tensor(alpha, device=strength.device, dtype=strength.dtype)
    width = max(overlap, 0.0)
    start_alpha = (1.0 - width) * (1.0 - strength)
    if width <= 1e-8:
        return (alpha_tensor >= start_alpha).to(strength.dtype)
    progress = ((alpha_tensor - start_alpha) / width).clamp(0.0, 1.0)
    if schedule == "linear":
        return progress
    if schedule == "cosine":
        return 0.5 - 0.5 * torch.cos(progress * math.pi)
    if schedule == "sigmoid":
        raw = torch.sigmoid(k * (progress - 0.5))
        low = torch.sigmoid(torch.tensor(-0.5 * k, dtype=strength.dtype))
        high = torch.sigmoid(torch.tensor(0.5 * k, dtype=strength.dtype))
        return ((raw - low) / (high - low + 1e-10)).clamp(0.0, 1.0)
    return (progress >= 0.5).to(strength.dtype)


def _ref_dct_matrix(size: int, dtype: torch.dtype) -> Tensor:
    n = torch.arange(size, dtype=dtype).unsqueeze(0)
    k = torch.arange(size, dtype=dtype).unsqueeze(1)
    matrix = torch.cos(math.pi / size * (n + 0.5) * k)
    matrix[0] *= math.sqrt(1.0 / size)
    if size > 1:
        matrix[1:] *= math.sqrt(2.0 / size)
    return matrix


def _ref_paths(x_input: Tensor, x_baseline: Tensor, num_steps: int, overlap: float, mode: str, schedule: str) -> Tensor:
    diff = x_input - x_baseline
    if mode == "svd":
        u, s, vh = torch.linalg.svd(diff, full_matrices=False)
        strength = (s / s[:, :1].clamp_min(1e-10)).clamp(0.0, 1.0)
    else:
        _, h, w = diff.shape
        dct_h, dct_w = _ref_dct_matrix(h, diff.dtype), _ref_dct_matrix(w, diff.dtype)
        coeffs = torch.matmul(torch.matmul(dct_h, diff), dct_w.transpose(0, 1))
        yy, xx = torch.meshgrid(torch.linspace(0.0, 1.0, steps=h), torch.linspace(0.0, 1.0, steps=w), indexing="ij")
        radius = torch.sqrt(xx.square() + yy.square())
        radius = radius / radius.max().clamp_min(1e-10)
        strength = (1.0 - radius).clamp(0.0, 1.0)
    paths = []
    for step in range(num_steps):
        alpha = 1.0 if num_steps <= 1 else step / (num_steps - 1)
        if mode == "svd":
            s_scaled = s * _ref_component_scale(strength, alpha, overlap, schedule)
            diff_scaled = torch.matmul(u * s_scaled.unsqueeze(1), vh)
        else:
            scaled = coeffs * _ref_component_scale(strength, alpha, overlap, schedule).unsqueeze(0)
            diff_scaled = torch.matmul(torch.matmul(dct_h.transpose(0, 1), scaled), dct_w)
        paths.append(x_baseline + diff_scaled)
    return torch.stack(paths, dim=0)


def _ref_compute_ig(model: nn.Module, paths: Tensor, labels: Tensor, exp_obj: str) -> Tensor:
    """``compute_ig`` with ``get_grads``: a gradient at every point, the last unused; paths ``(B, S, C, H, W)``."""
    grads = torch.zeros(paths.shape)
    for i in range(paths.shape[1]):
        particular_slice = paths[:, i].clone().requires_grad_(True)
        output = model(particular_slice)
        if exp_obj == "prob":
            output = torch.softmax(output, dim=-1)
        output = output[torch.arange(output.shape[0]), labels]
        grads[:, i] = torch.autograd.grad(output.sum(), particular_slice)[0].detach()
    deltas = paths[:, 1:] - paths[:, :-1]
    return (deltas * grads[:, :-1]).sum(dim=1)


def _reference(model: nn.Module, x: Tensor, baseline: Tensor, labels: list[int], steps: int, overlap: float, mode: str,
               schedule: str, exp_obj: str) -> Tensor:
    paths = torch.stack([_ref_paths(x[b], baseline[b], steps, overlap, mode, schedule) for b in range(x.shape[0])])
    return _ref_compute_ig(model, paths, torch.tensor(labels), exp_obj)


# --- the tests ---


@pytest.mark.parametrize(("basis", "schedule", "overlap", "output"), [
    ("svd", "linear", 0.4, "probability"),  # the authors' settings
    ("svd", "sigmoid", 0.2, "logit"),
    ("svd", "cosine", 0.0, "probability"),  # no overlap: components switch on one by one
    ("dct", "step", 0.3, "logit"),
])
def test_matches_the_authors_code_on_the_same_path(basis: str, schedule: str, overlap: float, output: str) -> None:
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.rand(2, 3, 16, 12)  # not square: SVD's K = min(H, W)
    base = torch.zeros_like(x)  # the authors' "zero" baseline
    ours = spectral_ig(model, x, "black", [2, 7], steps=24, overlap=overlap, basis=basis, schedule=schedule, output=output)
    ref = _reference(model, x, base, [2, 7], 24, overlap, basis, schedule, "prob" if output == "probability" else "logit")
    assert ref.abs().max() > 0
    assert torch.allclose(ours.attributions, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
    assert (ours.forward_passes, ours.backward_passes) == (2 * 23, 2 * 23)


class _Normalised(nn.Module):
    """The network behind per-channel normalisation: the authors run their path in the normalised space."""

    def __init__(self, net: nn.Module, mean: Tensor, std: Tensor) -> None:
        super().__init__()
        self.net, self.mean, self.std = net, mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.net((x - self.mean) / self.std)


@pytest.mark.parametrize("basis", ["svd", "dct"])
def test_pixel_space_path_is_the_authors_normalised_space_path(basis: str) -> None:
    # the authors' code: baseline = preprocess(zeros), path and gradients in the normalised space; here the
    # model normalises and the path is built from pixels. Per-channel linear components: the same attribution.
    torch.manual_seed(1)
    net, mean, std = SmallCNN(seed=3), torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    x = torch.rand(1, 3, 16, 16)
    ours = spectral_ig(_Normalised(net, mean, std), x, "black", 4, steps=30, basis=basis)
    normalise = _Normalised(nn.Identity(), mean, std)
    ref = _reference(net, normalise(x), normalise(torch.zeros_like(x)), [4], 30, PAPER["overlap"], basis, "linear", "prob")
    assert torch.allclose(ours.attributions, ref, rtol=1e-3, atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize("basis", ["svd", "dct"])
def test_linear_model_gives_w_times_delta(basis: str) -> None:
    # the left sum telescopes: Σ_k w ⊙ (x(α_k+1) - x(α_k)) = w ⊙ (x - x') whatever the path
    model = Linear()
    x, base = torch.rand(2, 3, 8, 8, dtype=torch.float64), torch.rand(2, 3, 8, 8, dtype=torch.float64)
    res = spectral_ig(model.double(), x, base, [1, 3], steps=7, basis=basis, output="logit")
    expected = torch.stack([model.w[1], model.w[3]]).detach() * (x - base)
    assert torch.allclose(res.attributions, expected, atol=1e-10)


@pytest.mark.parametrize("basis", ["svd", "dct"])
def test_full_overlap_is_the_straight_path(basis: str) -> None:
    # w = 1: every component starts at α = 0 and rises linearly, so x(α) = x' + α (x - x'): IG, left Riemann sum
    torch.manual_seed(5)
    model, x = SmallCNN(), torch.rand(1, 3, 16, 16)
    res = spectral_ig(model, x, "black", 3, steps=9, overlap=1.0, basis=basis, output="logit")
    ref = ig(model, x, "black", 3, steps=8, rule="riemann_left")
    assert torch.allclose(res.attributions, ref.attributions, rtol=1e-4, atol=1e-6)


def test_completeness_on_a_smooth_model() -> None:
    # Σ SIG = Σ_k ∇F(x_k)·(x_k+1 - x_k) → F(x) - F(x') as the steps grow (the left sum's error falls as 1/S)
    torch.manual_seed(2)
    model, x = SmallCNN(), torch.rand(1, 3, 16, 16)
    with torch.no_grad():
        gap = float(torch.softmax(model(x), 1)[0, 5] - torch.softmax(model(torch.zeros_like(x)), 1)[0, 5])
    errors = [abs(float(spectral_ig(model, x, "black", 5, steps=s).attributions.sum()) - gap) for s in (10, 200)]
    assert abs(gap) > 1e-3
    assert errors[1] < 0.03 * abs(gap) and errors[1] < errors[0] / 5


def test_the_path_runs_from_the_baseline_to_the_image_coarse_first() -> None:
    torch.manual_seed(3)
    base = torch.full((3, 16, 16), 0.5)
    # per channel a strong rank-1 pattern plus faint noise: the other singular values are under 3/4 of the first
    x = base + 0.3 * torch.rand(3, 16, 1) * torch.rand(3, 1, 16) + 0.01 * torch.randn(3, 16, 16)
    plan = METHODS["spectral_ig"].plan(x, base, 0, steps=11, overlap=0.2)
    (query,) = next(plan)
    plan.close()
    points = query.origin  # the points with a gradient: x(α_k), k < S - 1
    assert query.n == 10 and torch.equal(points[0], base)
    # at α = 0.2 the largest singular component (strength 1, enters at 0, full after the overlap) is in whole,
    # the others (strength < 3/4, enter after (1 - 0.2)(1 - 3/4) = 0.2) not at all: the rank-1 part of x - x' per channel
    u, s, vh = torch.linalg.svd(x - base, full_matrices=False)
    assert (s[:, 1] < 0.75 * s[:, 0]).all()
    rank1 = (u[..., :1] * s[:, None, :1]) @ vh[:, :1]
    assert torch.allclose(points[2] - base, rank1, atol=1e-5)


def test_cost_bound_and_batching() -> None:
    stats = CallStats()
    bound = METHODS["spectral_ig"].bound(METHODS["spectral_ig"].validate(steps=25))
    res = spectral_ig(SmallCNN(), torch.rand(3, 3, 16, 16), "black", [0, 1, 2], steps=25, batch_size=36, stats=stats)
    assert (bound.forward, bound.backward) == (24, 24)
    assert (res.forward_passes, res.backward_passes) == (72, 72) == (stats.forward_images, stats.backward_images)
    assert stats.call_sizes == [36, 36]  # the three images' points pooled into full calls


@pytest.mark.parametrize(("kwargs", "word"), [({"steps": 1}, "steps"), ({"overlap": 1.5}, "overlap"),
                                              ({"basis": "wavelet"}, "basis"), ({"schedule": "tanh"}, "schedule")])
def test_bad_parameters_are_refused_naming_them(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        spectral_ig(SmallCNN(), torch.rand(1, 3, 16, 16), "black", 0, **kwargs)
