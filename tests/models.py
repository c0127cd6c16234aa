"""Tiny models with answers that can be computed by hand, and the service tests' tiny classifier.

Building one never touches the global random state: seeded models draw their weights inside
:func:`seeded`, so a test's own ``torch.rand`` does not depend on which models it built."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor, nn

from idg_models import ImageClassifier, Preprocessing, imagenet_class_names


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Inside: the CPU generator seeded with ``seed`` (layers' default initialisation draws from it).
    After: the caller's random state exactly as it was before."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        yield


class Linear(nn.Module):
    """logits[:, c] = Σ w_c ⊙ x + b_c: every path method's attribution is w ⊙ (x - x')."""

    def __init__(self, shape: tuple[int, int, int] = (3, 8, 8), classes: int = 4, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(classes, *shape, generator=g))
        self.b = nn.Parameter(torch.randn(classes, generator=g))

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("bchw,kchw->bk", x, self.w) + self.b


class SaturatingSum(nn.Module):
    """The IG paper's ``1 - ReLU(1 - s)`` on s = 2·mean(x); class 1 is its negative."""

    def forward(self, x: Tensor) -> Tensor:
        s = 2 * x.mean(dim=(1, 2, 3))
        f = 1 - torch.relu(1 - s)
        return torch.stack([f, -f], dim=1)


class TwoRises(nn.Module):
    """With the black baseline and x = ones, s = mean(x(α)) = α and the class-0 logit rises only on
    α ∈ [0.1, 0.2] and [0.6, 0.8] (two steep sigmoids); class 1 is constant."""

    def forward(self, x: Tensor) -> Tensor:
        s = x.mean(dim=(1, 2, 3))
        f = torch.sigmoid(80 * (s - 0.15)) + torch.sigmoid(40 * (s - 0.7))
        return torch.stack([f, torch.zeros_like(f)], dim=1)


class SmallCNN(nn.Module):
    """A seeded random CNN, 3x16x16 -> 10 classes."""

    def __init__(self, seed: int = 0, classes: int = 10) -> None:
        super().__init__()
        with seeded(seed):
            self.body = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, stride=2), nn.Softplus(),
                nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, classes),
            )

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x) * 4


def small_classifier(seed: int = 0) -> ImageClassifier:
    """:class:`SmallCNN` behind 18 -> 16 preprocessing, classes c0..c9: the speed settings' tests' model."""
    return ImageClassifier("small", SmallCNN(seed).eval(), Preprocessing(18, 16), [f"c{i}" for i in range(10)])


class Counting(nn.Module):
    """Wraps a model and records the number of images in every call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.calls: list[int] = []

    def forward(self, x: Tensor) -> Tensor:
        self.calls.append(int(x.shape[0]))
        return self.model(x)


class TinyNet(nn.Module):
    """3x32x32 -> 1000 logits; counts calls and images; can be slowed or poisoned."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        with seeded(0):
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4 * 4 * 4, 1000)
        self.delay_s = delay_s
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def forward(self, x: Tensor) -> Tensor:
        with self.lock:
            self.calls.append(int(x.shape[0]))
        if self.delay_s:
            time.sleep(self.delay_s)
        # poison: a pure magenta image (normalisation is inside the classifier, so test raw stats)
        if bool(((x[:, 1].amax(dim=(1, 2)) < -2.0) & (x[:, 0].amin(dim=(1, 2)) > 2.0)).any()):
            raise RuntimeError("poisoned input")
        h = torch.nn.functional.adaptive_avg_pool2d(torch.tanh(self.conv(x)), 4)
        return self.fc(h.flatten(1)) * 3


def tiny_classifier(delay_s: float = 0.0) -> ImageClassifier:
    """The service tests' model "tiny": :class:`TinyNet` behind 36 -> 32 preprocessing, ImageNet's names."""
    return ImageClassifier("tiny", TinyNet(delay_s), Preprocessing(36, 32), imagenet_class_names())


class Steerable(nn.Module):
    """Normalised 3xHxW images (grey 128/255 is 0) -> 10 logits: ``scale`` times the mean of the red, green and blue
    channels for classes 0, 1 and 2, 0 for the other seven. What it predicts, how sure it is and where its explanation
    lies follow the image: a red patch on grey is class 0 at about 0.94, the map on the patch alone; a grey checkerboard
    with a faint green tint is class 1 at about 0.5, the map spread evenly over every pixel (the drift alerts' faults)."""

    def __init__(self, scale: float = 50.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, z: Tensor) -> Tensor:
        rgb = z.mean(dim=(2, 3)) * self.scale
        return torch.cat([rgb, rgb.new_zeros(z.shape[0], 7)], dim=1)


def steerable_classifier(name: str = "steer") -> ImageClassifier:
    """:class:`Steerable` behind 36 -> 32 preprocessing (mean 128/255, std 0.25: a grey pixel is 0), classes red, green,
    blue and c3..c9."""
    model = ImageClassifier(name, Steerable().eval(), Preprocessing(36, 32, mean=(128 / 255,) * 3, std=(0.25,) * 3),
                            ["red", "green", "blue", *(f"c{i}" for i in range(3, 10))])
    model.source = "test:steerable"
    return model


def tiny_model_maker() -> ModuleType:
    """``scripts/make_tiny_models.py`` as a module: saves tiny models of each source as a user would."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_models.py"
    spec = importlib.util.spec_from_file_location("make_tiny_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_tiny_models"] = module
    spec.loader.exec_module(module)
    return module


class Bf16Trap(nn.Module):
    """3x32x32 normalised images -> 2 logits ``(s, -s)``, ``s = Σ w ⊙ z`` over the left half of the
    image only (elementwise products and sums: bf16 autocast leaves them in float32, so in bf16 the
    model computes exactly what it computes in fp32). ``wrong``: under bf16 autocast (seen from the
    dtype of a matrix product, which autocast lowers) the logits keep their value but their gradient
    is that of ``Σ w' ⊙ z`` over the right half: IDG's map then ranks pixels that change nothing
    first, and insertion and deletion get worse on every photo. Scriptable (a user's TorchScript file)."""

    def __init__(self, wrong: bool = False, size: int = 32, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        left = torch.zeros(1, 3, size, size)
        left[..., : size // 2] = 1.0
        self.w = nn.Parameter(torch.randn(1, 3, size, size, generator=g) * left * 0.08)
        self.decoy = nn.Parameter(torch.randn(1, 3, size, size, generator=g) * (1 - left) * 0.08)
        self.wrong = wrong

    def forward(self, z: Tensor) -> Tensor:
        s = (z * self.w).sum(dim=(1, 2, 3))
        in_bf16 = torch.mm(z.new_ones((1, 1)), z.new_ones((1, 1))).dtype == torch.bfloat16
        if self.wrong and in_bf16:
            d = (z * self.decoy).sum(dim=(1, 2, 3))
            s = s.detach() + (d - d.detach())
        return torch.stack([s, -s], dim=1)


def bf16_trap_classifier(wrong: bool, name: str = "trap") -> ImageClassifier:
    """:class:`Bf16Trap` behind 36 -> 32 preprocessing (grey mean), classes "left" and "not left"."""
    model = ImageClassifier(name, Bf16Trap(wrong).eval(), Preprocessing(36, 32, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)),
                            ["left", "not left"])
    model.source = f"test:bf16-trap:{'wrong' if wrong else 'same'}"
    return model


def write_photos(folder: Path, n: int, size: tuple[int, int] = (44, 40)) -> Path:
    """``n`` seeded, textured RGB photos (PNG) in ``folder``: smooth colour ramps under pixel noise."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    h, w = size[1], size[0]
    ramp = torch.linspace(0, 1, w).view(1, 1, w).expand(3, h, w)
    for i in range(n):
        tint = torch.rand(3, 1, 1, generator=g)
        pixels = (0.6 * ramp * tint + 0.4 * torch.rand(3, h, w, generator=g)).clamp(0, 1)
        Image.fromarray((pixels.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()).save(folder / f"photo{i:02d}.png")
    return folder


def assert_same_function(plain: nn.Module, rewritten: nn.Module, x: Tensor) -> None:
    """``rewritten`` (a network with fused layers, say) gives ``plain``'s logits and input gradients on ``x``, with
    autograd and without, to float32 rounding; the gradient is not all zero (so the comparison says something)."""
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out_plain, out_fused = plain(xa), rewritten(xb)
    torch.testing.assert_close(out_fused, out_plain, rtol=1e-5, atol=1e-5)
    grad_plain = torch.autograd.grad(out_plain[:, 2].sum(), xa)[0]
    grad_fused = torch.autograd.grad(out_fused[:, 2].sum(), xb)[0]
    assert grad_plain.abs().sum() > 0
    torch.testing.assert_close(grad_fused, grad_plain, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(rewritten(x), out_plain.detach(), rtol=1e-5, atol=1e-5)
