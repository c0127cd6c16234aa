"""Convolution + activation fused into one oneDNN call (idg_models.fuse): the same function and
input gradient, only where the pre-activation has no other use, and the plain path wherever the fused
call does not apply."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from idg_core import idg
from idg_models import fold_batchnorm, load_model, tune
from idg_models.fuse import FusedConvActivation, fuse_conv_activations, fusion_available
from idg_models.zoo import ImageClassifier, Preprocessing
from tests.models import assert_same_function

pytestmark = pytest.mark.skipif(not fusion_available(), reason="needs PyTorch's oneDNN (x86 CPU builds)")


class Net(nn.Module):
    """conv->ReLU6 (fusable), conv->ReLU (fusable), conv->BN->ReLU6 (fusable once folded), a conv whose output
    also feeds a residual (not), an in-place ReLU (fusable: nothing else reads the conv's output), a
    convolution called twice (not)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.act_a = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU6()
        self.b, self.act_b = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), nn.ReLU()
        self.c, self.bn_c, self.act_c = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6()
        self.d, self.act_d = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU6()
        self.e, self.act_e = nn.Conv2d(8, 8, 1), nn.ReLU(inplace=True)
        self.shared, self.act_s = nn.Conv2d(8, 8, 1), nn.ReLU()
        self.head = nn.Linear(8, 5)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            self.bn_c.running_mean.uniform_(-0.5, 0.5, generator=g)
            self.bn_c.running_var.uniform_(0.5, 2.0, generator=g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act_a(self.a(x)) * 4  # scaled so that some values pass 6 and ReLU6's upper bound matters
        x = self.act_b(self.b(x))
        x = self.act_c(self.bn_c(self.c(x)))
        y = self.d(x)
        x = self.act_d(y) + y
        x = self.act_e(self.e(x))
        x = self.act_s(self.shared(self.shared(x)))
        return self.head(x.mean((2, 3)))


def classifier() -> ImageClassifier:
    return ImageClassifier("net", Net(), Preprocessing(16, 16), [f"c{i}" for i in range(5)]).eval()


@pytest.mark.parametrize("channels_last", [True, False])
def test_fused_network_gives_the_same_logits_and_input_gradients(channels_last: bool) -> None:
    x = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    plain, fused = classifier(), tune(classifier(), precision="fp32", channels_last=channels_last, fold_bn=True)
    kinds = [type(m).__name__ for m in fused.net.modules() if isinstance(m, (nn.Conv2d, FusedConvActivation))]
    assert kinds.count("FusedConvActivation") == 4, kinds  # a, b, c (after folding its batch norm), e; not d, shared
    assert_same_function(plain, fused, x)


def test_the_fused_module_runs_plainly_where_onednn_does_not_apply() -> None:
    conv = nn.Conv2d(3, 4, 3, padding=1)
    module = FusedConvActivation(conv, nn.ReLU6())
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2)) * 8
    expected = torch.clamp(conv(x), 0, 6).detach()
    torch.testing.assert_close(module(x), expected)
    torch.testing.assert_close(module.double()(x.double()), expected.double(), rtol=1e-5, atol=1e-5)  # float64: plain path
    assert not any(True for _ in module.parameters())  # the weights are buffers: no gradient is ever made for them


def test_packaged_lite0_fuses_every_activation_and_explains_the_same() -> None:
    x = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(5))
    fused = tune(load_model("efficientnet_lite0").eval(), precision="fp32", channels_last=True, fold_bn=True)
    folded = load_model("efficientnet_lite0").eval()  # folded the same way, without the fusion tune() adds on the CPU
    folded.net = fold_batchnorm(folded.net).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    assert sum(isinstance(m, FusedConvActivation) for m in fused.net.modules()) == 33  # stem, 16 depthwise, 15 expansions, head
    assert not any(isinstance(m, nn.ReLU6) for m in fused.net.modules())
    with torch.no_grad():
        torch.testing.assert_close(fused(x), folded(x), rtol=1e-5, atol=1e-5)
    a, b = idg(fused, x, "mean", [1, 2], steps=6, probe_steps=4), idg(folded, x, "mean", [1, 2], steps=6, probe_steps=4)
    torch.testing.assert_close(a.attributions, b.attributions, rtol=1e-4, atol=1e-7)


def test_the_benchmarks_flop_counter_counts_fused_convolutions() -> None:
    from benchmarks.speed import forward_flops

    cpu = torch.device("cpu")
    fused = tune(classifier(), precision="fp32", channels_last=True, fold_bn=True)
    assert any(isinstance(m, FusedConvActivation) for m in fused.net.modules())
    assert forward_flops(fused, 16, cpu) == forward_flops(classifier(), 16, cpu) > 0


def test_a_network_without_batch_norm_is_fused_too_and_an_untraceable_one_is_left_alone() -> None:
    from tests.models import small_classifier

    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    plain, tuned = small_classifier(), tune(small_classifier(), precision="fp32", fold_bn=True)
    assert sum(isinstance(m, FusedConvActivation) for m in tuned.net.modules()) == 1  # conv -> ReLU; conv -> Softplus stays
    torch.testing.assert_close(tuned(x), plain(x), rtol=1e-5, atol=1e-6)
    scripted = torch.jit.script(small_classifier().net)
    assert fuse_conv_activations(scripted) == (scripted, 0)
