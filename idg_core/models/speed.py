"""Speed settings of a classifier: arithmetic precision, memory format and ``torch.compile``.

``fp32`` is IEEE float32 everywhere (TF32 off for convolutions too, which PyTorch otherwise allows
by default on CUDA); ``tf32`` lets CUDA matrix units round float32 operands to TF32; ``bf16`` runs
the network under bfloat16 autocast while inputs, logits and input gradients stay float32.
The TF32 switches are process-wide in PyTorch, so one process has one precision.
How far each moves the attributions (rank correlation with fp32) is measured by
``benchmarks/gpu_variants.py``; results in ``results/benchmarks/``.
"""

from __future__ import annotations

import logging
from typing import Literal, get_args

import torch

from idg_core.models.zoo import ImageClassifier

log = logging.getLogger(__name__)

Precision = Literal["fp32", "tf32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


BF16_MEASURED = frozenset({"packaged:efficientnet_lite0"})
"""Model sources whose faithfulness under bf16 was measured (and kept): ``auto`` gives them bf16 on CUDA."""


def default_precision(device: torch.device, source: str | None = None) -> Precision:
    """What ``auto`` means: on CUDA, bf16 autocast for a model whose bf16 faithfulness was measured
    (:data:`BF16_MEASURED`; ``source`` None: the caller vouches for its model) and IEEE fp32 for any
    other, since a precision is chosen by faithfulness, not assumed (a ViT's or a user's CNN's under
    bf16 is not known: measure it with ``benchmarks/gpu_variants.py``, then set it per model in the
    models file); IEEE fp32 elsewhere.

    bf16 is the fastest CUDA setting whose faithfulness stays within noise of (or above) IEEE fp32:
    EfficientNet-Lite0 on 72 ImageNet photos, paired per image, IDG-50/50 insertion +0.011 ± 0.009,
    deletion −0.003 ± 0.006 (lower is better), IG-50 within ± 0.006 on every metric, at 2.8x the
    speed of fp32 on an H100 (``../shared/docs/FACTS.md``; ``benchmarks/gpu_variants.py`` re-measures
    it on the samples where a GPU is lent). On CPUs without bf16 units autocast is slower, not faster.
    """
    if device.type != "cuda":
        return "fp32"
    return "bf16" if source is None or source in BF16_MEASURED else "fp32"


def set_tf32(enabled: bool) -> None:
    """Allow (or forbid) TF32 in CUDA matrix products and cuDNN convolutions, process-wide."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def tune(model: ImageClassifier, *, precision: str = "fp32", channels_last: bool = False, compile: bool = False) -> ImageClassifier:
    """Apply speed settings to ``model`` in place (and return it). Call after moving it to its device."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    device = model.mean.device
    if precision != "fp32" and device.type != "cuda":
        log.warning("precision %s on %s: TF32 does nothing there and bf16 autocast is slow on most CPUs", precision, device)
    set_tf32(precision == "tf32")  # process-wide: see tune_all for several models
    model.autocast_dtype = torch.bfloat16 if precision == "bf16" else None
    model.channels_last = channels_last
    if channels_last:
        model.net = model.net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # accepted at run time; torch's stubs omit it
    if compile:
        model.net = torch.compile(model.net)  # type: ignore[assignment]
    log.info("%s: precision %s, channels_last %s, compile %s", model.name, precision, channels_last, compile)
    return model


def model_precision(model: ImageClassifier, device: torch.device) -> Precision:
    """What :func:`tune` set on ``model``: bf16 autocast, or float32 with TF32 allowed (CUDA only) or not."""
    if model.autocast_dtype == torch.bfloat16:
        return "bf16"
    return "tf32" if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"


def tune_all(
    models: dict[str, ImageClassifier], device: torch.device, *, precision: Precision | Literal["auto"] = "auto",
    channels_last: bool = False, compile: bool = False,
) -> dict[str, ImageClassifier]:
    """Move every model to ``device`` and :func:`tune` it with its own speed keys (``model.speed``,
    from the models file) over these defaults. TF32 is one switch for the whole process, so a
    ``tf32`` model beside an ``fp32`` one is a ``ValueError`` that says so (bf16 mixes with either)."""
    chosen: dict[str, Precision] = {}
    for name, model in models.items():
        p = model.speed.get("precision", precision)
        chosen[name] = default_precision(device, model.source) if p == "auto" else p
        if p == "auto" and device.type == "cuda" and chosen[name] == "fp32":
            log.info("%s: precision auto is IEEE fp32: its faithfulness under bf16 was not measured (benchmarks/gpu_variants.py); "
                     "precision = \"bf16\" in its models-file table opts in", name)
    kinds = set(chosen.values())
    if {"tf32", "fp32"} <= kinds:
        tf32 = ", ".join(n for n, p in chosen.items() if p == "tf32")
        fp32 = ", ".join(n for n, p in chosen.items() if p == "fp32")
        raise ValueError(f"TF32 is process-wide in PyTorch: {tf32} (tf32) and {fp32} (fp32) cannot run in one service; "
                         "give them the same precision (or bf16), or serve them separately")
    tuned = {
        name: tune(model.to(device).eval(), precision=chosen[name], channels_last=model.speed.get("channels_last", channels_last),
                   compile=model.speed.get("compile", compile))
        for name, model in models.items()
    }
    set_tf32("tf32" in kinds)
    return tuned
