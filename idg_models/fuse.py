"""Convolution + activation in one oneDNN call on the CPU (:func:`fuse_conv_activations`).

Each ReLU6 (or ReLU) after a convolution otherwise reads and writes the whole activation once more in
the forward pass: EfficientNet-Lite0 has 33 of them. oneDNN applies the clamp while the convolution's
output is still in cache. The backward pass is PyTorch's own: the activation's mask taken from the
fused output (``0 < y < 6`` holds exactly where ``0 < x < 6``), then the convolution's input gradient.
Logits and attributions are bit-identical to the unfused model's (the speed-up: docs/results/speed.md).
"""

from __future__ import annotations

import logging
import operator
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


def _graph_module(net: nn.Module) -> fx.GraphModule | None:
    """``net`` as a ``torch.fx.GraphModule`` with each convolution one node (``net`` itself where it is one already);
    None where it cannot be traced."""
    if isinstance(net, fx.GraphModule):
        return net
    try:
        return fx.GraphModule(net, ConvLeafTracer().trace(net))
    except Exception as err:  # noqa: BLE001 - any tracing failure means: run it as it is
        log.info("no convolution fused: torch.fx cannot trace %s (%s)", type(net).__name__, type(err).__name__)
        return None


def _rewritten(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` after its graph was changed: checked, its dead nodes and unused modules gone, its code made anew."""
    gm.graph.lint()
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


def fuse_conv_activations(net: nn.Module) -> tuple[nn.Module, int]:
    """``net`` with each plain ``Conv2d`` whose only user is a ``ReLU6`` or ``ReLU`` module (in-place or
    not: nothing else reads the convolution's output) replaced by a :class:`FusedConvActivation`, and how
    many. A ``torch.fx.GraphModule`` (as :func:`~idg_models.fold_batchnorm` makes) is changed in
    place; another network is traced first, and comes back as it was where it cannot be traced or has no
    such pair."""
    if not fusion_available():
        return net, 0
    gm = _graph_module(net)
    if gm is None:
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
    return (_rewritten(gm), fused) if fused else (net, 0)


# --- CUDA: convolution + bias (+ residual) + ReLU in one cuDNN kernel -------------------------------------------------
#
# PyTorch runs a convolution's bias as a separate broadcast add after cuDNN's kernel, and batch-norm folding gives every
# convolution a bias: on a GPU that add (in channels-last memory, PyTorch's slow generic element-wise kernel), the
# residual adds and the ReLUs take a large share of eager ResNet-101 bf16 IDG-50/50's kernel time (measured:
# docs/results/speed.md). cuDNN runs ``relu(conv(x) + z + bias)`` as one kernel; PyTorch
# exposes it for inference only (``torch.cudnn_convolution_relu`` / ``torch.cudnn_convolution_add_relu``), so the input
# gradient is written out here: the ReLU's mask from the fused output, then the convolution's input gradient; the
# residual's gradient is the masked one itself.

Conf = tuple[list[int], list[int], list[int], int]  # padding, stride, dilation, groups


def _conv_add_relu(x: Tensor, weight: Tensor, bias: Tensor | None, z: Tensor | None, conf: Conf) -> Tensor:
    """``relu(conv(x) + z + bias)``: one cuDNN kernel on CUDA, PyTorch's separate operations elsewhere (the reference)."""
    padding, stride, dilation, groups = conf
    if x.is_cuda:
        if z is None:
            out: Tensor = torch.cudnn_convolution_relu(x, weight, bias, stride, padding, dilation, groups)
        else:
            out = torch.cudnn_convolution_add_relu(x, weight, z, 1.0, bias, stride, padding, dilation, groups)
        return out
    y = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return F.relu(y if z is None else y + z)


def _input_grad(grad: Tensor, x: Tensor, weight: Tensor, conf: Conf) -> Tensor:
    padding, stride, dilation, groups = conf
    out: Tensor = torch.ops.aten.convolution_backward(grad, x, weight, None, stride, padding, dilation, False, [0, 0], groups,
                                                      [True, False, False])[0]
    return out


class _ConvAddReLU(torch.autograd.Function):
    """The fused forward; backward to the input and the residual only (the weights are constants of an inference graph)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, z: Tensor | None, conf: Conf) -> Tensor:
        y = _conv_add_relu(x, weight, bias, z, conf)
        ctx.save_for_backward(x, weight, y)
        ctx.conf, ctx.has_z = conf, z is not None
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, y = ctx.saved_tensors
        grad = torch.ops.aten.threshold_backward(grad_y, y, 0)
        grad_x = _input_grad(grad, x, weight, ctx.conf) if ctx.needs_input_grad[0] else None
        grad_z = grad if ctx.has_z and ctx.needs_input_grad[3] else None
        return grad_x, None, None, grad_z, None


class FusedConvAddReLU(nn.Module):
    """``relu(conv(x) [+ z])`` as one cuDNN kernel on CUDA, its bias inside (PyTorch's separate operations on the CPU, the
    reference its tests compare with). The weights become buffers in ``dtype`` (bf16 for a bf16-autocast model: the
    casts autocast would make at every call are made once); the input and residual are cast to it; the output is in it.
    Part of an inference graph, the weights never get gradients."""

    weight: Tensor
    bias: Tensor | None

    def __init__(self, conv: nn.Conv2d, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.register_buffer("weight", conv.weight.detach().to(dtype or conv.weight.dtype))
        self.register_buffer("bias", conv.bias.detach().to(dtype or conv.bias.dtype) if conv.bias is not None else None)
        # padding: not "same" (_fusable)
        self.conf: Conf = ([int(p) for p in conv.padding], list(conv.stride), list(conv.dilation), conv.groups)

    def forward(self, x: Tensor, z: Tensor | None = None) -> Tensor:
        x = x.to(self.weight.dtype)
        z = None if z is None else z.to(self.weight.dtype)
        if torch.is_grad_enabled() and (x.requires_grad or (z is not None and z.requires_grad)):
            out: Tensor = _ConvAddReLU.apply(x, self.weight, self.bias, z, self.conf)  # type: ignore[no-untyped-call]  # torch.autograd.Function.apply is unannotated
            return out
        return _conv_add_relu(x, self.weight, self.bias, z, self.conf)

    def extra_repr(self) -> str:
        return f"weight {tuple(self.weight.shape)} {self.weight.dtype}, (padding, stride, dilation, groups) {self.conf}"


_RELUS = (nn.ReLU,)
_RELU_FUNCTIONS = (F.relu, torch.relu)
_ADDS = (operator.add, operator.iadd, torch.add)


def _is_relu(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    if len(node.args) != 1:
        return False
    if node.op == "call_module":
        return type(modules.get(str(node.target))) in _RELUS
    return ((node.op == "call_function" and node.target in _RELU_FUNCTIONS)
            or (node.op == "call_method" and node.target in ("relu", "relu_")))


def fuse_conv_add_relu(net: nn.Module, dtype: torch.dtype | None = None) -> tuple[nn.Module, int]:
    """``net`` with each plain ``Conv2d`` whose only user is a ReLU, or an addition (``conv(x) + z``, either order)
    whose only user is a ReLU, replaced by a :class:`FusedConvAddReLU` (weights in ``dtype``), and how many. Meant for
    CUDA after :func:`~idg_models.fold_batchnorm` (a ResNet's every convolution but its downsampling ones); on the
    CPU the fused modules run PyTorch's own operations. A ``torch.fx.GraphModule`` is changed in place; another network
    is traced first, and comes back as it was where it cannot be traced or has no such pattern."""
    gm = _graph_module(net)
    if gm is None:
        return net, 0
    modules = dict(gm.named_modules())
    calls = Counter(node.target for node in gm.graph.nodes if node.op == "call_module")

    def conv_of(node: Any) -> nn.Conv2d | None:
        """The plain convolution ``node`` calls, if its output has no other user and it runs nowhere else."""
        if not isinstance(node, fx.Node) or node.op != "call_module" or len(node.users) != 1 or calls[node.target] != 1:
            return None
        conv = modules.get(str(node.target))
        return conv if isinstance(conv, nn.Conv2d) and _fusable(conv) else None

    fused = 0
    for relu in list(gm.graph.nodes):
        if not _is_relu(relu, modules):
            continue
        source = relu.args[0]
        if not isinstance(source, fx.Node):
            continue
        conv_node: Any = source
        z: Any = None
        if conv_of(source) is None:  # conv(x) + z -> relu
            if source.op != "call_function" or source.target not in _ADDS or len(source.args) != 2 or source.kwargs:
                continue
            if len(source.users) != 1:  # the sum is read elsewhere too
                continue
            a, b = source.args
            conv_node, z = (a, b) if conv_of(a) is not None else (b, a)
            if conv_of(conv_node) is None or not isinstance(z, fx.Node) or z is conv_node:
                continue
        conv = conv_of(conv_node)
        assert conv is not None and isinstance(conv_node, fx.Node)
        set_submodule(gm, str(conv_node.target), FusedConvAddReLU(conv, dtype))
        if z is not None:
            conv_node.args = (*conv_node.args, z)
            # the residual may be computed after the convolution in the graph's order: run the fused module where the add was
            source.prepend(conv_node)
            relu.replace_all_uses_with(conv_node)
            gm.graph.erase_node(relu)
            gm.graph.erase_node(source)
        else:
            relu.replace_all_uses_with(conv_node)
            gm.graph.erase_node(relu)
        fused += 1
    if not fused:
        return net, 0
    log.info("%d convolutions fused with their bias, residual and ReLU (cuDNN)", fused)
    return _rewritten(gm), fused
