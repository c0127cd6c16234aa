"""Save tiny random-initialised classifiers as a user would, one per model source (for tests and the
smoke test; nothing is downloaded). Usage: python scripts/make_tiny_models.py OUT_DIR [kind ...]

kinds: timm (a timm ``test_vit``, 37 classes, safetensors), hf_vit (transformers ViT, 10 labels,
64-pixel input), hf_convnext (transformers ConvNeXt, 5 labels), torchscript and export (a small CNN,
10 classes, with a models file ``models.toml`` and ``labels.txt``). Each kind's IDG_MODELS entry is
printed, one per line, as ``kind<TAB>NAME=SOURCE``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

log = logging.getLogger("make_tiny_models")
INPUT = 48
MODELS_TOML = """\
[models.scripted]
input_size = 48
mean = [0.5, 0.5, 0.5]
std = [0.25, 0.25, 0.25]
labels = "labels.txt"

[models.exported]
input_size = 48
resize_size = 56
interpolation = "bicubic"
mean = [0.5, 0.5, 0.5]
std = [0.25, 0.25, 0.25]
num_classes = 10
labels = "labels.txt"
max_batch = 4
"""
LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class SmallCNN(nn.Module):
    """``(B, 3, H, W)`` normalised images -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x).flatten(1))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN().eval()


def _common(out: Path) -> None:
    (out / "labels.txt").write_text("\n".join(LABELS) + "\n")
    (out / "models.toml").write_text(MODELS_TOML)


def make_torchscript(out: Path) -> str:
    _common(out)
    torch.jit.save(torch.jit.script(_cnn()), out / "cnn.ts")
    return f"scripted=torchscript:{out / 'cnn.ts'}"


def make_export(out: Path) -> str:
    _common(out)
    program = torch.export.export(_cnn(), (torch.rand(2, 3, INPUT, INPUT),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, out / "cnn.pt2")
    return f"exported=export:{out / 'cnn.pt2'}"


def make_timm(out: Path) -> str:
    from safetensors.torch import save_file

    from idg_models._torchvision_compat import import_torchvision

    import_torchvision()
    import timm

    torch.manual_seed(0)
    net = timm.create_model("test_vit", pretrained=False, num_classes=37)
    save_file(net.state_dict(), str(out / "test_vit.safetensors"))
    return f"vit=timm:test_vit:{out / 'test_vit.safetensors'}"


def make_hf_vit(out: Path) -> str:
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    labels = dict(enumerate(LABELS))
    config = ViTConfig(image_size=64, patch_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, num_labels=10, id2label=labels, label2id={v: k for k, v in labels.items()})
    folder = out / "hf-vit"
    ViTForImageClassification(config).eval().save_pretrained(folder)
    ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(folder)
    return f"hfvit=hf:{folder}"


def make_hf_convnext(out: Path) -> str:
    from transformers import ConvNextConfig, ConvNextForImageClassification, ConvNextImageProcessor

    torch.manual_seed(0)
    labels = {i: f"breed {i}" for i in range(5)}
    config = ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], image_size=64, num_labels=5, id2label=labels,
                            label2id={v: k for k, v in labels.items()})
    folder = out / "hf-convnext"
    ConvNextForImageClassification(config).eval().save_pretrained(folder)
    ConvNextImageProcessor(size={"shortest_edge": 64}, crop_pct=0.875).save_pretrained(folder)
    return f"hfconvnext=hf:{folder}"


MAKERS: dict[str, Callable[[Path], str]] = {
    "timm": make_timm, "hf_vit": make_hf_vit, "hf_convnext": make_hf_convnext, "torchscript": make_torchscript, "export": make_export,
}


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    if not argv:
        log.error("usage: make_tiny_models.py OUT_DIR [%s ...]", " | ".join(MAKERS))
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for kind in argv[1:] or list(MAKERS):
        sys.stdout.write(f"{kind}\t{MAKERS[kind](out)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
