"""Convolution + activation in one oneDNN call on the CPU (:func:`fuse_conv_activations`).

Each ReLU6 (or ReLU) after a convolution otherwise reads and writes the whole activation once more in
the forward pass: EfficientNet-Lite0 has 33 of them. oneDNN applies the clamp while the convolution's
output is still in cache. The backward pass is PyTorch's own: the activation's mask taken from the
fused output (``0 < y < 6`` holds exactly where ``0 < x < 6``), then the convolution's input gradient.
Logits and attributions are bit-identical to the unfused model's (the speed-up: docs/results/speed.md).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

log = logging.getLogger(__name__)

_ACTIVATIONS: dict[type[nn.Module], tuple[str, float, float]] = {nn.ReLU6: ("hardtanh", 0.0, 6.0), nn.ReLU: ("relu", 0.0, 0.0)}


def fusion_available() -> bool:
    """Whether this PyTorch has oneDNN's fused convolution (x86 CPU builds do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def _fused(x: Tensor, weight: Tensor, bias: Tensor | None, conf: tuple[list[int], list[int], list[int], int], attr: str,
           low: float, high: float) -> Tensor:
    padding, stride, dilation, groups = conf
    scalars = [low, high] if attr == "hardtanh" else []
    out: Tensor = torch.ops.mkldnn._convolution_pointwise(x, weight, bias, padding, stride, dilation, groups, attr, scalars, "")
    return out


class _ConvActivation(torch.autograd.Function):
    """The fused forward; backward to the input only (the weights are constants of an inference graph)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, conf: tuple[list[int], list[int], list[int], int],
                attr: str, low: float, high: float) -> Tensor:
        y = _fused(x, weight, bias, conf, attr, low, high)
        ctx.save_for_backward(x, weight, y)
        ctx.conf, ctx.attr, ctx.low, ctx.high = conf, attr, low, high
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, y = ctx.saved_tensors
        padding, stride, dilation, groups = ctx.conf
        if ctx.attr == "hardtanh":
            grad = torch.ops.aten.hardtanh_backward(grad_y, y, ctx.low, ctx.high)
        else:
            grad = torch.ops.aten.threshold_backward(grad_y, y, 0)
        grad_x = torch.ops.aten.convolution_backward(grad, x, weight, None, stride, padding, dilation, False, [0, 0], groups,
                                                     [True, False, False])[0]
        return grad_x, None, None, None, None, None, None


class FusedConvActivation(nn.Module):
    """``act(conv(x))`` as one oneDNN call for float32 CPU tensors outside autocast; anything else (CUDA,
    bf16 autocast, another dtype) runs the plain convolution and activation. The weights become buffers:
    part of an inference graph, they never get gradients."""

    weight: Tensor
    bias: Tensor | None

    def __init__(self, conv: nn.Conv2d, activation: nn.Module) -> None:
        super().__init__()
        self.attr, self.low, self.high = _ACTIVATIONS[type(activation)]
        self.register_buffer("weight", conv.weight.detach())
        self.register_buffer("bias", conv.bias.detach() if conv.bias is not None else None)
        self.conf = ([int(p) for p in conv.padding], list(conv.stride), list(conv.dilation), conv.groups)  # padding: not "same" (_fusable)

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu" or x.dtype != torch.float32 or self.weight.dtype != torch.float32 or torch.is_autocast_enabled("cpu"):
            padding, stride, dilation, groups = self.conf
            y = F.conv2d(x, self.weight, self.bias, stride, padding, dilation, groups)
            return F.hardtanh(y, self.low, self.high) if self.attr == "hardtanh" else F.relu(y)
        if torch.is_grad_enabled() and x.requires_grad:
            out: Tensor = _ConvActivation.apply(x, self.weight, self.bias, self.conf, self.attr, self.low, self.high)  # type: ignore[no-untyped-call]  # torch.autograd.Function.apply is unannotated
            return out
        return _fused(x, self.weight, self.bias, self.conf, self.attr, self.low, self.high)

    def extra_repr(self) -> str:
        return f"{self.attr}, weight {tuple(self.weight.shape)}, (padding, stride, dilation, groups) {self.conf}"


def _fusable(conv: nn.Module | None) -> bool:
    return isinstance(conv, nn.Conv2d) and type(conv) is nn.Conv2d and conv.padding_mode == "zeros" and not isinstance(conv.padding, str)


class ConvLeafTracer(fx.Tracer):
    """Keeps every convolution (subclasses with their own padding too) one node, so conv -> BN and conv ->
    activation pairs show."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, nn.Conv2d) or super().is_leaf_module(m, module_qualified_name)


def set_submodule(root: nn.Module, path: str, module: nn.Module) -> None:
    """Put ``module`` at the dotted ``path`` of ``root``."""
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def fuse_conv_activations(net: nn.Module) -> tuple[nn.Module, int]:
    """``net`` with each plain ``Conv2d`` whose only user is a ``ReLU6`` or ``ReLU`` module (in-place or
    not: nothing else reads the convolution's output) replaced by a :class:`FusedConvActivation`, and how
    many. A ``torch.fx.GraphModule`` (as :func:`~idg_core.models.fold_batchnorm` makes) is changed in
    place; another network is traced first, and comes back as it was where it cannot be traced or has no
    such pair."""
    if not fusion_available():
        return net, 0
    if isinstance(net, fx.GraphModule):
        gm = net
    else:
        try:
            gm = fx.GraphModule(net, ConvLeafTracer().trace(net))
        except Exception as err:  # noqa: BLE001 - any tracing failure means: run it as it is
            log.info("no convolution fused: torch.fx cannot trace %s (%s)", type(net).__name__, type(err).__name__)
            return net, 0
    modules = dict(gm.named_modules())
    calls = Counter(node.target for node in gm.graph.nodes if node.op == "call_module")
    fused = 0
    for node in list(gm.graph.nodes):
        act = modules.get(str(node.target)) if node.op == "call_module" else None
        if type(act) not in _ACTIVATIONS or len(node.args) != 1:  # in-place too: the convolution's output has no other use
            continue
        prev = node.args[0]
        if not isinstance(prev, fx.Node) or prev.op != "call_module" or len(prev.users) != 1:
            continue
        conv = modules.get(str(prev.target))
        if not _fusable(conv) or calls[prev.target] != 1:
            continue  # not a plain convolution, or called elsewhere too (shared weights)
        assert isinstance(conv, nn.Conv2d) and act is not None
        set_submodule(gm, str(prev.target), FusedConvActivation(conv, act))
        node.replace_all_uses_with(prev)
        gm.graph.erase_node(node)
        fused += 1
    if not fused:
        return net, 0
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm, fused
