"""pytorch-grad-cam (PyPI ``grad-cam`` 1.5.7), the peer library of our Grad-CAM and Grad-CAM++: where it lives, how it
is loaded, and which (model, layer) it hooks so that it reads the map ours reads.

It is installed apart (``scripts/setup.sh dev`` puts it in ``.venv/peers/gradcam``) and appended to ``sys.path``, so
.venv's torch and numpy stay first. The benchmarks time it (:func:`benchmarks.speed.run_rows`) and the tests hold our
maps against it (tests/core/test_gradcam.py); both read it from here.

It hooks a module and reads that module's first output in a forward pass; ours reads the CAM layer's last one. They
differ where the CAM layer is a module called more than once: EfficientNet-Lite's shared ReLU6 (``_swish``, called by
the stem first, by the head last) as loaded or with batch norm folded but no convolution fused (on CUDA, or compiled).
There :func:`head_apart` gives the head's ReLU6 a module of its own. Served on the CPU (batch norm folded, convolutions
fused), Lite's CAM layer is the head's fused convolution, called once: the peer hooks it as it is.
"""

from __future__ import annotations

import copy
import importlib
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, fx, nn

from idg_core.cam_layer import module_calls
from idg_models import ImageClassifier

PEER_VERSION = "1.5.7"
PEER_FOLDER = Path(__file__).resolve().parents[1] / ".venv" / "peers" / "gradcam"
"""Where ``scripts/setup.sh dev`` installs pytorch-grad-cam apart (marked installed by ``.installed-grad-cam==1.5.7``)."""
PEER_CLASSES = {"gradcam": "GradCAM", "gradcam_pp": "GradCAMPlusPlus"}
"""Our method -> its pytorch-grad-cam class."""


def load_peer(folder: Path = PEER_FOLDER) -> types.ModuleType | None:
    """The ``pytorch_grad_cam`` module from ``folder`` (appended to ``sys.path``), or None where it is not installed
    there."""
    if not (folder / f".installed-grad-cam=={PEER_VERSION}").is_file():
        return None
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    return importlib.import_module("pytorch_grad_cam")


def _is_lite(net: nn.Module) -> bool:
    """Whether ``net`` is an EfficientNet-Lite network (as loaded, or as a ``torch.fx`` graph of it)."""
    return isinstance(getattr(net, "_swish", None), nn.Module) and hasattr(net, "_conv_head")


def head_apart(model: ImageClassifier) -> ImageClassifier:
    """A copy of an EfficientNet-Lite whose head's ReLU6 is a module of its own (``net._head_act``): the same function,
    but a layer pytorch-grad-cam can hook (its shared ``_swish`` is called by the stem first, which the peer would read).
    Takes Lite as loaded (its ``extract_features`` rewritten) or as a ``torch.fx`` graph (batch norm folded: the graph's
    last call of ``_swish`` calls ``_head_act`` instead)."""
    if not _is_lite(model.net):
        raise ValueError(f"head_apart takes an EfficientNet-Lite; {model.name}'s network is a {type(model.net).__name__}")
    peer = copy.deepcopy(model)
    net = peer.net
    if isinstance(net, fx.GraphModule):
        calls = [node for node in net.graph.nodes if node.op == "call_module" and node.target == "_swish"]
        net.add_submodule("_head_act", nn.ReLU6())
        calls[-1].target = "_head_act"
        net.recompile()
        return peer

    def extract_features(self: Any, inputs: Tensor) -> Tensor:
        x = self._swish(self._bn0(self._conv_stem(inputs)))
        for idx, block in enumerate(self._blocks):
            rate = self._global_params.drop_connect_rate
            x = block(x, drop_connect_rate=rate * float(idx) / len(self._blocks) if rate else rate)
        out: Tensor = self._head_act(self._bn1(self._conv_head(x)))
        return out

    net._head_act = nn.ReLU6()
    setattr(net, "extract_features", types.MethodType(extract_features, net))  # noqa: B010 - an instance's own method
    return peer


class _Forward(nn.Module):
    """``model`` run as ``forward`` runs it (a compiled network's CAM runs uncompiled: the peer's hook must see the
    layer called); its parameters are ``model``'s (the peer reads its device from them)."""

    def __init__(self, forward: Callable[[Tensor], Tensor], model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.run = forward

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)


def peer_target(model: ImageClassifier) -> tuple[nn.Module, nn.Module]:
    """The (model, layer) pytorch-grad-cam should hook to read the map ours reads: ``model`` and the layer
    ``model.cam_target()`` names where that layer runs once in a forward pass; for an EfficientNet-Lite whose CAM layer
    is its shared ReLU6, :func:`head_apart`'s copy and its ``_head_act``. A ``ValueError`` where the model has no CAM
    layer, or its CAM layer runs more than once in another network (the peer would read its first call)."""
    forward, layer = model.cam_target()
    size = model.preprocessing.crop_size
    with torch.no_grad(), module_calls(layer, itself=True) as seen:
        forward(torch.rand(1, 3, size, size, device=model.mean.device))
    if len(seen.calls) == 1:
        return (model if forward is model else _Forward(forward, model)), layer
    if forward is model and _is_lite(model.net) and layer is model.net.get_submodule("_swish"):
        apart = head_apart(model)
        return apart, apart.net.get_submodule("_head_act")
    raise ValueError(f"the CAM layer ({type(layer).__name__}) runs {len(seen.calls)} times in a forward pass: pytorch-grad-cam "
                     "would read its first output, ours reads its last")


@contextmanager
def peer_cam(peer: types.ModuleType, method: str, model: nn.Module, layer: nn.Module) -> Iterator[Callable[[Tensor, list[int]], Any]]:
    """pytorch-grad-cam's counterpart of our ``method`` (``gradcam``, ``gradcam_pp``) hooked on ``layer`` of ``model``
    (:func:`peer_target`), as a function of (images, targets) giving its maps (numpy, ``(batch, height, width)``, each
    scaled to [0, 1]); its hooks are removed on leaving."""
    targets = importlib.import_module("pytorch_grad_cam.utils.model_targets")
    with getattr(peer, PEER_CLASSES[method])(model=model, target_layers=[layer]) as cam:
        def run(x: Tensor, t: list[int]) -> Any:
            return cam(input_tensor=x, targets=[targets.ClassifierOutputTarget(i) for i in t])

        yield run
