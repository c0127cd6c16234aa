"""Convolution + bias (+ residual) + ReLU as one cuDNN kernel (idg_models.fuse.fuse_conv_add_relu): which patterns
are fused (only where nothing else reads the convolution's output or the sum), and the same function and input
gradient as the unfused network. On the CPU the fused modules run PyTorch's own operations through the written-out
backward, so these tests check the graph rewrite and the gradient formula; the GPU test checks cuDNN's kernel."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
from torch import fx, nn

from idg_core import idg
from idg_models import fold_batchnorm
from idg_models.fuse import FusedConvAddReLU, fuse_conv_add_relu
from idg_models.zoo import ImageClassifier, Preprocessing
from tests.models import assert_same_function


class Net(nn.Module):
    """The stem conv->BN->ReLU (fused once folded); a bottleneck whose last conv->BN, plus a shortcut computed after
    it (as torchvision's downsample is), goes through an in-place ReLU (fused, the shortcut its residual); the sum in the
    other order through ``torch.relu`` (fused); a conv->ReLU6 (not: cuDNN fuses ReLU only); a conv whose output also
    feeds another layer (not); a sum used twice (not); a convolution called twice (not)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn0, self.relu = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True)
        self.c1, self.bn1 = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.c2, self.bn2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16)
        self.down = nn.Conv2d(8, 16, 1, stride=2)
        self.c3 = nn.Conv2d(16, 16, 3, padding=1)
        self.c4, self.act6 = nn.Conv2d(16, 16, 1), nn.ReLU6()
        self.c5 = nn.Conv2d(16, 16, 1)
        self.c6 = nn.Conv2d(16, 16, 1)
        self.shared = nn.Conv2d(16, 16, 1)
        self.head = nn.Linear(16, 5)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.4)
            for bn in (self.bn0, self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5, generator=g)
                bn.running_var.uniform_(0.5, 2.0, generator=g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn0(self.stem(x)))
        y = self.relu(self.bn1(self.c1(x)))
        y = self.bn2(self.c2(y))
        x = self.relu(y + self.down(x))  # the shortcut after the convolution in the graph's order
        x = torch.relu(x + self.c3(x))  # the convolution second in the sum
        x = self.act6(self.c4(x))
        z = self.c5(x)
        x = torch.relu(z) + z  # the convolution's output read twice
        s = x + self.c6(x)
        x = torch.relu(s) * s  # the sum read twice
        x = torch.relu(self.shared(self.shared(x)))
        return self.head(x.mean((2, 3)))


def _fused_names(net: nn.Module) -> list[str]:
    return sorted(name for name, m in net.named_modules() if isinstance(m, FusedConvAddReLU))


@pytest.mark.parametrize("channels_last", [False, True])
def test_fused_network_gives_the_same_logits_and_input_gradients(channels_last: bool) -> None:
    plain = fold_batchnorm(Net().eval())
    fused, count = fuse_conv_add_relu(copy.deepcopy(plain))
    assert count == 4 and _fused_names(fused) == ["c1", "c2", "c3", "stem"]
    assert isinstance(fused, fx.GraphModule)
    adds = [n for n in fused.graph.nodes if n.op == "call_function" and n.target in (operator.add, torch.add)]
    assert len(adds) == 2  # z + relu(z) and x + c6(x): the two sums the ReLU does not alone read stay
    if channels_last:
        plain, fused = plain.to(memory_format=torch.channels_last), fused.to(memory_format=torch.channels_last)
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    assert_same_function(plain, fused, x)


def test_the_written_out_backward_gives_the_residuals_gradient_and_only_where_relu_passes() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1)
    module = FusedConvAddReLU(conv)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    z = torch.randn(2, 6, 8, 8, requires_grad=True)
    w = torch.randn(2, 6, 8, 8)
    got = torch.autograd.grad((module(x, z) * w).sum(), (x, z))
    want = torch.autograd.grad((torch.relu(conv(x) + z) * w).sum(), (x, z))
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert (got[1] == 0).any() and (got[1] != 0).any()  # masked where the sum was negative


def test_the_weights_become_buffers_in_the_dtype_asked_and_get_no_gradient() -> None:
    fused, _ = fuse_conv_add_relu(fold_batchnorm(Net().eval()), torch.bfloat16)
    stem = fused.get_submodule("stem")
    assert isinstance(stem, FusedConvAddReLU)
    assert stem.weight.dtype == torch.bfloat16 and stem.bias is not None and stem.bias.dtype == torch.bfloat16
    assert "weight" not in dict(stem.named_parameters()) and not stem.weight.requires_grad
    out = stem(torch.rand(1, 3, 8, 8))  # an fp32 input is cast to the weights' dtype; so is the output
    assert out.dtype == torch.bfloat16


def test_torchvision_resnets_fuse_every_convolution_but_the_downsampling_ones_and_explain_the_same() -> None:
    from idg_models._torchvision_compat import import_torchvision

    torch.manual_seed(0)
    net = import_torchvision().models.resnet18().eval()
    plain = fold_batchnorm(net)
    fused, count = fuse_conv_add_relu(copy.deepcopy(plain))
    assert count == 17  # the stem and both convolutions of each of the 8 basic blocks; 3 downsampling ones stay
    labels = [f"c{i}" for i in range(1000)]
    a = ImageClassifier("a", plain, Preprocessing(32, 32), labels).eval()
    b = ImageClassifier("b", fused, Preprocessing(32, 32), labels).eval()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    want = idg(a, x, "mean", [1, 2], steps=6, probe_steps=6).attributions
    got = idg(b, x, "mean", [1, 2], steps=6, probe_steps=6).attributions
    assert want.abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_an_untraceable_network_is_left_as_it_was() -> None:
    scripted = torch.jit.script(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval())
    assert fuse_conv_add_relu(scripted) == (scripted, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cudnns_fused_kernel_gives_the_unfused_logits_and_input_gradients(dtype: torch.dtype) -> None:
    """On CUDA the fused module runs ``torch.cudnn_convolution_(add_)relu``: the same function within the dtype's
    rounding (cuDNN adds the bias and residual before rounding once; PyTorch rounds after each step)."""
    torch.backends.cudnn.allow_tf32 = False
    plain = fold_batchnorm(Net().eval()).cuda().to(memory_format=torch.channels_last)
    fused, count = fuse_conv_add_relu(copy.deepcopy(plain), dtype)
    assert count == 4
    x = torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(1)).cuda()
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out_plain, out_fused = plain(xa), fused(xb)
        grad_plain = torch.autograd.grad(out_plain[:, 2].float().sum(), xa)[0]
        grad_fused = torch.autograd.grad(out_fused[:, 2].float().sum(), xb)[0]
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 0.05, "atol": 0.05}
    torch.testing.assert_close(out_fused.float(), out_plain.float(), **tol)
    cosine = torch.nn.functional.cosine_similarity(grad_fused.flatten(1), grad_plain.flatten(1))
    assert float(cosine.min()) > (0.9999 if dtype == torch.float32 else 0.98), cosine
