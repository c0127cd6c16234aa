"""Names renamed before the first release keep no alias; one shutdown message across the layers."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest


def test_names_renamed_before_the_first_release_are_gone() -> None:
    """0.1.0 released nothing under the old names, so no alias keeps them: the engine is ``idg_core.model_calls``
    and the ImageNet statistics live with the preprocessing."""
    from idg_core.preprocess import IMAGENET_MEAN
    from idg_models import IMAGENET_MEAN as MODELS_MEAN

    assert MODELS_MEAN is IMAGENET_MEAN
    # by file, not by import: an editable install of another checkout would still find a module deleted here
    assert not (Path(importlib.import_module("idg_core").__file__ or "").parent / "evaluator.py").exists()
    with pytest.raises(ImportError):
        from idg_core.paths import IMAGENET_MEAN as OLD_MEAN  # noqa: F401


def test_one_shutdown_message() -> None:
    from app.core import errors
    from app.doors import drain
    from app.worker import engine

    assert drain.SHUTTING_DOWN is engine.SHUTTING_DOWN is errors.SHUTTING_DOWN  # the worker's drops say what the edge says
