"""Names moved so that they say what they hold still import from where they were: the model-call engine
(``idg_core.evaluator`` -> ``idg_core.model_calls``, apart from the ``idg_core.evaluation`` tool) with a
deprecation warning, and the ImageNet statistics (path maths -> preprocessing) as the same objects."""

from __future__ import annotations

import importlib
import sys

import pytest


def test_the_old_engine_module_warns_and_is_the_new_one() -> None:
    sys.modules.pop("idg_core.evaluator", None)
    with pytest.warns(DeprecationWarning, match="idg_core.model_calls"):
        old = importlib.import_module("idg_core.evaluator")
    new = importlib.import_module("idg_core.model_calls")
    assert old.run_plans is new.run_plans and old.PlanState is new.PlanState and old.CallStats is new.CallStats


def test_imagenet_statistics_live_with_preprocessing_and_still_import_from_paths() -> None:
    from idg_core.models import IMAGENET_MEAN as MODELS_MEAN
    from idg_core.models.preprocess import IMAGENET_MEAN, IMAGENET_STD
    from idg_core.paths import IMAGENET_MEAN as OLD_MEAN
    from idg_core.paths import IMAGENET_STD as OLD_STD

    assert OLD_MEAN is IMAGENET_MEAN is MODELS_MEAN and OLD_STD is IMAGENET_STD
    with pytest.raises(ImportError):
        from idg_core.paths import IMAGENET_VARIANCE  # noqa: F401


def test_one_shutdown_message() -> None:
    from app.core import drain, errors
    from app.worker import engine

    assert drain.SHUTTING_DOWN is engine.SHUTTING_DOWN is errors.SHUTTING_DOWN  # the worker's drops say what the edge says
