"""One entry point for a method with its post-steps, composable on any method: IDGI inside (on a
straight-path method), SmoothGrad / VarGrad around it, XRAI's regions or Grad-CAM's blobs or product over the result, and the
evaluation's blur control last."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from idg_core.budget import CAM_POSTPROCESS, postprocess_bound
from idg_core.methods import METHODS
from idg_core.postprocess.blur import blur_plan
from idg_core.postprocess.cam import cam_plan
from idg_core.postprocess.idgi import IDGI_METHODS, idgi_plan
from idg_core.postprocess.rankmix import rankmix_plan, with_idgi
from idg_core.postprocess.smoothgrad import SMOOTH_KINDS, noisy_copies, shared_probe_plan, smooth_plan
from idg_core.postprocess.xrai import XRAI_ORDERS, xrai_plan
from idg_core.types import Plan

# postprocess_bound: from idg_core.budget
__all__ = ["POSTPROCESS", "REGION_POSTPROCESS", "SMOOTH_PROBES", "build_plan", "check_postprocess", "postprocess_bound"]

POSTPROCESS = ("none", "idgi", "rankmix", "xrai", *CAM_POSTPROCESS)
"""The ``postprocess`` values: none; ``idgi`` (:mod:`idg_core.postprocess.idgi`); ``rankmix``, the method's map and its
IDGI map rank-averaged (:mod:`idg_core.postprocess.rankmix`). Both need a straight-path method and no extra pass.
``xrai``: XRAI's ranked regions over any method's map (:mod:`idg_core.postprocess.xrai`; ``xrai_order``), host work only.
``cam_regions`` / ``cam_product``: any method's map ranked within Grad-CAM's blobs / times the CAM
(:mod:`idg_core.postprocess.cam`), Grad-CAM's pass more."""

REGION_POSTPROCESS = ("xrai", "cam_regions")
"""The post-steps whose maps come with ranked regions (:class:`idg_core.types.Regions`: the answers' ``regions``)."""


SMOOTH_PROBES = ("own", "shared")
"""The ``smooth_probe`` values: each noisy copy runs the method's probe on itself (``own``), or the copies share one
probe of the image itself (``shared``: a method with a probe, IDG; its cost counted once)."""


def check_postprocess(method: str, postprocess: str | None, smooth_samples: int, smooth_std: float, smooth_kind: str,
                      smooth_probe: str = "own", params: Mapping[str, Any] | None = None, xrai_order: str = XRAI_ORDERS[0]) -> None:
    """ValueError (one sentence) when the post-steps do not apply (``params``: the method's, every keyword, where known:
    a shared probe needs them to run one)."""
    if postprocess is not None and postprocess not in POSTPROCESS:
        raise ValueError(f"postprocess must be one of {', '.join(POSTPROCESS)}, got {postprocess!r}")
    if xrai_order not in XRAI_ORDERS:
        raise ValueError(f"xrai_order must be one of {', '.join(XRAI_ORDERS)}, got {xrai_order!r}")
    if postprocess in ("idgi", "rankmix") and method not in IDGI_METHODS:
        raise ValueError(f"postprocess={postprocess} needs a path method ({', '.join(IDGI_METHODS)}), got {method!r}")
    if smooth_samples < 0:
        raise ValueError(f"smooth_samples must be >= 0, got {smooth_samples}")
    if smooth_std < 0:
        raise ValueError(f"smooth_std must be >= 0, got {smooth_std}")
    if smooth_kind not in SMOOTH_KINDS:
        raise ValueError(f"smooth_kind must be one of {', '.join(SMOOTH_KINDS)}, got {smooth_kind!r}")
    if smooth_probe not in SMOOTH_PROBES:
        raise ValueError(f"smooth_probe must be one of {', '.join(SMOOTH_PROBES)}, got {smooth_probe!r}")
    if smooth_probe == "shared" and METHODS[method].probe is None:
        raise ValueError(f"smooth_probe=shared needs a method with a probe ({', '.join(m for m in METHODS if METHODS[m].probe)}), "
                         f"got {method!r}")
    if smooth_probe == "shared" and params is not None and METHODS[method].bound(params).probe == 0:
        raise ValueError(f"smooth_probe=shared needs {method}'s probe, which these parameters do not run (uniform=True)")


def build_plan(
    method: str, x: Tensor, baseline: Tensor, target: int, *, postprocess: str | None = None, smooth_samples: int = 0,
    smooth_std: float = 0.15, smooth_kind: str = "smoothgrad", smooth_seed: int = 0, smooth_probe: str = "own",
    blur_sigma: float = 0.0, xrai_order: str = XRAI_ORDERS[0], **kwargs: Any,
) -> Plan:
    """The plan of ``method`` on ``x (C, H, W)`` with IDGI (``postprocess="idgi"``) or RankMix (``"rankmix"``: the map
    and its IDGI map rank-averaged, after SmoothGrad when there is one) and/or SmoothGrad /
    VarGrad over ``smooth_samples`` noisy copies (0: none; ``smooth_probe``: :data:`SMOOTH_PROBES`), then XRAI's regions
    (``"xrai"``, over the photo ``x``, in ``xrai_order``) or Grad-CAM's (``"cam_regions"``, ``"cam_product"``), then the
    map blurred by ``blur_sigma`` pixels (0: not; the evaluation's control). ``kwargs`` go to the method's plan."""
    used = METHODS[method].validate(**kwargs) if smooth_probe == "shared" and smooth_samples > 0 else None
    check_postprocess(method, postprocess, smooth_samples, smooth_std, smooth_kind, smooth_probe, used, xrai_order)
    spec = METHODS[method]
    if blur_sigma:
        inner = build_plan(method, x, baseline, target, postprocess=postprocess, smooth_samples=smooth_samples,
                           smooth_std=smooth_std, smooth_kind=smooth_kind, smooth_seed=smooth_seed, smooth_probe=smooth_probe,
                           xrai_order=xrai_order, **kwargs)
        return blur_plan(inner, blur_sigma)

    def one(xi: Tensor, **sampled: Any) -> Plan:
        plan = spec.plan(xi, baseline, target, **sampled, **kwargs)
        return idgi_plan(plan) if postprocess == "idgi" else with_idgi(plan) if postprocess == "rankmix" else plan

    if smooth_samples == 0:
        plan = one(x)
    else:
        copies = noisy_copies(x, smooth_samples, smooth_std, smooth_seed)
        if used is not None:
            assert spec.probe is not None  # checked above
            plan = shared_probe_plan(spec.probe(x, baseline, target, **kwargs), spec.bound(used).probe,
                                     lambda sampling: [one(xi, sampling=sampling) for xi in copies], smooth_kind)
        else:
            plan = smooth_plan([one(xi) for xi in copies], smooth_kind)
    if postprocess in CAM_POSTPROCESS:
        return cam_plan(plan, x, target, postprocess)
    return rankmix_plan(plan) if postprocess == "rankmix" else xrai_plan(plan, x, xrai_order) if postprocess == "xrai" else plan
