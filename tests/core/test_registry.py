"""A method is one file: its registry entry declares presets, step counts, whether IDGI applies, its
summary and cost bound, and everything else (presets, the service's method list and step bound, the
IDGI set, the page's Steps box) is read from the registry."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from app.schemas import AttributeCommon, MethodName
from idg_core.budget import WorkBound
from idg_core.methods import METHODS, PRESET_NAMES, Method
from idg_core.methods.params import InvalidParameter, Param, Params
from idg_core.postprocess import IDGI_METHODS
from idg_core.presets import PRESETS, preset_params
from idg_core.types import AttributionResult


def _method(presets: dict[str, dict[str, Any]]) -> Method:
    params = Params("toy", (Param("width", float, 0.5, "Not a step"), Param("rounds", int, 4, "Rounds", low=1, step=True)))

    def plan(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not run")

    def function(*args: Any, **kwargs: Any) -> AttributionResult:
        raise AssertionError("not run")

    return Method(function, plan, params, lambda p: None, "Toy", presets=presets)  # type: ignore[arg-type,return-value]


def test_the_service_and_the_presets_list_the_registry() -> None:
    assert set(get_args(MethodName)) == set(METHODS) == set(PRESETS)
    assert set(IDGI_METHODS) == {n for n, m in METHODS.items() if m.straight_path} >= {"idg", "ig", "left_ig"}
    described = AttributeCommon.model_fields["method"].description or ""
    assert all(f"{n} ({m.summary})" in described for n, m in METHODS.items())


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_declares_its_step_counts_and_the_page_finds_the_main_one(name: str) -> None:
    params = METHODS[name].params
    if params.steps:
        # app.js sets the first integer parameter GET /models lists: it must be the method's main step count
        first_int = next(p.name for p in params if p.service and p.kind is int)
        assert first_int == params.steps[0]
    else:  # nothing for IDG_MAX_STEPS to bound: a fixed cost (the CAM family's one pass each way), and no integer for the page
        assert METHODS[name].bound(params.defaults) == WorkBound(1, 1), f"{name} declares no step count: IDG_MAX_STEPS would not bound it"
        assert not any(p.kind is int for p in params if p.service)
    for preset in PRESET_NAMES:  # every preset row resolves (declared, or the method's defaults)
        METHODS[name].validate(**preset_params(name, preset))


def test_a_preset_a_method_does_not_declare_runs_its_defaults() -> None:
    toy = _method({"paper": {"rounds": 50}})
    assert toy.preset("paper") == {"rounds": 50}
    assert toy.preset("fast") == {}  # not a KeyError (a 500 in the service): the defaults
    with pytest.raises(ValueError, match="fast, paper"):
        toy.preset("quick")


def test_a_preset_with_a_bad_or_unknown_value_fails_when_the_method_is_declared() -> None:
    with pytest.raises(InvalidParameter, match="rounds must be >= 1"):
        _method({"fast": {"rounds": 0}})
    with pytest.raises(InvalidParameter, match="toy takes no parameter 'steps'"):
        _method({"fast": {"steps": 8}})
    with pytest.raises(TypeError, match="unknown preset 'turbo'"):
        _method({"turbo": {"rounds": 2}})
