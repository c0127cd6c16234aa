"""The one place that imports torchvision: :func:`import_torchvision`.

PyPI's torchvision 0.28.0 wheel is built against CUDA torch; beside the CPU build of torch 2.13.0 its
compiled operators cannot load, and a bare ``import torchvision`` fails with "operator torchvision::nms
does not exist". :mod:`idg_models._torchvision_hook` declares the two missing op schemas as
torchvision imports, when (and only when) its ops did not load; the ``.venv`` that ``scripts/setup.sh``
makes has it installed at start-up (a ``.pth`` file), and this function installs it in any other
environment. With a matching build (CUDA torch in the Docker image) nothing is declared.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from idg_models import _torchvision_hook


def import_torchvision() -> ModuleType:
    """``import torchvision``, the missing detection op schemas declared first when its build needs it.

    Needed only outside the project's ``.venv`` (where ``scripts/setup.sh`` makes ``import torchvision``
    and ``import timm`` work directly): call it once before importing either beside the CPU torch;
    public as ``idg_models.import_torchvision``."""
    _torchvision_hook.install()
    return importlib.import_module("torchvision")
