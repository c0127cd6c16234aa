"""The models file (TOML): what a model file alone does not say, one table per model.

.. code-block:: toml

    [models.pets]                     # the NAME of an IDG_MODELS entry NAME=SOURCE
    input_size = 384                  # the model's square input (crop), pixels
    resize_size = 438                 # shorter side before the centre crop (default: input_size / 0.875)
    interpolation = "bicubic"         # bilinear, bicubic, nearest, lanczos, box or hamming
    mean = [0.485, 0.456, 0.406]      # normalisation, applied inside the model to pixels in [0, 1]
    std = [0.229, 0.224, 0.225]
    num_classes = 37
    labels = "pets.txt"               # one class name per line; relative to this file, and inside its
                                      # folder unless paths anywhere are allowed (IDG_MODELS_FILE_ANY_PATH)
    max_batch = 16                    # most images in one model call
    precision = "bf16"                # fp32, tf32, bf16 or auto (default: the service's IDG_PRECISION)
    channels_last = true              # default: IDG_CHANNELS_LAST
    fold_bn = true                    # fold batch norm into convolutions; default: IDG_FOLD_BN
    compile = false                   # torch.compile at start-up; default: IDG_COMPILE
    cam_layer = "features.8"          # the module Grad-CAM reads (dotted name in the network the source
                                      # builds); default: its last spatial feature map (idg_models.cam_layer)

A key given here overrides what the source says. ``crop_size`` is a synonym of ``input_size``;
``resize_mode = "squash"`` resizes the whole image to ``resize_size`` square (aspect not kept).
TF32 is a process-wide switch in PyTorch: one service cannot run one model in ``tf32`` and another
in ``fp32`` (start-up refuses it); ``bf16`` (autocast, per model) mixes with either.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from idg_core.preprocess import INTERPOLATIONS

RESIZE_MODES = ("shorter", "squash")
PRECISION_CHOICES = ("fp32", "tf32", "bf16", "auto")


@dataclass(frozen=True)
class ModelSettings:
    """One ``[models.NAME]`` table; ``None``: the source decides."""

    input_size: int | None = None
    resize_size: int | None = None
    interpolation: str | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    num_classes: int | None = None
    labels: tuple[str, ...] | None = None
    max_batch: int | None = None
    resize_mode: str | None = None
    precision: str | None = None
    channels_last: bool | None = None
    compile: bool | None = None
    fold_bn: bool | None = None
    cam_layer: str | None = None


KEYS = (*(f.name for f in fields(ModelSettings)), "crop_size")


def read_labels(path: Path) -> tuple[str, ...]:
    """One class name per line (blank lines at the end ignored)."""
    if not path.is_file():
        raise ValueError(f"labels file {path} does not exist")
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError(f"labels file {path} is empty")
    return tuple(line.strip() for line in lines)


def _positive_int(where: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _triple(where: str, key: str, value: Any, positive: bool) -> tuple[float, float, float]:
    ok = isinstance(value, list) and len(value) == 3 and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if not ok or not all(math.isfinite(v) for v in value) or (positive and min(value) <= 0):  # TOML has nan and inf
        raise ValueError(f"{where}: {key} must be a list of 3 finite {'positive ' if positive else ''}numbers (R, G, B), "
                         f"got {value!r}")
    return (float(value[0]), float(value[1]), float(value[2]))


def labels_path(where: str, given: str, base: Path, any_path: bool) -> Path:
    """The labels file a table names: relative to ``base`` (the models file's folder), and inside it
    unless ``any_path``: a models file is configuration, and a path like ``../../etc/shadow`` or an
    absolute one would make the service read (and show as class names) whatever file it points at."""
    path = (base / given).resolve()
    if not any_path and not path.is_relative_to(base.resolve()):
        raise ValueError(f"{where}: labels {given!r} is outside the models file's folder {base.resolve()}; put the file "
                         "there, or allow paths anywhere (IDG_MODELS_FILE_ANY_PATH=true)")
    return path


def parse_table(where: str, table: Any, base: Path, any_path: bool = False) -> ModelSettings:
    """Check one table's keys and values; ``base`` is the folder relative label paths start from (and,
    unless ``any_path``, stay inside)."""
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table of settings")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    out: dict[str, Any] = {}
    for key in ("input_size", "resize_size", "num_classes", "max_batch"):
        if key in table:
            out[key] = _positive_int(where, key, table[key])
    if "crop_size" in table:
        crop = _positive_int(where, "crop_size", table["crop_size"])
        if out.get("input_size", crop) != crop:
            raise ValueError(f"{where}: crop_size {crop} and input_size {out['input_size']} differ (they are the same setting)")
        out["input_size"] = crop
    if "interpolation" in table:
        if table["interpolation"] not in INTERPOLATIONS:
            raise ValueError(f"{where}: interpolation must be one of {', '.join(INTERPOLATIONS)}, got {table['interpolation']!r}")
        out["interpolation"] = table["interpolation"]
    if "resize_mode" in table:
        if table["resize_mode"] not in RESIZE_MODES:
            raise ValueError(f"{where}: resize_mode must be one of {', '.join(RESIZE_MODES)}, got {table['resize_mode']!r}")
        out["resize_mode"] = table["resize_mode"]
    if "precision" in table:
        if table["precision"] not in PRECISION_CHOICES:
            raise ValueError(f"{where}: precision must be one of {', '.join(PRECISION_CHOICES)}, got {table['precision']!r}")
        out["precision"] = table["precision"]
    for key in ("channels_last", "compile", "fold_bn"):
        if key in table:
            if not isinstance(table[key], bool):
                raise ValueError(f"{where}: {key} must be true or false, got {table[key]!r}")
            out[key] = table[key]
    if "cam_layer" in table:
        name = table["cam_layer"]
        if not isinstance(name, str) or not name or not all(part.isidentifier() or part.isdigit() for part in name.split(".")):
            raise ValueError(f"{where}: cam_layer must be a module's dotted name in the network (as named_modules() lists it, "
                             f"e.g. \"layer4\" or \"features.8\"), got {name!r}")
        out["cam_layer"] = name
    if "mean" in table:
        out["mean"] = _triple(where, "mean", table["mean"], positive=False)
    if "std" in table:
        out["std"] = _triple(where, "std", table["std"], positive=True)
    if "labels" in table:
        if not isinstance(table["labels"], str):
            raise ValueError(f"{where}: labels must be the path of a file with one class name per line")
        path = labels_path(where, table["labels"], base, any_path)
        try:
            out["labels"] = read_labels(path)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err
        if out.get("num_classes", len(out["labels"])) != len(out["labels"]):
            raise ValueError(f"{where}: num_classes is {out['num_classes']} but the labels file has {len(out['labels'])} names")
    return ModelSettings(**out)


def read_models_file(path: str | Path, any_path: bool = False) -> dict[str, ModelSettings]:
    """``{NAME: settings}`` from the TOML file at ``path``; a ``ValueError`` sentence on any mistake.
    Labels files are read relative to the file's folder and only inside it, unless ``any_path``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"models file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"models file {path} is not valid TOML: {err}") from err
    unknown = sorted(set(data) - {"models"})
    if unknown:
        raise ValueError(f"models file {path}: unknown top-level key {unknown[0]!r} (settings go in [models.NAME] tables)")
    tables = data.get("models", {})
    if not isinstance(tables, dict):
        raise ValueError(f"models file {path}: models must hold one [models.NAME] table per model")
    return {name: parse_table(f"models file {path}, [models.{name}]", t, path.parent, any_path) for name, t in tables.items()}
