"""Load the configured models onto the device and warm them up, or fail start-up clearly.

The loaders live in the library (:mod:`idg_models.sources`, :mod:`idg_models.models_file`);
this module turns ``IDG_MODELS`` (+ ``IDG_MODELS_FILE``) into loaded models, or one sentence.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from app.core.config import Settings
from idg_core import idg
from idg_core.call_shapes import CallShapes
from idg_models import ImageClassifier
from idg_models.calibrate import calibrate, mismatch, read_calibrations, write_calibration
from idg_models.compiled import compiled_part, warm_up_compiled
from idg_models.models_file import ModelSettings, read_models_file
from idg_models.sources import ModelSpec, load_source, parse_spec
from idg_serving.warm_up import warm_call_shapes

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """A configured model could not be loaded; the message says which and why."""


def pick_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(setting)
    except RuntimeError as err:  # torch's 50-line traceback had named neither the setting nor what it takes
        raise ModelLoadError(f"IDG_DEVICE={setting!r} is not a device: auto, cpu, cuda or cuda:N") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"IDG_DEVICE={setting} but no CUDA device is available")
    return device


def parse_specs(specs: list[str], models_file: Path | None = None, any_path: bool = False) -> list[tuple[ModelSpec, ModelSettings]]:
    """Every entry parsed and matched with its models-file table, before anything loads (labels files
    only inside the models file's folder unless ``any_path``)."""
    try:
        parsed = [parse_spec(s) for s in specs]
        tables = read_models_file(models_file, any_path) if models_file is not None else {}
    except ValueError as err:
        raise ModelLoadError(str(err)) from err
    names = [p.name for p in parsed]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ModelLoadError(f"IDG_MODELS names the model {twice!r} twice")
    for stray in (n for n in tables if n not in names):  # one file may serve several deployments: a warning, not an error
        log.warning("models file %s has a table [models.%s] but IDG_MODELS loads no model %r", models_file, stray, stray)
    return [(p, tables.get(p.name, ModelSettings())) for p in parsed]


def load_models(specs: list[str], device: torch.device, models_file: Path | None = None,
                any_path: bool = False) -> dict[str, ImageClassifier]:
    models: dict[str, ImageClassifier] = {}
    for spec, settings in parse_specs(specs, models_file, any_path):
        started = time.perf_counter()
        try:
            model = load_source(spec, settings, device)
        except (ValueError, OSError, ImportError, RuntimeError, pickle.UnpicklingError) as err:  # unpickling: a refused weights file
            why = " ".join(str(err).split())[:500]  # one line: torch's unpickling errors run over several
            raise ModelLoadError(f"cannot load model {spec.name!r} ({spec.source}): {why}") from err
        models[spec.name] = model
        p = model.preprocessing
        log.info("loaded %s (%s, %d classes, input %dx%d) on %s in %.1f s", spec.name, spec.source, model.num_classes,
                 p.crop_size, p.crop_size, device, time.perf_counter() - started)
    return models


def apply_calibrations(models: dict[str, ImageClassifier], device: torch.device, settings: Settings) -> None:
    """``IDG_CALIBRATION_FILE`` / ``IDG_CALIBRATE_IMAGES``: give each model whose precision is ``auto``
    its bf16 calibration (``model.calibration``, which :func:`~idg_models.speed.tune_all` follows
    on CUDA): the stored one where the file has one for this source and these weights, else one
    measured now on the photos (added to the file, if one is named). A stored calibration for another
    model is not used (a warning); an unreadable file, or a named file that does not exist without
    photos to make it, stops start-up with a sentence."""
    file, photos = settings.calibration_file, settings.calibrate_images
    if file is None and photos is None:
        return
    if settings.precision != "auto":
        log.info("IDG_PRECISION=%s is explicit: calibrations are not used", settings.precision)
        return
    if file is not None and file.is_dir():
        raise ModelLoadError(f"IDG_CALIBRATION_FILE {file} is a folder, not a calibration file (idg-calibrate --out writes one)")
    if file is not None and not file.is_file() and photos is None:
        raise ModelLoadError(f"IDG_CALIBRATION_FILE {file} does not exist (idg-calibrate writes it; or set IDG_CALIBRATE_IMAGES)")
    try:
        stored = read_calibrations(file) if file is not None and file.is_file() else {}
    except ValueError as err:
        raise ModelLoadError(f"IDG_CALIBRATION_FILE: {err}") from err
    for name, model in models.items():
        if model.speed.get("precision", "auto") != "auto":
            log.info("%s: precision %s set in the models file: not calibrated", name, model.speed["precision"])
            continue
        cal = stored.get(name)
        why = mismatch(cal, model) if cal is not None else None
        if cal is not None and why is None:
            model.calibration = cal
            log.info("calibration from %s: %s", file, cal.summary())
            continue
        if cal is not None:
            log.warning("%s: the calibration in %s is not used: %s", name, file, why)
        if photos is None:
            continue
        try:
            cal = calibrate(model.to(device).eval(), photos, batch_size=settings.batch_images(device),
                            fold_bn=model.speed.get("fold_bn", settings.fold_bn))
        except (ValueError, OSError, RuntimeError) as err:
            raise ModelLoadError(f"cannot calibrate model {name!r} on IDG_CALIBRATE_IMAGES={photos}: {err}") from err
        model.calibration = cal = replace(cal, model=name)  # the served name (a model handed to create_app may carry another)
        if file is not None:
            try:
                write_calibration(file, cal)
            except (OSError, ValueError) as err:
                log.warning("%s: calibration not written to %s: %s", name, file, err)


def warm_up(models: dict[str, ImageClassifier], batch_images: int, run_idg: bool = True,
            shapes: dict[str, CallShapes] | None = None, on_device: Callable[[Callable[[], float]], float] | None = None) -> None:
    """Compile the graphs of every compiled model (:func:`~idg_models.compiled.warm_up_compiled`), then
    warm every model's call shapes on the thread that runs the model calls (``on_device``; cuDNN keeps its
    plans per thread): with fixed call sizes, each size forward and with a gradient, whatever ``run_idg``
    says (traffic must meet no cold size); else, if ``run_idg``, one IDG run at the worker's full batch
    size, forward and backward, so the first request does not pay for the allocator's and the kernels'
    first use (seconds on a CPU)."""
    run = on_device or (lambda fn: fn())
    for name, model in models.items():
        if compiled_part(model) is not None:
            try:
                seconds = warm_up_compiled(model, model.preprocessing.crop_size)
            except Exception as err:  # noqa: BLE001 - dynamo/inductor raise many kinds (no C++ compiler, unsupported op)
                raise ModelLoadError(f"cannot torch.compile model {name!r}: {type(err).__name__}: {str(err)[:500]} "
                                     "(IDG_COMPILE=false, or compile = false in its models-file table, serves it uncompiled)") from err
            log.info("%s: torch.compile start-up cost %.1f s", name, seconds)
        size = model.preprocessing.crop_size
        device = model.mean.device
        shape = (shapes or {}).get(name)
        if shape is not None and shape.fixed:
            seconds = run(partial(warm_call_shapes, model, shape, size, device))
            log.info("warmed %s at call sizes %s (forward and gradient) in %.1f s", name, list(shape.sizes), seconds)
            continue
        if not run_idg:
            if shape is not None:
                shape.warm_seconds = 0.0
            continue
        started = time.perf_counter()
        n = max(2, min(batch_images, model.max_batch or batch_images, 64))
        x = torch.rand(1, 3, size, size).to(device)  # drawn on the CPU: see idg_models.cuda_graphs
        run(partial(_idg_once, model, x, n))
        if shape is not None:
            run(partial(warm_call_shapes, model, shape, size, device, [n]))
        log.info("warmed up %s in %.1f s", name, time.perf_counter() - started)


def _idg_once(model: ImageClassifier, x: torch.Tensor, n: int) -> float:
    idg(model, x, "mean", 0, steps=n, probe_steps=max(3, n), batch_size=n)
    return 0.0
