"""Makes ``import torchvision`` (and ``import timm``, which imports it) work beside the CPU torch, lazily.

PyPI's torchvision 0.28.0 wheel is compiled for CUDA torch; beside the CPU build of torch 2.13.0 its
compiled operators (``torchvision/_C.so``) cannot load, ``torchvision.extension`` records that
(``_has_ops()`` is False), and the next module, ``torchvision._meta_registrations``, fails with
"operator torchvision::nms does not exist" while registering fake kernels for ``nms``/``qnms``: so
``import torchvision`` fails, and with it ``import timm``. Declaring those two schemas when (and
only when) the compiled ops did not load lets the import, the model builders and the transforms work;
only the detection ops themselves stay unavailable (``torchvision.ops.nms`` says it cannot load its
C++ ops), which this project never calls. With a matching build (CUDA torch in the Docker image) the
ops load and nothing is declared.

:func:`install` puts a finder at the front of ``sys.meta_path`` that does nothing for any module
but ``torchvision.extension``, whose loading it follows. ``scripts/setup.sh`` writes a ``.pth`` file
into the virtual environment's site-packages that loads this file by its path (not through the
``idg_models`` package, whose ``__init__`` imports torch) and calls :func:`install`: so a user's own
script or notebook may start with ``import torchvision, timm``, and start-up stays cheap (this module
imports only the standard library; torch is imported by torchvision itself, before its extension).
:func:`idg_models.import_torchvision` installs it too, for environments made without ``setup.sh``.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: at run time this module imports only sys, at every start-up of the venv's Python
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

TARGET = "torchvision.extension"
SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY: list[Any] = []  # the torch.library.Library that holds the declarations, kept alive while the process lives


def declare_missing_ops() -> bool:
    """Declare ``torchvision::nms``/``qnms`` (only the schemas, no kernels) where they are missing; whether it declared any."""
    import torch  # already imported: torchvision imports it before its extension

    missing = [schema for name, schema in SCHEMAS.items() if not hasattr(torch.ops.torchvision, name)]
    if not missing:
        return False
    lib = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901 - a fragment that lives as long as the process
    for schema in missing:
        lib.define(schema)
    _LIBRARY.append(lib)  # a Library's declarations go when it is garbage-collected
    import logging  # imported by torch already

    logging.getLogger("idg_models.torchvision").info(
        "torchvision's compiled ops did not load (a build for another torch): declared the nms/qnms schemas so that it "
        "imports; its detection ops stay unavailable")
    return True


class _FollowExtension:
    """``torchvision.extension``'s own loader, then the schemas if its compiled ops did not load."""

    idg_follows_extension = True  # a mark, not a type: the .pth file's copy of this module and idg_models' are two modules

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        has_ops = getattr(module, "_has_ops", None)
        if callable(has_ops) and not has_ops():
            declare_missing_ops()

    def __getattr__(self, name: str) -> Any:  # get_filename, get_resource_reader, ... as the wrapped loader has them
        return getattr(self.loader, name)


class TorchvisionFinder:
    """Finds nothing itself: for ``torchvision.extension`` it wraps the spec the other finders give."""

    idg_torchvision_finder = True

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if getattr(finder, "idg_torchvision_finder", False) or not hasattr(finder, "find_spec"):
                continue
            spec: ModuleSpec | None = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not getattr(spec.loader, "idg_follows_extension", False):
                    spec.loader = _FollowExtension(spec.loader)  # type: ignore[assignment]  # a Loader by duck typing
                return spec
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once). If ``torchvision.extension`` is already imported,
    declare the schemas now if its ops did not load."""
    if not any(getattr(f, "idg_torchvision_finder", False) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionFinder())
    extension = sys.modules.get(TARGET)
    has_ops = getattr(extension, "_has_ops", None)
    if callable(has_ops) and not has_ops():
        declare_missing_ops()
