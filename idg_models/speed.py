"""Speed settings of a classifier: arithmetic precision, memory format, batch-norm folding and ``torch.compile``.

``fp32`` is IEEE float32 everywhere (TF32 off for convolutions too, which PyTorch otherwise allows
by default on CUDA); ``tf32`` lets CUDA matrix units round float32 operands to TF32; ``bf16`` runs
the network under bfloat16 autocast while inputs, logits and input gradients stay float32.
The TF32 switches are process-wide in PyTorch, so one process has one precision.
How far each moves the attributions (rank correlation with fp32) is measured by
``benchmarks/gpu_variants.py`` (results: docs/results/speed.md and docs/results/faithfulness.md).

Folding batch norm (:func:`fold_batchnorm`) changes no precision: an eval-mode ``BatchNorm2d`` right
after a convolution is an affine map per channel, so it goes into the convolution's weight and bias
and both its forward and its backward pass disappear. Only float rounding differs.
"""

from __future__ import annotations

import copy
import ctypes
import logging
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Literal, get_args

import torch
from torch import fx, nn

from idg_models.compiled import FixedBatchCompiled, default_compile_sizes
from idg_models.fuse import ConvLeafTracer, fuse_conv_activations, set_submodule
from idg_models.zoo import ImageClassifier

log = logging.getLogger(__name__)

Precision = Literal["fp32", "tf32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


BF16_MEASURED = frozenset({"packaged:efficientnet_lite0"})
"""Model sources whose faithfulness under bf16 was measured here (and kept): ``auto`` gives them bf16 on CUDA."""


def default_precision(device: torch.device, source: str | None = None, bf16_kept: bool | None = None) -> Precision:
    """What ``auto`` means. On CUDA: bf16 autocast for a model whose bf16 faithfulness was measured
    and kept, by a calibration on the user's own photos (``bf16_kept``, the decision of
    :mod:`idg_models.calibrate` / ``idg-calibrate``; it overrides the rest) or, uncalibrated
    (``None``), here (:data:`BF16_MEASURED`; ``source`` None: the caller vouches for its model);
    TF32 for any other model. IEEE fp32 elsewhere.

    A precision is chosen by faithfulness, not assumed. TF32 (float32 storage, matrix products with a
    10-bit mantissa, PyTorch's own default for convolutions on CUDA) stayed within noise of IEEE fp32
    on every metric. bf16 moves more and is not known for a ViT's or a user's CNN, so it is earned per
    model; EfficientNet-Lite0 earned it (both: docs/results/faithfulness.md). On CPUs without bf16 units
    autocast is slower, not faster, and TF32 does not exist: IEEE fp32 there, calibrated or not.
    """
    if device.type != "cuda":
        return "fp32"
    if bf16_kept is not None:
        return "bf16" if bf16_kept else "tf32"
    return "bf16" if source is None or source in BF16_MEASURED else "tf32"


def default_channels_last(device: torch.device, precision: str) -> bool:
    """What ``channels_last = auto`` means. On the CPU, on (oneDNN's channels-last kernels are faster).
    On CUDA, on with bf16 only: it speeds bf16 up and slows fp32 down (measured: docs/results/speed.md)."""
    return device.type == "cpu" or precision == "bf16"


def fold_batchnorm(net: nn.Module) -> nn.Module:
    """``net`` with every eval-mode ``BatchNorm2d`` that only follows a ``Conv2d`` folded into it
    (``W' = W * g / sqrt(v + e)``, ``b' = (b - m) * g / sqrt(v + e) + beta``, per output channel), and
    fixed zero padding before a convolution made the convolution's own (:func:`_with_own_padding`),
    as a ``torch.fx.GraphModule``; ``net`` itself is left as it was. A network that ``torch.fx`` cannot
    trace, or that has no such pair, comes back unchanged (logged): folding is only a speed-up."""
    if net.training:
        raise ValueError("fold_batchnorm needs a model in eval mode (training-mode batch norm uses batch statistics)")
    try:
        graph = ConvLeafTracer().trace(net)
    except Exception as err:  # noqa: BLE001  # any tracing failure (data-dependent control flow, ...) means: run it as it is
        log.info("batch norm not folded: torch.fx cannot trace %s (%s: %s)", type(net).__name__, type(err).__name__, err)
        return net
    gm = fx.GraphModule(net, graph)  # shares net's parameters: the folded convolutions below are copies
    modules = dict(gm.named_modules())
    calls = Counter(node.target for node in gm.graph.nodes if node.op == "call_module")
    folded = 0
    for node in list(gm.graph.nodes):
        bn = modules.get(node.target) if node.op == "call_module" else None
        if not isinstance(bn, nn.BatchNorm2d) or bn.training or not bn.track_running_stats or len(node.args) != 1:
            continue
        prev = node.args[0]
        conv = modules.get(prev.target) if isinstance(prev, fx.Node) and prev.op == "call_module" else None
        if not isinstance(conv, nn.Conv2d) or len(prev.users) != 1 or calls[prev.target] != 1:
            continue  # its output feeds more than the BN, or the same convolution runs elsewhere too (shared weights)
        assert bn.running_mean is not None and bn.running_var is not None  # track_running_stats
        scale = torch.rsqrt(bn.running_var + bn.eps) * (bn.weight if bn.weight is not None else 1)
        shift = bn.bias if bn.bias is not None else torch.zeros_like(bn.running_mean)
        new = copy.deepcopy(conv)
        with torch.no_grad():
            new.weight = nn.Parameter(conv.weight * scale.reshape(-1, 1, 1, 1), requires_grad=conv.weight.requires_grad)
            old_bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
            new.bias = nn.Parameter((old_bias - bn.running_mean) * scale + shift, requires_grad=conv.weight.requires_grad)
        set_submodule(gm, str(prev.target), new)
        node.replace_all_uses_with(prev)
        gm.graph.erase_node(node)
        folded += 1
    padded = 0
    for name, conv in list(gm.named_modules()):
        plain = _with_own_padding(conv)
        if plain is not None:
            set_submodule(gm, name, plain)
            padded += 1
    if not folded and not padded:
        log.info("batch norm not folded: %s has no convolution followed by eval-mode batch norm", type(net).__name__)
        return net
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    log.info("folded %d batch norms and %d zero paddings into their convolutions", folded, padded)
    return gm


def _with_own_padding(conv: nn.Module) -> nn.Conv2d | None:
    """A TensorFlow-style "same" convolution of an EfficientNet port (a ``Conv2d`` subclass that runs a
    fixed ``static_padding = ZeroPad2d(...)``, or a pass-through where it needs none, before its convolution)
    as a plain ``Conv2d`` with its own symmetric padding: no padded copy of the input (and of its gradient)
    per convolution.

    Symmetric padding is taken over as it is. Padding with more at the end than at the start (stride 2
    on an even size: 0 before, 1 after) becomes the larger amount on both sides with the kernel widened
    by zeros at its start, ``(k + d)`` for a difference ``d``: output ``i`` then reads the same inputs
    with the same weights (the extra leading zero row meets only the extra padding), so the function and
    its input gradient are the same up to the order of float additions (Lite0's logits came out equal).
    The padded copies are a noticeable share of a Lite0 forward-and-gradient pass on the CPU, mostly
    the stride-2 ones (measured: docs/results/speed.md). The widening is done on the CPU only, where it
    was measured. None: not such a module, more padding at the start than at
    the end, or an asymmetric one off the CPU."""
    pad = getattr(conv, "static_padding", None)
    if type(conv) is nn.Conv2d or not isinstance(conv, nn.Conv2d) or not isinstance(pad, nn.Module):
        return None
    if isinstance(pad, nn.ZeroPad2d):
        left, right, top, bottom = pad.padding
    elif _passes_through(pad):  # the ports' own Identity where no padding is needed (1x1 convolutions)
        left = right = top = bottom = 0
    else:
        return None
    extra_h, extra_w = bottom - top, right - left
    if (min(extra_h, extra_w) < 0 or tuple(conv.padding) != (0, 0) or conv.padding_mode != "zeros"
            or tuple(conv.dilation) != (1, 1)):
        return None
    if (extra_h or extra_w) and conv.weight.device.type != "cpu":
        return None  # measured on the CPU only; cuDNN's depthwise kernels are made for odd sizes, so a GPU keeps the copy
    kh, kw = conv.kernel_size
    plain = nn.Conv2d(conv.in_channels, conv.out_channels, (kh + extra_h, kw + extra_w), conv.stride,  # type: ignore[arg-type]
                      padding=(bottom, right), groups=conv.groups, bias=conv.bias is not None,
                      device=conv.weight.device, dtype=conv.weight.dtype)
    if extra_h or extra_w:
        with torch.no_grad():
            plain.weight.zero_()
            plain.weight[:, :, extra_h:, extra_w:] = conv.weight
        plain.weight.requires_grad_(conv.weight.requires_grad)
    else:
        plain.weight = conv.weight
    plain.bias = conv.bias
    return plain


def _passes_through(module: nn.Module) -> bool:
    """A module without parameters or buffers that returns its input itself."""
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        return False
    probe = torch.zeros(1)
    try:
        return module(probe) is probe
    except Exception:  # noqa: BLE001 - any module that cannot take a plain tensor is not a pass-through
        return False


def set_tf32(enabled: bool) -> None:
    """Allow (or forbid) TF32 in CUDA matrix products and cuDNN convolutions, process-wide."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8  # glibc's malloc.h


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20, top_pad: int = 64 << 20,
                      arenas: int = 1) -> bool:
    """Have glibc's ``malloc`` keep freed memory for reuse instead of giving it back to the kernel,
    process-wide: blocks up to ``mmap_threshold`` (32 MiB is glibc's most) come from the heap, which
    is trimmed only when ``trim_threshold`` lies free at its top, and grows ``top_pad`` at a time.
    Threads started after this share ``arenas`` heaps: a thread's own arena is made of 64 MiB pieces
    that glibc unmaps whenever one falls empty, whatever the trim threshold, so a worker thread in an
    arena of its own would still fault pages on every request; sharing the main one (the default, 1)
    it hardly does.

    PyTorch's CPU tensors are plain ``malloc`` blocks. With glibc's defaults a forward and backward
    pass returns most of its activations to the kernel and faults them back in on the next call
    (the cost: docs/results/speed.md). The price: the process keeps its
    peak working set (resident memory does not fall after a burst). Returns whether glibc took all
    four settings (``False`` on another C library or system, where nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library symbols, or not glibc's malloc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    answers = [mallopt(option, value) for option, value in  # every one is set, whatever the others answer
               ((_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, trim_threshold), (_M_TOP_PAD, top_pad),
                (_M_ARENA_MAX, arenas))]
    applied = answers == [1, 1, 1, 1]
    log.info("malloc keeps freed memory (mmap threshold %d MiB, trim threshold %d MiB): %s", mmap_threshold >> 20,
             trim_threshold >> 20, "on" if applied else "not supported here")
    return applied


def tune(model: ImageClassifier, *, precision: str = "fp32", channels_last: bool = False, compile: bool = False,
         fold_bn: bool = False, compile_sizes: Sequence[int] | None = None) -> ImageClassifier:
    """Apply speed settings to ``model`` in place (and return it). Call after moving it to its device
    and putting it in eval mode. ``fold_bn``: :func:`fold_batchnorm`, then, on the CPU in fp32 without
    ``compile``, :func:`~idg_models.fuse.fuse_conv_activations` (a network without batch norm too). ``compile``: the network becomes a
    :class:`~idg_models.compiled.FixedBatchCompiled` at ``compile_sizes`` (default: from the
    model's ``max_batch``, else 8); compile its graphs before traffic with
    :func:`~idg_models.compiled.warm_up_compiled`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    device = model.mean.device
    if precision != "fp32" and device.type != "cuda":
        log.warning("precision %s on %s: TF32 does nothing there and bf16 autocast is slow on most CPUs", precision, device)
    set_tf32(precision == "tf32")  # process-wide: see tune_all for several models
    model.autocast_dtype = torch.bfloat16 if precision == "bf16" else None
    if fold_bn:
        model.net = fold_batchnorm(model.net)
        if device.type == "cpu" and precision == "fp32" and not compile:
            model.net, fused = fuse_conv_activations(model.net)
            log.info("%s: %d convolutions fused with their activation (oneDNN)", model.name, fused)
    model.channels_last = channels_last
    if channels_last:
        model.net = model.net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # accepted at run time; torch's stubs omit it
    if compile:
        sizes = tuple(compile_sizes) if compile_sizes else default_compile_sizes(model.max_batch or 8)
        model.net = FixedBatchCompiled(model.net, sizes)
    log.info("%s: precision %s, channels_last %s, fold_bn %s, compile %s", model.name, precision, channels_last, fold_bn,
             model.net.sizes if isinstance(model.net, FixedBatchCompiled) else False)
    return model


def tuned(model: ImageClassifier, device: str | torch.device = "cpu") -> ImageClassifier:
    """``model`` moved to ``device``, in eval mode, with the speed settings the service gives it by default, in
    place (and returned): the precision :func:`default_precision` gives its source (IEEE fp32 on the CPU), the
    memory format of :func:`default_channels_last`, batch norm folded into the convolutions and, on the CPU in
    fp32, each convolution fused with its activation (:func:`tune` with ``fold_bn=True``); not compiled. The
    function stays the same: only float rounding differs (logits within about 1e-3 of the untuned model's on
    the CPU). The network becomes a ``torch.fx`` graph, so hooks on its inner layers (layer attributions, a
    batch-norm module) see the folded network: tune a copy where those are needed. Use:
    ``model = tuned(load_model("efficientnet_lite0"))``, then ``idg(model, x, "mean", target=17)`` as before.

    On CUDA the precision may be bf16 or TF32 (see :func:`default_precision`); TF32 is process-wide."""
    dev = torch.device(device)
    model = model.to(dev).eval()
    precision = default_precision(dev, model.source, None if model.calibration is None else model.calibration.bf16_kept)
    return tune(model, precision=precision, channels_last=default_channels_last(dev, precision), fold_bn=True)


def model_precision(model: ImageClassifier, device: torch.device) -> Precision:
    """What :func:`tune` set on ``model``: bf16 autocast, or float32 with TF32 allowed (CUDA only) or not."""
    if model.autocast_dtype == torch.bfloat16:
        return "bf16"
    return "tf32" if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"


def choose_precisions(models: dict[str, ImageClassifier], device: torch.device,
                      precision: Precision | Literal["auto"] = "auto") -> dict[str, tuple[Precision, str]]:
    """Each model's precision on ``device`` and where it came from: ``"models file"`` (its own
    ``precision`` key), ``"setting"`` (``precision``, the service's ``IDG_PRECISION``), ``"calibration"``
    (``auto`` on CUDA, decided by the model's :attr:`~idg_models.ImageClassifier.calibration`)
    or ``"auto"`` (:func:`default_precision`).

    TF32 is one switch for the whole process: where ``auto`` would give TF32 beside a model set to
    IEEE fp32, it gives IEEE fp32 (logged); any other ``tf32`` beside
    ``fp32`` is a ``ValueError`` that says so (bf16 mixes with either)."""
    chosen: dict[str, tuple[Precision, str]] = {}
    for name, model in models.items():
        own = model.speed.get("precision")
        if own not in (None, "auto"):
            chosen[name] = (own, "models file")
        elif precision != "auto":
            chosen[name] = (precision, "setting")
        else:
            calibration = model.calibration
            kept = None if calibration is None else calibration.bf16_kept
            source = "calibration" if calibration is not None and device.type == "cuda" else "auto"
            chosen[name] = (default_precision(device, model.source, kept), source)
    fixed = {p for p, source in chosen.values() if source in ("models file", "setting")}
    for name, (p, source) in chosen.items():
        if p == "tf32" and source in ("auto", "calibration") and "fp32" in fixed:
            log.info("%s: precision auto is IEEE fp32, not TF32: TF32 is process-wide and another model is set to fp32", name)
            chosen[name] = ("fp32", source)
        elif p == "tf32" and source in ("auto", "calibration"):
            log.info("%s: precision auto is TF32 (within noise of IEEE fp32 on every metric); bf16 is earned by calibration on "
                     "your photos (idg-calibrate, IDG_CALIBRATE_IMAGES)", name)
    if {"tf32", "fp32"} <= {p for p, _ in chosen.values()}:
        tf32 = ", ".join(n for n, (p, _) in chosen.items() if p == "tf32")
        fp32 = ", ".join(n for n, (p, _) in chosen.items() if p == "fp32")
        raise ValueError(f"TF32 is process-wide in PyTorch: {tf32} (tf32) and {fp32} (fp32) cannot run in one service; "
                         "give them the same precision (or bf16), or serve them separately")
    return chosen


def tune_all(
    models: dict[str, ImageClassifier], device: torch.device, *, precision: Precision | Literal["auto"] = "auto",
    channels_last: bool | Literal["auto"] = "auto", compile: bool = False, fold_bn: bool = True,
    compile_sizes: Sequence[int] | None = None, batch_images: int | None = None,
) -> dict[str, ImageClassifier]:
    """Move every model to ``device`` and :func:`tune` it with its own speed keys (``model.speed``,
    from the models file) over these defaults, at the precision :func:`choose_precisions` gives it
    (recorded as ``model.precision_source``). A compiled model's batch sizes are ``compile_sizes``,
    else :func:`~idg_models.compiled.default_compile_sizes` of its largest call (its
    ``max_batch``, at most ``batch_images``)."""
    choice = choose_precisions(models, device, precision)
    chosen = {name: p for name, (p, _) in choice.items()}
    kinds = set(chosen.values())
    for name, (_, source) in choice.items():
        models[name].precision_source = source
    tuned = {}
    for name, model in models.items():
        layout = model.speed.get("channels_last", channels_last)
        largest_call = min(filter(None, (model.max_batch, batch_images)), default=8)
        tuned[name] = tune(model.to(device).eval(), precision=chosen[name],
                           channels_last=default_channels_last(device, chosen[name]) if layout == "auto" else layout,
                           compile=model.speed.get("compile", compile), fold_bn=model.speed.get("fold_bn", fold_bn),
                           compile_sizes=compile_sizes or default_compile_sizes(largest_call))
    set_tf32("tf32" in kinds)
    return tuned
