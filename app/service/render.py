"""An explanation as the /attribute answer's pieces: base64 PNGs and array (from
:mod:`idg_core.heatmap`) and the output-α curve. CPU work: the service runs it off the event loop."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from app.schemas import AttributeCommon, AttributeResponse, ClassScore, Cost, Faithfulness, OutputCurve, Region, Timings, XraiRegions
from app.service.planning import AttributePlan, post_steps
from app.service.visualization import visual_pngs
from idg_core.explain import Explanation
from idg_core.heatmap import attribution_npy, image_png
from idg_core.types import AttributionResult, Regions
from idg_models import ImageClassifier


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class NonFiniteAttribution(ValueError):
    """The attribution holds a NaN or an infinity: the model's outputs or gradients overflowed."""


def non_finite_message(attr: Tensor) -> str:
    """Why an attribution holding a NaN or an infinity is refused."""
    bad = int((~torch.isfinite(attr)).sum())
    return (f"the attribution is not finite at {bad} of {attr.numel()} values (NaN or infinity): the model's outputs or "
            "gradients overflowed on this image; a model in bf16 may need fp32 (IDG_PRECISION, or precision in the models file)")


def render(x: Tensor, attr: Tensor, params: AttributeCommon, regions: Regions | None = None) -> dict[str, Any]:
    """The images and the optional raw array the request asked for, as base64 response fields, from one image's map
    ``attr (C, H, W)`` on the host (float32), checked finite before (the service's ``_on_host``), and XRAI's
    ``regions`` where the map has them."""
    image = x.detach().float().cpu()
    heatmap, overlay = None, None
    if params.return_heatmap or params.return_overlay:
        heatmap, overlay = visual_pngs(image, attr, params, regions)  # as pixels or outlines (visualization)
    return {
        "input_png": b64(image_png(image)) if params.return_input else None,
        "heatmap_png": None if heatmap is None else b64(heatmap),
        "overlay_png": None if overlay is None else b64(overlay),
        "attribution": _npy(attr) if params.return_attribution else None,
        "regions": None if regions is None else regions_answer(regions, post_steps(params)),
    }


def regions_answer(regions: Regions, post: dict[str, Any]) -> XraiRegions:
    """The answer's ``regions`` (``post``: the post-steps as they took effect, :func:`post_steps`): the rank of each pixel's
    region as a 16-bit PNG and each region's rank, gain and area."""
    source, order = ("xrai", post["xrai_order"]) if post["postprocess"] == "xrai" else ("cam_blobs", "regions_then_pixels")
    labels = regions.labels.numpy().astype(np.uint16)
    out = io.BytesIO()
    Image.fromarray(labels).save(out, format="PNG", compress_level=1)
    pixels = labels.size
    rows = [Region(rank=i + 1, gain=float(g), area=int(a), share=int(a) / pixels)
            for i, (g, a) in enumerate(zip(regions.gains.tolist(), regions.areas.tolist(), strict=True))]
    return XraiRegions(source=source, order=order, labels_png=b64(out.getvalue()), regions=rows)


def _npy(attr: Tensor) -> dict[str, Any]:
    data, dtype = attribution_npy(attr)
    return {"format": "npy", "dtype": dtype, "shape": list(attr.shape), "data": b64(data)}


def curve(result: AttributionResult, output: str, noisy: bool = False, shared_probe: bool = False) -> OutputCurve:
    """The answer's curve; ``output`` ("logit" or "probability") is what the method differentiated,
    so what ``result.values`` holds; ``noisy``: the map pools noisy copies (SmoothGrad, VarGrad), and the
    curve is the first copy's (:func:`idg_core.postprocess.smooth_plan`), which the answer says; ``shared_probe``:
    the copies shared one probe of the photo, whose curve the probe is."""
    def row(t: Tensor) -> list[float]:
        return [float(v) for v in (t[0] if t.dim() == 2 else t).tolist()] if t.numel() else []

    values, probe_values = row(result.values), row(result.probe_values)
    return OutputCurve.model_validate({
        "output": output, "probe_alphas": row(result.probe_alphas), "probe_values": probe_values, "alphas": row(result.alphas),
        "values": values, "importance": row(result.importance), "weights": row(result.weights),
        "probe_logits": probe_values, "logits": values,  # deprecated names, same numbers
        "input": "noisy_copy" if noisy else "photo", "probe_input": "noisy_copy" if noisy and not shared_probe else "photo",
    })


def top_classes(model: ImageClassifier, probs: Tensor, k: int) -> list[ClassScore]:
    """The ``k`` most probable classes, best first."""
    values, idx = probs.topk(min(k, probs.numel()))
    return [ClassScore(index=i, name=model.class_names[i], probability=v) for v, i in zip(values.tolist(), idx.tolist(), strict=True)]


def method_label(params: AttributeCommon, ran: Mapping[str, Any] | None = None) -> str:
    """The method with its post-steps, e.g. ``idg+idgi+smoothgrad`` (a metrics label); ``ran``: the post-steps the plan
    runs (:attr:`AttributePlan.steps_run`), else the request's."""
    post = post_steps(params) if ran is None else ran
    smooth = f"+{post['smooth_kind']}" if post["smooth_samples"] else ""
    return params.method + ("" if post["postprocess"] in (None, "none") else f"+{post['postprocess']}") + smooth


def attribute_response(
    name: str, model: ImageClassifier, params: AttributeCommon, planned: AttributePlan, found: Explanation, precision: str,
    timings: Timings, images: dict[str, Any],
) -> AttributeResponse:
    """The /attribute answer: what was found, with the parameters it ran with and what it cost."""
    target = ClassScore(index=found.target, name=model.class_names[found.target], probability=float(found.probs[found.target]))
    post = planned.steps_run  # as they ran: the curve's input and probe are the plan's, not the request's
    faithfulness = None
    if found.scores:
        faithfulness = Faithfulness(insertion=found.scores.get("insertion"), deletion=found.scores.get("deletion"), steps=found.score_steps)
    return AttributeResponse(
        model=name,
        method=params.method,
        prediction=top_classes(model, found.probs, params.top_k),
        target=target,
        parameters={**planned.used, "target": found.target},
        precision=precision,
        curve=curve(found.result, planned.params["output"], noisy=bool(post["smooth_samples"]),
                    shared_probe=post["smooth_probe"] == "shared"),
        cost=Cost(forward_passes=found.forward_passes, backward_passes=found.backward_passes),
        faithfulness=faithfulness,
        timings=timings,
        **images,
    )
