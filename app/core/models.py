"""Load the configured models onto the device and warm them up, or fail start-up clearly."""

from __future__ import annotations

import logging
import time

import torch

from idg_core import idg
from idg_core.models import ImageClassifier, load_model

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """A configured model could not be loaded; the message says which and why."""


def pick_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"IDG_DEVICE={setting} but no CUDA device is available")
    return device


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``name`` or ``name=/path/to/weights.pth``."""
    name, _, weights = spec.partition("=")
    return name.strip(), (weights.strip() or None)


def load_models(specs: list[str], device: torch.device) -> dict[str, ImageClassifier]:
    models: dict[str, ImageClassifier] = {}
    for spec in specs:
        name, weights = parse_spec(spec)
        started = time.perf_counter()
        try:
            model = load_model(name, weights)
        except (ValueError, FileNotFoundError, ImportError) as err:
            raise ModelLoadError(f"cannot load model {spec!r}: {err}") from err
        models[name] = model.to(device).eval()
        log.info("loaded %s on %s in %.1f s", name, device, time.perf_counter() - started)
    return models


def warm_up(models: dict[str, ImageClassifier], batch_images: int) -> None:
    """One IDG run per model at the worker's full batch size, forward and backward, so the first
    request does not pay for the allocator's and the kernels' first use (about 3 s on a CPU)."""
    for name, model in models.items():
        started = time.perf_counter()
        size = model.preprocessing.crop_size
        x = torch.rand(1, 3, size, size, device=next(model.parameters()).device)
        n = max(2, min(batch_images, 64))
        idg(model, x, "mean", 0, steps=n, probe_steps=max(3, n), batch_size=n)
        log.info("warmed up %s in %.1f s", name, time.perf_counter() - started)
