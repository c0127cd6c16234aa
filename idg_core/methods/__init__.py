"""One file per method; :data:`METHODS` is the registry the service dispatches through."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from idg_core.methods._common import WorkBound
from idg_core.methods.agi import agi, agi_bound, agi_plan
from idg_core.methods.guided_ig import guided_ig, guided_ig_bound, guided_ig_plan
from idg_core.methods.idg import idg, idg_bound, idg_plan
from idg_core.methods.integrated_gradients import integrated_gradients, integrated_gradients_bound, integrated_gradients_plan
from idg_core.methods.left_ig import left_ig, left_ig_bound, left_ig_plan
from idg_core.types import AttributionResult, Plan


@dataclass(frozen=True)
class Method:
    """A registry entry: call it like the function; ``plan`` builds the per-image plan; ``bound``
    gives the most that plan can cost from its parameters (every keyword), before it runs."""

    name: str
    function: Callable[..., AttributionResult]
    plan: Callable[..., Plan]
    summary: str
    bound: Callable[[Mapping[str, Any]], WorkBound]

    def __call__(self, *args: Any, **kwargs: Any) -> AttributionResult:
        return self.function(*args, **kwargs)

    @property
    def parameters(self) -> dict[str, Any]:
        """Keyword parameters of the plan with their defaults."""
        sig = inspect.signature(self.plan)
        return {n: p.default for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("idg", idg, idg_plan, "Integrated Decision Gradients with adaptive sampling", idg_bound),
        Method("ig", integrated_gradients, integrated_gradients_plan, "Integrated Gradients", integrated_gradients_bound),
        Method("left_ig", left_ig, left_ig_plan, "Left-IG: IG up to 90% of the maximum logit", left_ig_bound),
        Method("guided_ig", guided_ig, guided_ig_plan, "Guided Integrated Gradients", guided_ig_bound),
        Method("agi", agi, agi_plan, "Adversarial Gradient Integration", agi_bound),
    )
}
