"""Speed settings (idg_core.models.tune) keep the function; CUDA runs agree with the CPU."""

from __future__ import annotations

import pytest
import torch

from idg_core import idg, ig
from idg_core.models import ImageClassifier, Preprocessing, set_tf32, tune
from tests.models import SmallCNN

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def classifier(seed: int = 0) -> ImageClassifier:
    return ImageClassifier("small", SmallCNN(seed).eval(), Preprocessing(18, 16), [f"c{i}" for i in range(10)])


def images(n: int = 3) -> torch.Tensor:
    return torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def test_fp32_and_channels_last_compute_the_same_attributions() -> None:
    x = images()
    plain = idg(tune(classifier(), precision="fp32"), x, "mean", [0, 1, 2], steps=20, probe_steps=20)
    cl = idg(tune(classifier(), precision="fp32", channels_last=True), x, "mean", [0, 1, 2], steps=20, probe_steps=20)
    torch.testing.assert_close(cl.attributions, plain.attributions, rtol=1e-4, atol=1e-6)


def test_bf16_keeps_float32_outputs_and_roughly_the_same_map() -> None:
    x = images()
    ref = ig(tune(classifier(), precision="fp32"), x, "mean", [0, 1, 2], steps=16)
    model = tune(classifier(), precision="bf16")
    assert model(x).dtype == torch.float32
    low = ig(model, x, "mean", [0, 1, 2], steps=16)
    assert low.attributions.dtype == torch.float32
    cos = torch.nn.functional.cosine_similarity(low.attributions.flatten(1), ref.attributions.flatten(1))
    assert bool((cos > 0.9).all()), cos


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision must be one of"):
        tune(classifier(), precision="fp8")


@pytest.mark.gpu
@cuda
def test_cuda_attributions_match_the_cpu() -> None:
    x = images()
    cpu = idg(tune(classifier(), precision="fp32"), x, "mean", [0, 1, 2], steps=20, probe_steps=20)
    gpu = idg(tune(classifier().cuda(), precision="fp32"), x.cuda(), "mean", [0, 1, 2], steps=20, probe_steps=20)
    torch.testing.assert_close(gpu.attributions.cpu(), cpu.attributions, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(gpu.alphas.cpu(), cpu.alphas, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_cuda_reduced_precision_stays_close(precision: str) -> None:
    x = images()
    ref = idg(tune(classifier().cuda(), precision="fp32"), x.cuda(), "mean", [0, 1, 2], steps=20, probe_steps=20)
    low = idg(tune(classifier().cuda(), precision=precision, channels_last=True), x.cuda(), "mean", [0, 1, 2], steps=20, probe_steps=20)
    set_tf32(False)  # restore the process-wide TF32 switches
    cos = torch.nn.functional.cosine_similarity(low.attributions.flatten(1), ref.attributions.flatten(1))
    assert bool((cos > 0.9).all()), cos


def test_default_precision_is_bf16_on_cuda_only_where_measured_and_ieee_fp32_elsewhere() -> None:
    from idg_core.models import default_precision

    cuda = torch.device("cuda", 0)  # a device object only: no GPU needed
    assert default_precision(torch.device("cpu")) == "fp32"
    assert default_precision(torch.device("cpu"), "packaged:efficientnet_lite0") == "fp32"
    assert default_precision(cuda, "packaged:efficientnet_lite0") == "bf16"  # measured on 72 photos (FACTS.md)
    for unmeasured in ("timm:vit_base_patch16_224:/w.safetensors", "hf:/models/vit", "torchvision:resnet101:/w.pth", "torchscript:/m.ts"):
        assert default_precision(cuda, unmeasured) == "fp32", unmeasured
    assert default_precision(cuda) == "bf16"  # no source: the caller vouches for its model
