"""IDG along Expected-Gradients paths: IDG (adaptive sampling, :mod:`idg_core.methods.idg`) run from
``paths`` references drawn as Expected Gradients draws them (:func:`idg_core.methods.eg.reference_images`)
instead of one fixed baseline, and the maps averaged. The paths run in lock-step, so their points
share model calls; the cost is ``paths`` times IDG's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.lockstep import lockstep
from idg_core.methods import idg as _idg
from idg_core.methods._common import Method, method_function
from idg_core.methods.eg import REFERENCES, reference_images
from idg_core.methods.params import Param, Params, output_param
from idg_core.types import AttributionResult, Plan

PARAMS = Params("idg_eg", (
    Param("paths", int, 4, "References, one IDG path from each; the maps are averaged", low=1, step=True),
    Param("steps", int, 16, "M, gradient samples per path", low=2, step=True),
    Param("probe_steps", int, 8, "N, probe points per path", low=3, step=True),
    Param("references", str, "blur", "Where references come from (as Expected Gradients): 'blur' or 'noise'", choices=REFERENCES),
    Param("seed", int, 0, "Seed of the reference draw", low=0),
    output_param("logit"),
))


def idg_eg_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`idg_eg_plan` with ``params``: ``paths`` IDG runs."""
    one = _idg.idg_bound({"steps": params["steps"], "probe_steps": params["probe_steps"], "uniform": False})
    k = int(params["paths"])
    return WorkBound(one.forward * k, one.backward * k)


def idg_eg_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); see :func:`idg_eg`.
    ``baseline`` is not used: the references are drawn."""
    p = PARAMS.validate(params)
    refs = reference_images(x, p["references"], p["paths"], p["seed"])
    plans = [_idg.idg_plan(x, ref, target, steps=p["steps"], probe_steps=p["probe_steps"], output=p["output"]) for ref in refs]
    return _mean(plans)


def _mean(plans: list[Plan]) -> Plan:
    done: list[AttributionResult] = yield from lockstep(plans)  # the paths' points share model calls
    return AttributionResult(attributions=sum(r.attributions for r in done) / len(done),  # type: ignore[arg-type]
                             forward_passes=sum(r.forward_passes for r in done), backward_passes=sum(r.backward_passes for r in done))


idg_eg = method_function("idg_eg", idg_eg_plan, PARAMS, """IDG along Expected-Gradients paths: the mean of IDG maps
from ``paths`` references drawn from the image's blurred copies (or noise). ``baseline`` is ignored.""",
                         uses_baseline=False)

METHOD = Method(idg_eg, idg_eg_plan, PARAMS, idg_eg_bound, "IDG averaged over Expected-Gradients references",
                presets={"fast": {"paths": 4, "probe_steps": 8, "steps": 16}, "paper": {"paths": 4, "probe_steps": 50, "steps": 50},
                         "quality": {"paths": 4, "probe_steps": 8, "steps": 16}})
