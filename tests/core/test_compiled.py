"""torch.compile at fixed batch sizes (idg_models.compiled): the same function, every graph made
during warm-up, none under traffic of any batch size, grad mode or memory format seen at warm-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import Tensor

from idg_core import idg, ig
from idg_core.model_calls import CallStats
from idg_models import ImageClassifier, tune
from idg_models.compiled import FixedBatchCompiled, compiled_part, default_compile_sizes, warm_up_compiled
from tests.models import SmallCNN, small_classifier


class Recorder:
    """A torch.compile backend that runs the captured graph eagerly and records each graph's input shape."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
        images = [t for t in example_inputs if isinstance(t, Tensor) and t.dim() == 4 and t.shape[-1] == 16]  # not the weights
        self.shapes.append(tuple(images[0].shape))
        return gm.forward


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()  # each test starts with no graph compiled


def classifier(backend: Recorder | None = None, sizes: tuple[int, ...] = (2, 4, 8), channels_last: bool = False) -> ImageClassifier:
    model = tune(small_classifier(), channels_last=channels_last)
    if backend is not None:
        model.net = FixedBatchCompiled(model.net, sizes, backend=backend)
    return model


def test_default_sizes_are_the_largest_call_and_its_halves() -> None:
    assert default_compile_sizes(8) == (1, 2, 4, 8)
    assert default_compile_sizes(128) == (8, 16, 32, 64, 128)
    assert default_compile_sizes(1) == (1,)
    assert default_compile_sizes(12) == (1, 3, 6, 12)
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        default_compile_sizes(0)


def test_a_call_runs_at_the_nearest_size_and_big_calls_run_in_pieces() -> None:
    part = FixedBatchCompiled(SmallCNN(0).eval(), (2, 4, 8), backend=Recorder())
    assert [part.size_for(n) for n in (1, 2, 3, 5, 8, 9)] == [2, 2, 4, 8, 8, 8]


@pytest.mark.parametrize("channels_last", [False, True])
def test_warm_up_makes_every_graph_and_traffic_makes_none(channels_last: bool) -> None:
    recorder = Recorder()
    model = classifier(recorder, channels_last=channels_last)
    plain = classifier(channels_last=channels_last)
    seconds = warm_up_compiled(model, 16)
    part = compiled_part(model)
    assert part is not None and part.warm and seconds >= 0
    assert part.graphs == 6 and sorted(set(recorder.shapes)) == [(2, 3, 16, 16), (4, 3, 16, 16), (8, 3, 16, 16)]
    x = torch.rand(11, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    for n in (1, 3, 5, 7, 8, 11):  # every size, forward only and with an input gradient, as the evaluator calls it
        with torch.no_grad():
            torch.testing.assert_close(model(x[:n]), plain(x[:n]))
        a = x[:n].clone().requires_grad_(True)
        b = x[:n].clone().requires_grad_(True)
        (ga,) = torch.autograd.grad(model(a)[:, 1].sum(), a)
        (gb,) = torch.autograd.grad(plain(b)[:, 1].sum(), b)
        torch.testing.assert_close(ga, gb)
    assert part.graphs == 6 and part.late_graphs == 0


def test_attributions_through_the_compiled_model_are_the_plain_ones_with_no_new_graph() -> None:
    model = classifier(Recorder(), sizes=(4, 8))
    warm_up_compiled(model, 16)
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    stats = CallStats()
    got = idg(model, x, "mean", [0, 1], steps=7, probe_steps=5, batch_size=8, stats=stats)
    want = idg(classifier(), x, "mean", [0, 1], steps=7, probe_steps=5, batch_size=8)
    torch.testing.assert_close(got.attributions, want.attributions, rtol=1e-4, atol=1e-6)
    assert any(s not in (4, 8) for s in stats.call_sizes)  # calls of other sizes happened, padded
    part = compiled_part(model)
    assert part is not None and part.late_graphs == 0


def test_a_graph_made_after_warm_up_is_counted() -> None:
    model = classifier(Recorder(), sizes=(4,))
    warm_up_compiled(model, 16)
    part = compiled_part(model)
    assert part is not None
    with torch.no_grad():
        model(torch.rand(3, 3, 16, 16, dtype=torch.float64).float().to(memory_format=torch.channels_last))
    assert part.late_graphs == 1  # a memory format the warm-up did not see: a new graph, and it shows


def test_tune_compiles_at_the_given_sizes() -> None:
    model = tune(small_classifier(), compile=True, compile_sizes=[4, 2])
    part = compiled_part(model)
    assert part is not None and part.sizes == (2, 4)


@pytest.mark.slow
def test_inductor_compiles_once_per_size_and_matches_eager() -> None:
    model = tune(small_classifier(), compile=True, compile_sizes=[2, 4])
    warm_up_compiled(model, 16)
    part = compiled_part(model)
    assert part is not None and part.graphs == 4
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    got = idg(model, x, "mean", [0, 1, 2], steps=6, probe_steps=4, batch_size=4)
    want = idg(classifier(), x, "mean", [0, 1, 2], steps=6, probe_steps=4, batch_size=4)
    torch.testing.assert_close(got.attributions, want.attributions, rtol=1e-3, atol=1e-5)
    assert part.late_graphs == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_inductor_on_cuda_in_bf16_matches_eager_with_no_late_graph() -> None:
    """Inductor in bf16 on CUDA: padding rows never reach real rows (exact), IG's maps match eager's, and
    IDG's do where the target's logit rises along the path by more than bf16's rounding of it.

    The earlier form of this test asked every IDG map for cosine > 0.99 and failed on an H100 (0.9989,
    -0.3982, 1.0000). ``benchmarks/compiled_check.py`` found why (results/benchmarks/compiled-check*.json):
    that image's target logit rises by 0.013 from baseline to image in fp32, below bf16's resolution of
    a logit (0.008 here), so IDG's weights (the logit's slope along the path) are rounding noise: eager
    bf16 against eager fp32 disagrees as much (cosine -0.22 on the CPU), while padding changed no logit
    and IG (no weights) matched with cosine 1.0. So the compiled path is right; a flat logit path is
    not a test of it."""
    model = tune(small_classifier().cuda(), precision="bf16", channels_last=True, compile=True, compile_sizes=[4, 8])
    warm_up_compiled(model, 16)
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(6)).cuda()
    with torch.no_grad():
        together = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(3)])
        beside = model(torch.cat([x, torch.rand(5, 3, 16, 16, device="cuda")]))[:3]
    assert torch.equal(together, alone) and torch.equal(together, beside)  # padding and batch-mates change nothing
    plain = tune(small_classifier().cuda(), precision="bf16", channels_last=True)
    kw: dict[str, Any] = {"steps": 9, "batch_size": 8}
    got_ig, want_ig = ig(model, x, "mean", [0, 1, 2], **kw), ig(plain, x, "mean", [0, 1, 2], **kw)
    cos_ig = torch.nn.functional.cosine_similarity(got_ig.attributions.flatten(1), want_ig.attributions.flatten(1))
    assert bool((cos_ig > 0.99).all()), cos_ig
    got = idg(model, x, "mean", [0, 1, 2], probe_steps=5, **kw)
    want = idg(plain, x, "mean", [0, 1, 2], probe_steps=5, **kw)
    cos = torch.nn.functional.cosine_similarity(got.attributions.flatten(1), want.attributions.flatten(1))
    rise = (want.values[:, -1] - want.values[:, 0]).abs()
    clear = rise > 0.05  # several times bf16's rounding of these logits
    assert bool(clear.any()) and bool((cos[clear] > 0.99).all()), (cos, rise)
    part = compiled_part(model)
    assert part is not None and part.graphs == 4 and part.late_graphs == 0
