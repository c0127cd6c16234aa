"""What every method shares: its registry entry (:class:`Method`, declared in the method's own file),
and turning a per-image plan into a batched public function."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from idg_core._validation import check_int, prepare_batch
from idg_core.budget import CAM_POSTPROCESS, WorkBound
from idg_core.call_shapes import CallShapes
from idg_core.methods.params import Params
from idg_core.model_calls import CallStats, default_batch_size, run_plans
from idg_core.paths import allocate_samples, place_samples, probe_alphas
from idg_core.types import Answer, AttributionResult, BaselineLike, Model, Output, Plan, Query

PlanFactory = Callable[..., Plan]

Preset = Literal["balanced", "fast", "paper", "quality"]
"""Named settings every method declares (:attr:`Method.presets`); :mod:`idg_core.presets` says how they were chosen."""
PRESET_NAMES: tuple[str, ...] = get_args(Preset)
DEFAULT_PRESET: Preset = "balanced"
PRESET_BASE: dict[str, str] = {"balanced": "fast"}
"""The preset a method runs in place of one it does not declare (``balanced`` is IDG's: the other methods run their
``fast``), and in place of one whose Grad-CAM post-step the model cannot take (no spatial feature layer: a vision
transformer); a preset not here falls to the method's defaults."""
POST_STEPS = ("postprocess", "smooth_samples", "smooth_std", "smooth_kind", "smooth_probe", "xrai_order")
"""Keywords of :func:`idg_core.postprocess.build_plan` a preset may set beside the method's parameters."""


@dataclass(frozen=True)
class Method:
    """Everything about one method, declared in its file (``METHOD = Method(...)``) and listed once
    in :data:`idg_core.methods.METHODS`: the library, the service, the page and the evaluation read
    it from there. Call it like the function.

    ``plan`` builds the per-image plan; ``params`` declares its keyword parameters (those with
    ``step=True`` count model passes); ``bound`` gives the most a plan can cost from its parameters
    (every keyword), before it runs; ``presets`` maps each preset name to the values it sets (the
    method's parameters, and possibly post-steps: :data:`POST_STEPS`); a preset a
    method does not list runs its defaults. ``straight_path``: its gradients lie on one straight path
    ``x' + α (x - x')`` (IDGI applies). ``batch_invariant``: False where the answer follows the last bits of the
    gradients (Guided IG ranks them), which change with the size of the model call: the service then runs the
    method's model calls alone, sized by its own rows, so a request's map does not depend on what else runs."""

    function: Callable[..., AttributionResult]
    plan: Callable[..., Plan]
    params: Params
    bound: Callable[[Mapping[str, Any]], WorkBound]
    summary: str
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    straight_path: bool = False
    batch_invariant: bool = True
    probe: Callable[..., Any] | None = None
    """The method's probe alone (a plan whose result ``plan(..., sampling=)`` takes), for SmoothGrad's noisy copies to
    share (``smooth_probe="shared"``); None: the method has none."""
    check_model: Callable[[Model], None] | None = None
    """A check of the model a request names, before anything runs: a ``ValueError`` saying why the method cannot explain
    it (the CAM family: a model without a spatial feature layer, a vision transformer); the service answers 422."""

    def __post_init__(self) -> None:
        for preset, values in self.presets.items():
            if preset not in PRESET_NAMES:
                raise TypeError(f"{self.name}: unknown preset {preset!r}; presets are {', '.join(PRESET_NAMES)}")
            own = {k: v for k, v in values.items() if k not in POST_STEPS}
            self.params.validate(own)  # a preset that sets an unknown or bad value fails at import, not per request
            post = values.get("postprocess", "none")
            if post not in ("none", "idgi", "rankmix", *CAM_POSTPROCESS) or (post in ("idgi", "rankmix") and not self.straight_path):
                raise TypeError(f"{self.name}: preset {preset!r} sets postprocess={values['postprocess']!r}, which does not apply")
            if not isinstance(values.get("smooth_samples", 0), int) or values.get("smooth_samples", 0) < 0:
                raise TypeError(f"{self.name}: preset {preset!r} sets smooth_samples={values['smooth_samples']!r}")

    @property
    def name(self) -> str:
        return self.params.method

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

    def preset_values(self, name: str) -> dict[str, Any]:
        """Everything preset ``name`` sets: the method's declaration, else its :data:`PRESET_BASE`'s, else nothing (the
        method's defaults)."""
        if name not in PRESET_NAMES:
            raise ValueError(f"preset must be one of {', '.join(PRESET_NAMES)}; got {name!r}")
        if name not in self.presets and name in PRESET_BASE:
            return self.preset_values(PRESET_BASE[name])
        return dict(self.presets.get(name, {}))

    def preset(self, name: str) -> dict[str, Any]:
        """The method parameters preset ``name`` sets (empty: the method's defaults)."""
        return {k: v for k, v in self.preset_values(name).items() if k not in POST_STEPS}

    def preset_post(self, name: str) -> dict[str, Any]:
        """The post-steps preset ``name`` adds (keywords of :func:`idg_core.postprocess.build_plan`)."""
        return {k: v for k, v in self.preset_values(name).items() if k in POST_STEPS}


def run_method(
    plan: PlanFactory,
    model: Model,
    x: Tensor,
    baseline: BaselineLike,
    target: int | Tensor | Iterable[int],
    batch_size: int | None,
    stats: CallStats | None = None,
    shapes: CallShapes | None = None,
    **params: Any,
) -> AttributionResult:
    """Validate, build one plan per image and drive them all through shared model calls
    (``batch_size`` None: :func:`default_batch_size` of the input's device; ``shapes``: fixed call sizes and
    their CUDA graphs, :func:`idg_core.model_calls.evaluate_queries`)."""
    preprocessing = getattr(model, "preprocessing", None)  # an ImageClassifier's: its "mean" baseline
    x, base, targets = prepare_batch(x, baseline, target, getattr(preprocessing, "mean", None))
    check_eval_mode(model)
    batch_size = default_batch_size(x.device) if batch_size is None else batch_size
    check_int("batch_size", batch_size, 1)
    plans = [plan(x[i], base[i], targets[i], **params) for i in range(x.shape[0])]
    result = AttributionResult.concat(run_plans(model, plans, batch_size, stats, shapes))
    if not bool(torch.isfinite(result.attributions).all()):  # a model whose logits are NaN would answer a NaN map
        raise ValueError(NOT_FINITE)
    return result


NOT_FINITE = ("the model's output or its gradient is not finite (NaN or infinite) on this input, so neither is the "
              "attribution: check the model (and run it in float32 if a lower precision overflowed)")

TRAINING_DEPENDENT = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.instancenorm._InstanceNorm,  # noqa: SLF001
                      torch.nn.modules.dropout._DropoutNd, torch.nn.AlphaDropout)
"""Modules whose answers change in training mode (batch statistics, random dropping)."""


def check_eval_mode(model: Model) -> None:
    """A ``ValueError`` for a model with batch norm or dropout left in training mode: its attributions would depend on
    the batch size and differ from run to run, and its batch-norm statistics would change."""
    if not isinstance(model, torch.nn.Module):
        return
    training = [name or type(m).__name__ for name, m in model.named_modules() if m.training and isinstance(m, TRAINING_DEPENDENT)]
    if training:
        raise ValueError(f"the model is in training mode ({', '.join(training[:3])}{', ...' if len(training) > 3 else ''} "
                         "answer by batch statistics or drop at random): call model.eval() first")


def method_function(
    name: str, plan: PlanFactory, params: Params, doc: str, *, uses_baseline: bool = True,
) -> Callable[..., AttributionResult]:
    """The public, batched function of a method: ``name(model, x, baseline, target, *, <params>,
    batch_size=None, stats=None)``. Its signature (as ``help`` and ``inspect`` show it) and the
    ``Args`` of its docstring come from ``params``; ``doc`` is the formula and what it means.
    ``uses_baseline`` False: the method has no baseline, and ``baseline`` may be None."""

    def function(
        model: Model, x: Tensor, baseline: BaselineLike | None, target: int | Tensor | Iterable[int], *,
        batch_size: int | None = None, stats: CallStats | None = None, shapes: CallShapes | None = None, **kwargs: Any,
    ) -> AttributionResult:
        if baseline is None:
            if uses_baseline:
                raise ValueError(f"{name} needs a baseline: 'black', 'mean', a number or a tensor")
            baseline = "black"  # unused by the method, but the batch checks want one
        return run_method(plan, model, x, baseline, target, batch_size, stats, shapes, **kwargs)

    function.__name__ = function.__qualname__ = name
    function.__module__ = plan.__module__
    function.__signature__ = params.signature(inspect.signature(function))  # type: ignore[attr-defined]
    shared = ("    batch_size: most images per model call, >= 1 (default: 8 on CPU, 128 on CUDA); the points of all images are pooled.\n"
              "    stats: a CallStats that counts the model calls and passes.\n"
              "    shapes: a CallShapes: calls padded to its fixed sizes, each replaying its CUDA graph where one was captured\n"
              "        (idg_models.cuda_graphs.graphed_shapes).")
    function.__doc__ = f"{doc.strip()}\n\nArgs:\n{params.doc()}\n{shared}\n"
    return function


def adaptive_samples(
    baseline: Tensor, diff: Tensor, target: int, steps: int, probe_steps: int, placement: str, output: Output,
) -> Generator[list[Query], list[Answer], tuple[Tensor, Tensor, Tensor, Tensor]]:
    """IDG's adaptive sampling as a plan fragment (``yield from`` it): probe the path at
    ``probe_steps`` uniform points (forward only), allocate ``steps`` samples by slope and place
    them. Returns ``(alphas, weights, probe_alphas, probe_values)``."""
    pa = probe_alphas(probe_steps)
    (probe,) = yield [Query.path(baseline, diff, pa, target, grad=False, output=output, label="probe")]
    values = probe.values.detach().to("cpu", torch.float64)  # on a GPU the probe's one wait for the device
    alphas, weights = place_samples(allocate_samples(values, steps), probe_steps, placement)
    return alphas, weights, pa, values
