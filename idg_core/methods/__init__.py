"""One file per method; :data:`METHODS` is the registry the library, the service and the
evaluation dispatch through. A method's parameters are declared once, in its file's ``PARAMS``
(:mod:`idg_core.methods.params`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from idg_core.methods import agi as _agi
from idg_core.methods import guided_ig as _guided_ig
from idg_core.methods import idg as _idg
from idg_core.methods import ig as _ig
from idg_core.methods import left_ig as _left_ig
from idg_core.methods._common import WorkBound
from idg_core.methods.agi import agi, agi_plan
from idg_core.methods.guided_ig import guided_ig, guided_ig_plan
from idg_core.methods.idg import idg, idg_plan
from idg_core.methods.ig import ig, ig_plan
from idg_core.methods.left_ig import left_ig, left_ig_plan
from idg_core.methods.params import InvalidParameter, Param, Params
from idg_core.types import AttributionResult, Plan

__all__ = [
    "METHODS", "InvalidParameter", "Method", "Param", "Params", "WorkBound",
    "agi", "agi_plan", "guided_ig", "guided_ig_plan", "idg", "idg_plan", "ig", "ig_plan", "left_ig", "left_ig_plan",
]


@dataclass(frozen=True)
class Method:
    """A registry entry: call it like the function; ``plan`` builds the per-image plan; ``params``
    declares its keyword parameters; ``bound`` gives the most that plan can cost from its
    parameters (every keyword), before it runs."""

    name: str
    function: Callable[..., AttributionResult]
    plan: Callable[..., Plan]
    summary: str
    bound: Callable[[Mapping[str, Any]], WorkBound]
    params: Params

    def __call__(self, *args: Any, **kwargs: Any) -> AttributionResult:
        return self.function(*args, **kwargs)

    @property
    def parameters(self) -> dict[str, Any]:
        """Keyword parameters with their defaults."""
        return self.params.defaults

    def validate(self, **kwargs: Any) -> dict[str, Any]:
        """Every parameter's value (``kwargs`` over the defaults), checked: :class:`InvalidParameter`
        (a ``ValueError``) names an unknown or bad one. Builds nothing, calls no model."""
        return self.params.validate(kwargs)


def _entry(module: Any, summary: str) -> Method:
    name = module.PARAMS.method
    return Method(name, getattr(module, name), getattr(module, f"{name}_plan"), summary, getattr(module, f"{name}_bound"), module.PARAMS)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        _entry(_idg, "Integrated Decision Gradients with adaptive sampling"),
        _entry(_ig, "Integrated Gradients"),
        _entry(_left_ig, "Left-IG: IG up to 90% of the maximum logit"),
        _entry(_guided_ig, "Guided Integrated Gradients"),
        _entry(_agi, "Adversarial Gradient Integration"),
    )
}
