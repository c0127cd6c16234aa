"""From a validated /attribute request to the plan it runs, before any work is queued: the method's
parameters (the request's over the preset's over the method's defaults, checked by the method),
the service's bounds on cost, the post-steps and the faithfulness score. Every refusal is an
:class:`ApiError` 422 that says why."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import Tensor

from app.core.config import Settings
from app.core.errors import ApiError
from app.schemas import AttributeCommon, AttributeParams, PredictExplainParams
from app.service.explain_if import Condition, parse_condition
from idg_core.budget import CAM_PASS, CAM_POSTPROCESS, WorkBound, explanation_bound, postprocess_bound, score_passes
from idg_core.explain import ExplainOptions, Explanation, explain_plan
from idg_core.faithfulness import parse_metrics
from idg_core.methods import METHODS, POST_STEPS, InvalidParameter
from idg_core.paths import resolve_baseline
from idg_core.postprocess.compose import check_postprocess
from idg_core.presets import preset_for, preset_params, preset_post
from idg_core.types import PlanOf
from idg_models import ImageClassifier


def _invalid(message: str) -> ApiError:
    return ApiError(422, message, code="invalid_parameter")


def check_top_k(settings: Settings, k: int) -> None:
    if k > settings.max_top_k:
        raise _invalid(f"top_k must be <= {settings.max_top_k}, got {k}")


def method_params(settings: Settings, params: AttributeCommon, num_classes: int) -> dict[str, Any]:
    """Every parameter the method runs with: the request's, over the preset's, over the method's
    defaults, validated by the method (422 naming what was wrong, or naming the method's
    parameters when the request gave one it does not take), within the service's bounds."""
    method = METHODS[params.method]
    given = params.method_values()
    try:
        method.params.refuse_unknown(given, [p.name for p in method.params if p.service])  # those a request may give
    except InvalidParameter as err:
        raise _invalid(str(err)) from err
    if "seed" in method.params:
        given["seed"] = params.seed
    if "num_classes" in method.params:
        given["num_classes"] = num_classes
    values = preset_params(params.method, params.preset, **given)
    for name in method.params.steps:  # the counts of model passes each method declares (Param.step)
        if isinstance(values.get(name), int) and values[name] > settings.max_steps:
            if name in given:
                raise _invalid(f"{name} must be <= {settings.max_steps}, got {values[name]}")
            # a preset's (or the method's default) count above this server's cap: the cap, as the answer's parameters say
            values[name] = settings.max_steps
    try:
        return method.validate(**values)
    except InvalidParameter as err:
        raise _invalid(str(err)) from err


def work_bound(settings: Settings, params: AttributeCommon, used: dict[str, Any], options: ExplainOptions, size: int) -> WorkBound:
    """The most the method with its post-steps can cost; 422 when the whole explanation of a ``size``-pixel crop (the
    method times its noisy copies, their probe, its prediction pass and faithfulness scores) would cost more model passes
    than ``IDG_MAX_PASSES``: the refusal states that whole bound and what it is made of (it had stated the method's
    passes alone, 520, for a request of 32,777 passes)."""
    limit = settings.max_passes or 4 * settings.max_steps
    method = METHODS[params.method]
    alone = method.bound(used)
    bound = postprocess_bound(alone, options.post)
    whole = explanation_bound(bound, options.metrics, size, size, options.steps, predict=True).forward
    if whole > limit:
        raise _invalid(over_limit(params.method, alone, options, size, whole, limit))
    return bound


def over_limit(method: str, alone: WorkBound, options: ExplainOptions, size: int, whole: int, limit: int) -> str:
    """The refusal of an explanation of ``whole`` model passes over ``limit``: the whole bound, what to lower, and its
    parts (``alone``: the method's bound without its post-steps), which add up to ``whole``."""
    counts = [p.name for p in METHODS[method].params if p.step]
    copies = max(1, int(options.post.get("smooth_samples") or 0))
    if copies > 1:
        counts.append("smooth_samples")
    if options.metrics:
        counts.append("faithfulness_steps")
    if copies == 1:
        parts = [f"{alone.forward} for the method"]
    elif options.post.get("smooth_probe") == "shared":
        parts = [f"{alone.forward - alone.probe} for each of {copies} noisy copies", f"{alone.probe} for their shared probe"]
    else:
        parts = [f"{alone.forward} for each of {copies} noisy copies"]
    if options.post.get("postprocess") in CAM_POSTPROCESS:
        parts.append(f"{CAM_PASS.forward} for {options.post['postprocess']}'s Grad-CAM")
    parts.append("1 for the prediction")
    if options.metrics:
        parts.append(f"{score_passes(options.metrics, size, size, options.steps)} for faithfulness="
                     f"{','.join(options.metrics)} in {options.steps} steps")
    lower = " or ".join([", ".join(counts[:-1]), counts[-1]] if len(counts) > 1 else counts)
    return (f"{method} may cost up to {whole} model passes, more than the limit of {limit}: lower {lower} "
            f"({', '.join(parts[:-1])} and {parts[-1]})")


def post_steps(params: AttributeCommon) -> dict[str, Any]:
    """``postprocess`` and ``smooth_*`` as they take effect: the request's, over its preset's, over the defaults."""
    given = {k: getattr(params, k) for k in POST_STEPS if k in params.model_fields_set}
    defaults = {k: AttributeCommon.model_fields[k].default for k in POST_STEPS}
    return {**defaults, **preset_post(params.method, params.preset), **given}


def explain_options(settings: Settings, params: AttributeCommon, model: ImageClassifier, used: dict[str, Any]) -> ExplainOptions:
    """The post-steps and faithfulness score a request asks for (422 when they do not apply; ``used``: the method's
    parameters, :func:`method_params`)."""
    chosen = post_steps(params)
    if (chosen["smooth_probe"] == "shared" and "smooth_probe" not in params.model_fields_set
            and METHODS[params.method].bound(used).probe == 0):  # a preset's shared probe, and the request runs none
        chosen["smooth_probe"] = "own"  # (uniform=true): each copy runs as asked; the answer's parameters say so
    post: dict[str, Any] = {}
    if chosen["postprocess"] not in (None, "none"):  # idgi, rankmix, xrai, cam_regions or cam_product, checked below
        post["postprocess"] = chosen["postprocess"]
    if chosen["postprocess"] == "xrai":
        post["xrai_order"] = chosen["xrai_order"]
    elif "xrai_order" in params.model_fields_set:  # silently ignored, it would read as taken
        raise _invalid(f"xrai_order orders XRAI's regions: it needs postprocess=xrai, got postprocess={chosen['postprocess'] or 'none'}")
    if chosen["smooth_samples"]:
        post |= {k: chosen[k] for k in ("smooth_samples", "smooth_std", "smooth_kind", "smooth_probe")} | {"smooth_seed": params.seed}
    try:
        check_postprocess(params.method, chosen["postprocess"], chosen["smooth_samples"], chosen["smooth_std"], chosen["smooth_kind"],
                          chosen["smooth_probe"] if chosen["smooth_samples"] else "own", used, chosen["xrai_order"])
        metrics = parse_metrics(params.faithfulness)
    except ValueError as err:
        raise _invalid(str(err)) from err
    p = model.preprocessing
    return ExplainOptions(post, metrics, params.faithfulness_steps or settings.faithfulness_steps, tuple(p.mean), tuple(p.std))


@dataclass(frozen=True)
class AttributePlan:
    """What the service submits for one /attribute request."""

    params: dict[str, Any]
    """The method's parameters, as it runs them."""
    used: dict[str, Any]
    """Every parameter of the request that took effect (the answer's ``parameters``)."""
    options: ExplainOptions
    bound: WorkBound
    """The most the method with its post-steps can cost."""
    mean: tuple[float, ...]
    """The model's normalisation mean: the ``mean`` baseline."""
    alone: bool = False
    """Its model calls hold no other request's rows (a method that is not batch-invariant: Guided IG)."""

    def plan(self, x: Tensor, params: AttributeCommon, probs: Tensor | None = None) -> PlanOf[Explanation]:
        """The plan on ``x (C, H, W)``; with ``probs`` known (from /predict) it skips the prediction pass."""
        baseline = resolve_baseline(params.baseline, x.unsqueeze(0), self.mean)[0]
        return explain_plan(x, baseline, params.target, params.method, self.params, self.options, probs)

    @property
    def steps_run(self) -> dict[str, Any]:
        """The post-steps as they run (``options.post``), every keyword :func:`post_steps` has, its defaults where none
        runs: what the answer and its metrics describe, which may differ from the request's (a preset's base on a model
        without Grad-CAM's layer; each copy's own probe where the request runs none)."""
        defaults = {k: AttributeCommon.model_fields[k].default for k in POST_STEPS}
        return defaults | {k: v for k, v in self.options.post.items() if k in POST_STEPS}

    def cost(self, x: Tensor, probs: Tensor | None = None) -> float:
        """The plan's work units at most (its queue cost): :func:`idg_core.budget.explanation_bound`."""
        o = self.options
        return explanation_bound(self.bound, o.metrics, x.shape[-2], x.shape[-1], o.steps, predict=probs is None).units


def answered_preset(params: AttributeCommon) -> str | None:
    """The preset an answer names: the one the request named; else the default, unless the request's own values
    replaced one the default sets (``steps=50`` or ``smooth_samples=0`` alone is not the fast preset): then None, no preset."""
    if "preset" in params.model_fields_set:
        return params.preset
    given = set(params.method_values()) | {k for k in POST_STEPS if k in params.model_fields_set}
    overridden = given & set(METHODS[params.method].preset_values(params.preset))
    return None if overridden else params.preset


def plan_attribute(settings: Settings, params: AttributeCommon, model: ImageClassifier) -> AttributePlan:
    """Check an /attribute request against ``model`` (no image needed) and resolve what it runs."""
    if params.target is not None and params.target >= model.num_classes:
        raise _invalid(f"target must be < {model.num_classes} (the model's classes), got {params.target}")
    check = METHODS[params.method].check_model
    if check is not None:  # the CAM family: a model without a spatial feature layer (a vision transformer)
        try:
            check(model)
        except ValueError as err:
            raise _invalid(f"{params.method} cannot explain model {model.name!r}: {err}") from err
    cam_check = METHODS["gradcam"].check_model
    named = answered_preset(params)
    if cam_check is not None and "postprocess" not in params.model_fields_set:
        # a preset's Grad-CAM step on a model without its layer: the preset's base runs, and the answer names it (or no
        # preset, as it would have, where the request's own values replaced one the preset sets)
        ran = preset_for(params.method, params.preset, partial(cam_check, model))
        if ran != params.preset:
            params = params.model_copy(update={"preset": ran})
            named = ran if named is not None else None
    kwargs = method_params(settings, params, model.num_classes)
    options = explain_options(settings, params, model, kwargs)
    if options.post.get("postprocess") in CAM_POSTPROCESS and cam_check is not None:  # Grad-CAM's layer, as method=gradcam's
        try:
            cam_check(model)
        except ValueError as err:
            raise _invalid(f"postprocess={options.post['postprocess']} cannot explain model {model.name!r}: {err}") from err
    bound = work_bound(settings, params, kwargs, options, model.preprocessing.crop_size)
    # None: not used (AGI's explicit classes); nor a parameter the others make inert (IDG's probe with uniform=true)
    used = {k: v for k, v in METHODS[params.method].params.in_effect(kwargs).items() if v is not None}
    used |= {"baseline": params.baseline, "preset": named, **options.post}
    if options.metrics:
        used |= {"faithfulness": ",".join(options.metrics), "faithfulness_steps": options.steps}
    return AttributePlan(kwargs, used, options, bound, tuple(model.preprocessing.mean), not METHODS[params.method].batch_invariant)


def plan_explain_if(params: PredictExplainParams) -> tuple[Condition | None, AttributeCommon | None]:
    """A /predict request's condition and the /attribute request it makes when the condition holds
    (None, None without ``explain_if``); 422 for a condition or score option that does not parse."""
    try:
        condition = parse_condition(params.explain_if) if params.explain_if is not None else None
        parse_metrics(params.faithfulness)
    except ValueError as err:  # ConditionError included
        raise _invalid(str(err)) from err
    if condition is None:
        return None, None
    explain = AttributeParams.model_validate({"model": params.model, "top_k": params.top_k, "method": params.method,
                                              "preset": params.preset, "faithfulness": params.faithfulness})
    return condition, explain
