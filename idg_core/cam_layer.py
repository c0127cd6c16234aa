"""Which layer a CAM reads when nothing names one: the last spatial feature map before the pooling. Run the network
with a hook on every module; the module whose call ended last with a ``(batch, channels, h, w)`` output, ``h · w > 1``,
is the CAM layer (a torchvision ResNet's ``layer4``, EfficientNet-Lite's head BN + ReLU6). A network with no such map,
or one whose last map is followed by a token sequence ``(batch, tokens, dim)`` (a vision transformer: its only map is
the patch embedding's) has none: a ``ValueError`` that says so. ``idg_models.cam_layer`` finds it once per served
model and takes a models file's name for it; a plain ``nn.Module`` is read in the call itself
(:func:`idg_core.model_calls.run_feature_call`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn


def spatial(shape: tuple[int, ...]) -> bool:
    """Whether an output of this shape is a feature map: ``(batch, channels, h, w)`` with more than one position."""
    return len(shape) == 4 and shape[2] * shape[3] > 1


class ModuleCalls:
    """The module calls of a forward pass in one thread, in the order they ended: ``(name, module, output shape)`` of
    each tensor output, and the output of the last spatial one (``last_map``; earlier maps are not kept)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, nn.Module, tuple[int, ...]]] = []
        self.last_map: Tensor | None = None

    def cam_layer(self) -> tuple[str, nn.Module]:
        """The name and module of the CAM layer's call (the last spatial map); a ``ValueError`` where there is none."""
        maps = [i for i, (_, _, shape) in enumerate(self.calls) if spatial(shape)]
        if not maps:
            raise ValueError("the model has no spatial feature map that can be read (no module outputs (batch, channels, "
                             "height, width) with more than one position; a TorchScript or torch.export file runs as one "
                             "graph, whose layers cannot be read): Grad-CAM needs one; use an IG-family method")
        name, module, _ = self.calls[maps[-1]]
        tokens = next((c for c in self.calls[maps[-1] + 1:] if len(c[2]) == 3 and c[2][1] > 1), None)
        if tokens is not None:
            raise ValueError(f"the model is a vision transformer (a sequence of {tokens[2][1]} tokens at {tokens[0]} follows its "
                             "last 4-D output): Grad-CAM has no spatial feature layer to read there; use an IG-family method")
        return name, module


@contextmanager
def module_calls(net: nn.Module, itself: bool = False) -> Iterator[ModuleCalls]:
    """Record the module calls of ``net``'s modules (``itself``: of ``net`` alone) made in this thread inside the
    ``with`` block."""
    seen, me = ModuleCalls(), threading.get_ident()

    def hook(name: str) -> Callable[[nn.Module, Any, Any], None]:
        def keep(module: nn.Module, args: Any, out: Any) -> None:
            if threading.get_ident() == me and isinstance(out, Tensor):
                seen.calls.append((name, module, tuple(out.shape)))
                if spatial(tuple(out.shape)):
                    seen.last_map = out
        return keep

    modules = [("", net)] if itself else [(name, m) for name, m in net.named_modules() if name]
    modules = [(name, m) for name, m in modules if not isinstance(m, torch.jit.ScriptModule)]  # those take no hook
    handles = [m.register_forward_hook(hook(name)) for name, m in modules]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
