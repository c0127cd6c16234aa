"""The one place that imports torchvision.

PyPI's torchvision 0.28.0 wheel is built against CUDA torch; beside the CPU build of torch 2.13.0
its compiled operators cannot load, and ``import torchvision`` fails with "operator
torchvision::nms does not exist" while registering fake kernels for ``nms``/``qnms``. Declaring
those two schemas first lets the import, the model builders and the transforms work (only the
detection ops themselves stay unavailable, which this project never calls). With a matching build
(CUDA torch in the Docker image) the import works directly and nothing is declared.
"""

from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType

import torch

log = logging.getLogger(__name__)

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIB: torch.library.Library | None = None


def _declare_missing_ops() -> None:
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901
    for _name, schema in _SCHEMAS.items():
        try:
            _LIB.define(schema)
        except RuntimeError:  # already declared by a build that did load
            continue
    log.info("declared torchvision op schemas nms/qnms (this torchvision was built for another torch)")


def import_torchvision() -> ModuleType:
    """``import torchvision``, declaring the detection op schemas first when its build needs it.

    Call it once before ``import timm`` or ``import torchvision`` in your own script beside the CPU torch
    (both fail there with "operator torchvision::nms does not exist" otherwise); public as
    ``idg_models.import_torchvision``."""
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as err:
        if "torchvision::nms" not in str(err):
            raise
    _declare_missing_ops()
    for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[mod]
    return importlib.import_module("torchvision")
