"""The CAM layer of a served classifier (Grad-CAM, Grad-CAM++: :mod:`idg_core.methods.gradcam`): the module a models
file names (``cam_layer``), or the last spatial feature map before its pooling (:mod:`idg_core.cam_layer`'s rule: the
head's BN + ReLU6 of EfficientNet-Lite, ``layer4`` of a torchvision ResNet, ``features`` of the other torchvision CNNs,
the last stage of timm's and Hugging Face's CNNs; none for a vision transformer, a ``ValueError``: the service's 422).

Found on the network as it is served, by one forward pass of a random image at the model's input size (a simulated
device's own network: the pass takes no device time), once, and again if the network is replaced: batch-norm folding
and fusion keep that map (a fused convolution outputs what its activation did), though a named BN layer is folded
away. A compiled network runs uncompiled for a CAM (its graphs would not call the hook).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from idg_core.cam_layer import module_calls, spatial
from idg_models.compiled import FixedBatchCompiled


class Served(Protocol):
    """What this module reads of an :class:`idg_models.ImageClassifier` (named here by its parts: the zoo imports
    this module)."""

    net: nn.Module
    cam_layer: str | None
    preprocessing: Any
    mean: Tensor

    def __call__(self, x: Tensor) -> Tensor: ...

    def forward_with(self, net: nn.Module, x: Tensor) -> Tensor: ...


Target = tuple[Callable[[Tensor], Tensor], nn.Module]
_lock = threading.Lock()
_found: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
"""Each model's (network, forward, layer) or (network, error), as :func:`cam_target` last found them."""


def cam_target(model: Served) -> Target:
    """What a CAM call of ``model`` runs and the module it reads (:func:`idg_core.model_calls.run_feature_call`), for the
    network as it is now; a ``ValueError`` that says why where it has none (cached like the layer)."""
    net = model.net
    with _lock:
        cached = _found.get(model)
        if cached is None or cached[0] is not net:
            try:
                cached = (net, *_find(model))
            except ValueError as err:
                cached = (net, err)
            _found[model] = cached
    if isinstance(cached[1], ValueError):
        raise ValueError(str(cached[1]))
    return cached[1], cached[2]


def _find(model: Served) -> Target:
    part = model.net if isinstance(model.net, FixedBatchCompiled) else None
    eager = part.net if part is not None else model.net
    forward: Callable[[Tensor], Tensor] = model if part is None else (lambda x: model.forward_with(eager, x))
    # the probe runs a simulated device's own network (idg_serving.simulated): it is no served call, and booked on the
    # device's timeline outside the worker it held the first request's call behind it
    bare = getattr(eager, "probe_net", eager)
    size = model.preprocessing.crop_size
    probe = torch.rand(1, 3, size, size, device=model.mean.device)
    if not model.cam_layer:
        with torch.no_grad(), module_calls(bare) as seen:
            model.forward_with(bare, probe)
        return forward, seen.cam_layer()[1]
    name = model.cam_layer
    inner = getattr(bare, "inner", None)  # a transformers or scripted net's wrapper (idg_models.sources)
    root = inner if isinstance(inner, nn.Module) else bare
    try:
        layer = root.get_submodule(name)
    except AttributeError as err:
        raise ValueError(f"the models file's cam_layer {name!r} is not a module of the served network (batch-norm folding "
                         "removes BN layers into their convolutions: name a block or an activation, or set fold_bn = "
                         "false)") from err
    with torch.no_grad(), module_calls(layer, itself=True) as seen:
        model.forward_with(bare, probe)
    shapes = [shape for _, _, shape in seen.calls]
    if not any(spatial(s) for s in shapes):
        raise ValueError(f"the models file's cam_layer {name!r} gives no (batch, channels, height, width) map in the served "
                         f"network (its outputs: {shapes or 'none: it does not run there'})")
    return forward, layer
