"""torchvision's image classifiers with your weights: which architectures there are, how one is built for a state
dict, and the preprocessing torchvision declares for it.

Every builder that ``torchvision.models.list_models(module=torchvision.models)`` lists is served: ResNet of every
depth, ResNeXt, Wide ResNet, MobileNet V2/V3, EfficientNet V1/V2, RegNet X/Y, ConvNeXt, DenseNet, VGG, AlexNet,
SqueezeNet, ShuffleNet, MNASNet, GoogLeNet, Inception-v3, ViT, Swin V1/V2 and MaxViT (80 in torchvision 0.28). The
net is built with ``weights=None`` (nothing is downloaded) and what the state dict says:

- the class count: the head's rows in the file, unless the models file gives ``num_classes`` or ``labels``;
- a ViT's input size: from its position embedding (torchvision's SWAG weights take 384, 512 or 518 pixels);
- GoogLeNet and Inception-v3 as torchvision builds them for its own weights (``transform_input=True``: the input,
  normalised with ImageNet's mean and std, is mapped to their [-1, 1] inside the net), with the auxiliary heads only
  if the file has them.

Preprocessing comes from the ``transforms`` of one entry of the architecture's weights enum
(``torchvision.models.get_model_weights(arch)``): the entry whose file the weights file is (by name, e.g. torchvision's
``resnet50-0676ba61.pth`` is ``IMAGENET1K_V1``: resize 256), else ``DEFAULT`` (``IMAGENET1K_V2`` for ResNet-50:
resize 232), else, for a net with a fixed input size, the first entry made for that size (ViT-H/14 at 224:
``IMAGENET1K_SWAG_LINEAR_V1``). The models file overrides any of it.
"""

from __future__ import annotations

import difflib
import functools
import logging
import math
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from idg_models._torchvision_compat import import_torchvision

log = logging.getLogger(__name__)

DEFAULT_CLASSES = 1000
AUX_HEADS = {"googlenet": "aux1.", "inception_v3": "AuxLogits."}
"""The architectures built as for torchvision's weights (transform_input), and the prefix of their auxiliary heads' keys."""


@dataclass(frozen=True)
class Declared:
    """The preprocessing of one weights enum entry (``weights``: its name, e.g. ``IMAGENET1K_V2``)."""

    weights: str
    resize_size: int
    crop_size: int
    interpolation: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


@functools.cache
def classification_archs() -> tuple[str, ...]:
    """The names of torchvision's image-classification builders, sorted."""
    tv = import_torchvision()
    return tuple(tv.models.list_models(module=tv.models))


def check_arch(arch: str) -> None:
    """A ``ValueError`` sentence unless ``arch`` is one of :func:`classification_archs`, naming close matches."""
    archs = classification_archs()
    if arch in archs:
        return
    tv = import_torchvision()
    if arch in tv.models.list_models():  # detection, segmentation, video, optical flow, quantized classifiers
        kind = tv.models.get_model_builder(arch).__module__.split(".")[2]
        raise ValueError(f"torchvision's {arch} is not an image classifier (it is in torchvision.models.{kind}); "
                         "only the builders of torchvision.models itself are served")
    close = difflib.get_close_matches(arch.lower(), archs, n=4, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise ValueError(f"torchvision has no image-classification architecture {arch!r}{hint} (all {len(archs)}: "
                     "torchvision.models.list_models(module=torchvision.models))")


def _vit_image_size(state: dict[str, Tensor]) -> int | None:
    """A torchvision ViT's input size from its weights: patches per side × patch size (the class token aside)."""
    pos, proj = state.get("encoder.pos_embedding"), state.get("conv_proj.weight")
    if pos is None or proj is None or pos.dim() != 3 or proj.dim() != 4:
        return None
    side = math.isqrt(pos.shape[1] - 1)
    return side * int(proj.shape[-1]) if side * side == pos.shape[1] - 1 else None


def build_kwargs(arch: str, state: dict[str, Tensor] | None) -> dict[str, Any]:
    """What the builder needs beyond ``num_classes`` for these weights (``None``: random weights)."""
    kwargs: dict[str, Any] = {}
    if arch in AUX_HEADS:
        prefix = AUX_HEADS[arch]
        kwargs.update(transform_input=True, init_weights=False,
                      aux_logits=state is not None and any(k.startswith(prefix) for k in state))
    if arch.startswith("vit_") and state is not None:
        size = _vit_image_size(state)
        if size is not None:
            kwargs["image_size"] = size
    return kwargs


def _head_classes(net: nn.Module, state: dict[str, Tensor], built_with: int) -> int | None:
    """The class count of the file's head, where it differs from the net's (``built_with`` rows): the rows of the
    tensors that have ``built_with`` rows in the net and another count, the rest of their shape the same, in the file."""
    own = net.state_dict()
    rows = {int(state[k].shape[0]) for k, v in own.items()
            if k in state and v.dim() >= 1 and v.shape[0] == built_with and state[k].dim() == v.dim()
            and state[k].shape[0] != built_with and state[k].shape[1:] == v.shape[1:]}
    return rows.pop() if len(rows) == 1 else None


def _mismatch(net: nn.Module, state: dict[str, Tensor]) -> str | None:
    """How ``state`` does not fit ``net`` (missing, unexpected and other-shaped tensors, the first of each), or None."""
    own = net.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shaped = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    if not (missing or unexpected or shaped):
        return None
    parts = []
    if missing:
        parts.append(f"{len(missing)} tensors missing (first: {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (first: {unexpected[0]})")
    if shaped:
        k = shaped[0]
        parts.append(f"{len(shaped)} of another shape (first: {k}, {tuple(state[k].shape)} in the file, "
                     f"{tuple(own[k].shape)} in the architecture)")
    return ", ".join(parts)


def _fitting(arch: str, state: dict[str, Tensor]) -> list[str]:
    """The architectures of ``arch``'s family (same leading letters) that these weights fit, head size aside: built
    on the meta device (no memory, no initialisation); one that cannot be built there is skipped."""
    tv = import_torchvision()
    family = re.match(r"[a-z]+", arch)
    found = []
    for other in classification_archs():
        if other == arch or family is None or not other.startswith(family.group()):
            continue
        try:
            with torch.device("meta"):
                net = tv.models.get_model(other, weights=None, **build_kwargs(other, state))
        except Exception:  # noqa: BLE001 - a builder that computes with tensors (RegNet) cannot run on meta
            continue
        own = net.state_dict()
        if set(own) == set(state) and all(own[k].shape == state[k].shape or (own[k].shape[0] == DEFAULT_CLASSES and
                                                                             own[k].shape[1:] == state[k].shape[1:])
                                          for k in own):
            found.append(other)
    return found


def load_weights(net: nn.Module, state: dict[str, Tensor], arch: str) -> None:
    """``net.load_state_dict(state)``, or a ``ValueError`` sentence saying how the file does not fit ``arch``, and
    which architectures of its family it does fit, if any."""
    wrong = _mismatch(net, state)
    if wrong is not None:
        fits = _fitting(arch, state)
        hint = f"; they fit {' and '.join(fits)}: write torchvision:{fits[0]}:PATH" if fits else \
            f"; is it a state_dict of torchvision's {arch}, saved with torch.save(model.state_dict(), path)?"
        raise ValueError(f"the weights do not match torchvision's {arch}: {wrong}{hint}")
    net.load_state_dict(state, strict=True)


def _declared(entry: Any) -> Declared:
    preset = entry.transforms()  # torchvision's ImageClassification preset
    return Declared(entry.name, int(preset.resize_size[0]), int(preset.crop_size[0]), str(preset.interpolation.value),
                    (float(preset.mean[0]), float(preset.mean[1]), float(preset.mean[2])),
                    (float(preset.std[0]), float(preset.std[1]), float(preset.std[2])))


def declared_preprocessing(arch: str, input_size: int | None = None, file_name: str | None = None) -> Declared:
    """The preprocessing torchvision declares for ``arch`` (see the module's docstring for which entry); with
    ``input_size`` (a net that takes only that size) one made for it, or the DEFAULT's scaled to it."""
    tv = import_torchvision()
    enum = tv.models.get_model_weights(arch)
    entries = list(enum)
    named = [e for e in entries if file_name and e.url.rsplit("/", 1)[-1] == file_name]
    default = enum.DEFAULT
    fitting = [e for e in entries if input_size is None or _declared(e).crop_size == input_size]
    if named and (input_size is None or named[0] in fitting):
        return _declared(named[0])
    if default in fitting:
        return _declared(default)
    if fitting:
        return _declared(fitting[0])
    assert input_size is not None
    d = _declared(default)  # an input size none of torchvision's weights has: the default's, scaled
    return Declared(f"{d.weights} scaled to {input_size}", round(input_size * d.resize_size / d.crop_size), input_size,
                    d.interpolation, d.mean, d.std)


def build(arch: str, state: dict[str, Tensor] | None, num_classes: int | None = None,
          file_name: str | None = None) -> tuple[nn.Module, Declared, int]:
    """torchvision's ``arch`` in eval mode with ``state`` loaded (``None``: random weights), its declared
    preprocessing and its class count: ``num_classes`` (the models file's) or, without it, the head's size in
    ``state`` (else 1000).
    ``file_name``: the weights file's name, which picks the weights enum entry it is, if it is one."""
    check_arch(arch)
    tv = import_torchvision()
    kwargs = build_kwargs(arch, state)
    classes = num_classes or DEFAULT_CLASSES
    if state is not None:
        try:  # the shapes only, first: no memory, no initialisation
            with torch.device("meta"):
                shapes = tv.models.get_model(arch, weights=None, num_classes=classes, **kwargs)
        except Exception:  # noqa: BLE001 - a builder that computes with tensors (RegNet) cannot run on meta
            shapes = tv.models.get_model(arch, weights=None, num_classes=classes, **kwargs)
        head = _head_classes(shapes, state, classes)
        if head is not None and num_classes is not None:
            raise ValueError(f"the weights of torchvision's {arch} have a head of {head} classes but the models file "
                             f"says {num_classes} (num_classes or labels)")
        if head is not None:
            log.info("torchvision %s: %d classes, from the head of its weights", arch, head)
            classes = head
    net = tv.models.get_model(arch, weights=None, num_classes=classes, **kwargs)
    if state is not None:
        load_weights(net, state, arch)
    image_size = getattr(net, "image_size", None)  # ViT: its only input size; the others take any size
    declared = declared_preprocessing(arch, image_size if isinstance(image_size, int) else None, file_name)
    log.info("torchvision %s: preprocessing of its weights %s (resize %d %s, crop %d)", arch, declared.weights,
             declared.resize_size, declared.interpolation, declared.crop_size)
    return net.eval(), declared, classes
