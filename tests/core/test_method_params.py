"""Each method's parameters are declared once (``PARAMS`` in its file): validation is an explicit
call that builds nothing, unknown names are refused naming the method's parameters, and the public
function's signature and docstring come from the declaration."""

from __future__ import annotations

import inspect

import pytest
import torch

from idg_core import METHODS, InvalidParameter
from idg_core.methods.params import Param, Params
from tests.models import Counting, SmallCNN


@pytest.mark.parametrize("name", list(METHODS))
def test_validate_fills_every_default_and_calls_no_model(name: str) -> None:
    method = METHODS[name]
    values = method.validate()
    assert values == method.parameters == {p.name: p.default for p in method.params}


@pytest.mark.parametrize(("name", "given", "bad"), [
    ("ig", {"placement": "aligned"}, "placement"),
    ("agi", {"steps": 8}, "steps"),
    ("idg", {"fraction": 0.5}, "fraction"),
])
def test_a_parameter_the_method_does_not_take_is_refused_naming_its_own(name: str, given: dict, bad: str) -> None:
    with pytest.raises(InvalidParameter, match=f"{name} takes no parameter '{bad}'; its parameters are ") as err:
        METHODS[name].validate(**given)
    assert err.value.name == bad
    assert all(p in str(err.value) for p in METHODS[name].params.names)
    model = Counting(SmallCNN())
    with pytest.raises(InvalidParameter):  # the public function refuses it too, before any model call
        METHODS[name](model, torch.rand(1, 3, 16, 16), "black", 0, **given)
    assert model.calls == []


@pytest.mark.parametrize(("name", "given", "words"), [
    ("idg", {"steps": 1}, "steps must be >= 2, got 1"),
    ("idg", {"uniform": "yes"}, "uniform must be a bool"),
    ("ig", {"steps": 1, "rule": "riemann_trapezoid"}, "steps must be >= 2 with rule=riemann_trapezoid"),
    ("left_ig", {"threshold": 1.5}, "threshold must be a number in [0.0, 1.0]"),
    ("guided_ig", {"fraction": 0.0}, "one feature at a time"),
    ("agi", {"epsilon": 0.0}, "never moves the image"),
    ("agi", {"adversarial_classes": 10, "num_classes": 10}, "adversarial_classes must be in [1, 9]"),
    ("agi", {"adversarial_targets": [3, 12], "num_classes": 10}, "adversarial_targets must be class indices in [0, 9]"),
])
def test_bad_values_are_refused_by_the_explicit_call_naming_the_parameter(name: str, given: dict, words: str) -> None:
    with pytest.raises(InvalidParameter) as err:
        METHODS[name].validate(**given)
    assert words in str(err.value)
    assert err.value.name in given


@pytest.mark.parametrize("name", list(METHODS))
def test_the_public_signature_and_docstring_come_from_the_declaration(name: str) -> None:
    method = METHODS[name]
    sig = inspect.signature(method.function)
    keywords = {n: p.default for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert keywords == {**method.parameters, "batch_size": None, "stats": None, "shapes": None}
    assert list(sig.parameters)[:4] == ["model", "x", "baseline", "target"]
    doc = method.function.__doc__ or ""
    for p in method.params:
        assert f"    {p.name}: {p.help.rstrip('.')}" in doc
    assert method.function.__name__ == name


def test_ranges_read_as_they_are_checked() -> None:
    spec = Params("m", (
        Param("a", int, 3, "A", low=2), Param("b", float, 0.5, "B", low=0.0, high=1.0, low_open=True),
        Param("c", str, "x", "C", choices=("x", "y")), Param("d", bool, False, "D"),
    ))
    assert [p.bounds for p in spec] == [">= 2", "in (0, 1]", "one of x, y", ""]
    assert spec["a"].describe() == "A; >= 2; default 3"
    assert spec.validate({"b": 1}) == {"a": 3, "b": 1.0, "c": "x", "d": False}
    for bad in ({"a": 1}, {"a": 2.5}, {"b": 0}, {"c": "z"}, {"d": 1}):
        with pytest.raises(InvalidParameter):
            spec.validate(bad)
