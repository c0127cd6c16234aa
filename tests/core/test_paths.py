import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from idg_core import idg
from idg_core.paths import allocate_samples, ig_rule, place_samples, probe_alphas, resolve_baseline
from idg_models import ImageClassifier, Preprocessing
from tests.models import SmallCNN, TwoRises


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(st.floats(-50, 50, allow_nan=False), min_size=3, max_size=60),
    steps=st.integers(2, 120),
)
def test_allocation_always_sums_to_m_and_never_uses_slot_zero(logits: list[float], steps: int) -> None:
    counts = allocate_samples(torch.tensor(logits, dtype=torch.float64), steps)
    assert int(counts.sum()) == steps
    assert counts[0] == 0 and (counts >= 0).all()


def _allocate_in_torch(probe_logits: torch.Tensor, steps: int) -> list[int]:
    """The rule as it was written in torch before it moved to numpy (for speed), step for step: the reference."""
    logits = probe_logits.to(torch.float64)
    n = logits.shape[0]
    slopes = torch.zeros(n, dtype=torch.float64)
    slopes[1:] = (logits[1:] - logits[:-1]) * (n - 1)
    spread = slopes.max() - slopes.min()
    norm = (slopes - slopes.min()) / spread if spread > 0 else torch.ones(n, dtype=torch.float64)
    norm[0] = 0
    if norm.sum() <= 0:
        norm[1:] = 1
    share = norm / norm.sum() * steps
    counts = share.floor().long()
    counts[0] = 0
    left = steps - int(counts.sum())
    frac = share - counts
    frac[0] = -1.0
    empty_first = torch.where(counts == 0, frac, torch.full_like(frac, -2.0))
    for k in torch.argsort(empty_first, descending=True, stable=True)[:left].tolist():
        if empty_first[k] < -0.5 or left == 0:
            break
        counts[k] += 1
        left -= 1
    order = torch.argsort(frac, descending=True, stable=True)[: n - 1].tolist()
    while left > 0:
        for k in order:
            if left == 0:
                break
            counts[k] += 1
            left -= 1
    return [int(c) for c in counts]


@settings(max_examples=300, deadline=None)
@given(
    logits=st.lists(st.one_of(st.floats(-50, 50, allow_nan=False), st.sampled_from([0.0, 1.0, -1.0, 2.5])), min_size=3, max_size=60),
    steps=st.integers(2, 120),
)
def test_allocation_matches_the_torch_reference(logits: list[float], steps: int) -> None:
    """Ties (repeated values: equal slopes, equal fractional shares) included, as the stable order decides them."""
    values = torch.tensor(logits, dtype=torch.float64)
    assert allocate_samples(values, steps).tolist() == _allocate_in_torch(values, steps)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_curve_that_is_not_finite_is_refused_saying_so(bad: float) -> None:
    """The torch rule had spread a NaN curve uniformly and cast an infinite one's NaN shares to int64's minimum."""
    with pytest.raises(ValueError, match="not finite .* at 1 of the 5 probe points"):
        allocate_samples(torch.tensor([0.0, 1.0, bad, 2.0, 3.0], dtype=torch.float64), 16)


def test_flat_curve_spreads_samples_uniformly() -> None:
    counts = allocate_samples(torch.zeros(11), 50)
    assert counts.tolist() == [0] + [5] * 10


def _two_rise_curve(n: int = 50) -> torch.Tensor:
    alphas = probe_alphas(n).float()
    x = alphas.view(-1, 1, 1, 1).expand(n, 1, 4, 4)
    return TwoRises()(x)[:, 0]


def test_aligned_placement_puts_samples_in_both_rises_only() -> None:
    counts = allocate_samples(_two_rise_curve(), 50)
    alphas, weights = place_samples(counts, 50, "aligned")
    in_first = ((alphas >= 0.08) & (alphas <= 0.22)).sum().item()
    in_second = ((alphas >= 0.58) & (alphas <= 0.82)).sum().item()
    # every interval holds its own samples: alpha between its end points
    delta = 1 / 49
    slots = torch.repeat_interleave(torch.arange(50, dtype=torch.float64), counts)
    assert torch.all(alphas >= (slots - 1) * delta - 1e-9) and torch.all(alphas < slots * delta)
    assert in_first >= 15 and in_second >= 15
    leftovers = 50 - in_first - in_second
    assert leftovers <= 5, f"{leftovers} samples outside the rises"
    assert weights.sum().item() == pytest.approx(counts[1:].gt(0).sum().item() * delta)


def test_authors_placement_drifts_left_and_misses_the_second_rise() -> None:
    counts = allocate_samples(_two_rise_curve(), 50)
    aligned, _ = place_samples(counts, 50, "aligned")
    authors, _ = place_samples(counts, 50, "authors")
    assert authors.max() < 0.6 <= aligned.max()
    assert torch.all(authors <= aligned + 1e-12) and (authors < aligned - 1e-9).any()


@pytest.mark.parametrize("rule", ["gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "uniform"])
def test_quadrature_rules_integrate_linear_functions(rule: str) -> None:
    alphas, weights = ig_rule(rule, 20)
    assert weights.sum().item() == pytest.approx(1.0)
    if rule not in ("riemann_left", "riemann_right", "uniform"):
        assert (weights * alphas).sum().item() == pytest.approx(0.5)
    assert alphas.min() >= 0 and alphas.max() <= 1


def test_mean_baseline_is_the_models_normalisation_mean_else_imagenets() -> None:
    base = resolve_baseline("mean", torch.rand(2, 3, 4, 4))
    assert base[1, :, 2, 3].tolist() == pytest.approx([0.485, 0.456, 0.406])
    grey = resolve_baseline("mean", torch.rand(2, 3, 4, 4), (0.5, 0.5, 0.5))
    assert torch.equal(grey, torch.full((2, 3, 4, 4), 0.5))


def test_methods_start_the_mean_baseline_at_their_models_mean() -> None:
    """One definition of "mean" (zero in the model's normalised space) for the library, the
    service and the evaluation: an ImageClassifier's own mean, grey for EfficientNet-Lite."""
    grey = Preprocessing(16, 16, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    model = ImageClassifier("lite-like", SmallCNN(), grey, [str(i) for i in range(10)])
    x = torch.rand(2, 3, 16, 16)
    by_name = idg(model, x, "mean", [1, 2], steps=6, probe_steps=5)
    by_value = idg(model, x, torch.full((3, 1, 1), 0.5), [1, 2], steps=6, probe_steps=5)
    assert torch.equal(by_name.attributions, by_value.attributions)


@pytest.mark.parametrize("bad", ["grey", torch.zeros(2, 3, 3), 5])
def test_bad_baselines_raise(bad: object) -> None:
    with pytest.raises(ValueError, match="baseline"):
        resolve_baseline(bad, torch.rand(1, 3, 4, 4))  # type: ignore[arg-type]
