"""The Open Inference Protocol's own logic, which both of its doors use (HTTP in :mod:`app.api.routes.v2`, gRPC in
:mod:`app.api.oip_grpc`): the server's and each model's metadata and Triton configuration, the one version, the
body's names, and an inference request run through the service's one call (:func:`run_inference`) into
:class:`Inferred`, which each door then writes in its own form."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from app.api.failures import internal_error
from app.api.oip import (
    BatchLimits,
    ConfigTensor,
    InferRequest,
    MetadataTensor,
    ModelConfig,
    ModelMetadata,
    Output,
    Scalar,
    Tensor,
    bad,
    is_true,
)
from app.api.requests import check_json_types, first_error
from app.core.errors import ApiError
from app.schemas import AttributeCommon, AttributeParams, PredictParams
from app.service import ExplainRequest, Image, PredictRequest, RequestContext, Service
from idg_core.explain import Explanation
from idg_core.postprocess.compose import REGION_POSTPROCESS
from idg_models import ImageClassifier

SERVER_NAME = "idg-service"


EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "statistics"]


MODEL_VERSION = "1"
"""The one version of every model (the service does not version its models): ``/v2/models/{m}/versions/1/...`` is
``/v2/models/{m}/...``, as Triton's clients call it when given ``model_version="1"``."""


CLASSIFY_OUTPUTS = ("probabilities", "predicted_class")


EXPLAIN_OUTPUTS = ("attribution", "target", "curve_alpha", "curve_value", "insertion", "deletion", "regions")


IGNORED_PARAMETERS = ("binary_data_output", "priority", "timeout", "sequence_id", "sequence_start", "sequence_end", "headers")


INLINE_ELEMENTS = 200_000
"""Answers of more numbers than this are written a piece at a time, the event loop serving other requests between pieces."""


RENDER_ONLY = ("model", "top_k", "signed", "outlier_perc", "opacity", "return_heatmap", "return_overlay", "return_attribution",
               "return_input", "visualization", "polarity", "clip_percent_upperbound", "clip_percent_lowerbound", "color_map",
               "outline_share", "overlay_type")
"""/attribute fields that shape its PNGs and JSON, not the explanation: not request parameters here."""


def _platform(model: ImageClassifier) -> str:
    return "pytorch_torchscript" if model.source.startswith("torchscript:") else "pytorch"


def metadata_of(name: str, model: ImageClassifier) -> ModelMetadata:
    s, c = model.preprocessing.crop_size, model.num_classes
    return ModelMetadata(
        name=name, versions=[MODEL_VERSION], platform=_platform(model),
        inputs=[MetadataTensor(name="image", datatype="BYTES", shape=[-1]),
                MetadataTensor(name="input", datatype="FP32", shape=[-1, 3, s, s])],
        outputs=[MetadataTensor(name="probabilities", datatype="FP32", shape=[-1, c]),
                 MetadataTensor(name="predicted_class", datatype="INT64", shape=[-1]),
                 MetadataTensor(name="attribution", datatype="FP32", shape=[-1, 3, s, s]),
                 MetadataTensor(name="target", datatype="INT64", shape=[-1]),
                 MetadataTensor(name="curve_alpha", datatype="FP32", shape=[-1, -1]),
                 MetadataTensor(name="curve_value", datatype="FP32", shape=[-1, -1]),
                 MetadataTensor(name="insertion", datatype="FP32", shape=[-1]),
                 MetadataTensor(name="deletion", datatype="FP32", shape=[-1]),
                 MetadataTensor(name="regions", datatype="INT32", shape=[-1, s, s])],
    )


async def check_version(name: str, version: str) -> None:
    """404 for a version other than :data:`MODEL_VERSION` (the routes under ``/versions/{version}``)."""
    if version != MODEL_VERSION:
        raise ApiError(404, f"model {name!r} has one version, {MODEL_VERSION!r}, not {version!r}: use /v2/models/{name}/versions/"
                       f"{MODEL_VERSION} or /v2/models/{name}", code="not_found")


@dataclass(frozen=True)
class Inferred:
    """An inference request's answer, before it is encoded in a door's form: the model, each image's probabilities and
    explanation, the checked explanation request (None: predictions only), and the outputs asked."""

    key: str
    model: ImageClassifier
    results: list[tuple[torch.Tensor, Explanation | None]]
    checked: ExplainRequest | None
    wanted: list[tuple[str, dict[str, Scalar]]]
    req: InferRequest

    def outputs(self) -> list[tuple[Output, bool]]:
        """The answer's outputs, in the order asked, each with whether it is written in binary."""
        return _outputs(self.model, self.results, self.checked, self.wanted, self.req)

    @property
    def large(self) -> bool:
        """Whether the answer is written a piece at a time (:func:`_large_answer`) rather than at once."""
        return _elements(self.results) > INLINE_ELEMENTS


async def run_inference(service: Service, key: str, model: ImageClassifier, req: InferRequest, tensors: list[Tensor],
                        context: RequestContext) -> Inferred:
    """Check an inference request (outputs, parameters, images) and run each image through the service's one call
    (the HTTP and the gRPC doors of the protocol both answer with this)."""
    wanted = _wanted_outputs(req)
    params, explain = _attribute_params(req, wanted, key)
    call = service.explain_request(params, context) if explain else service.predict_request(PredictParams(model=key, top_k=1), context)
    items = _images(tensors, model)

    async def one(item: Image) -> tuple[torch.Tensor, Explanation | None]:
        if isinstance(call, PredictRequest):
            return await service.probabilities(call, item), None
        found = (await service.explanation(call, item)).found
        return found.probs, found

    try:
        async with asyncio.TaskGroup() as group:  # the first failure cancels the other images' work
            tasks = [group.create_task(one(item)) for item in items]
    except ExceptionGroup as failed:
        raise _first_failure(failed) from None
    return Inferred(key, model, [t.result() for t in tasks], call if isinstance(call, ExplainRequest) else None, wanted, req)


def check_body_names(req: InferRequest, name: str, key: str) -> None:
    """The model and version a body names, where it names them (KServe's ``InferRequest.to_rest`` writes ``model_name``;
    other clients write ``model_version``, often empty), agree with the path: a 400 saying which disagrees otherwise."""
    if req.model_name is not None and req.model_name not in (name, key):
        raise bad(f"the body's model_name {req.model_name!r} disagrees with the path's model {name!r}: name the same model in "
                  "both, or leave model_name out of the body")
    if req.model_version not in (None, "", MODEL_VERSION):
        raise bad(f"the body's model_version {req.model_version!r} is not a version of {name!r}: it has one, "
                  f"{MODEL_VERSION!r} (or leave model_version out of the body)")


def _elements(results: list[tuple[torch.Tensor, Explanation | None]]) -> int:
    """How many numbers the answer may carry (every probability, attribution value and region label)."""
    return sum(p.numel() + (0 if e is None else e.result.attributions.numel() + sum(r.labels.numel() for r in e.result.regions))
               for p, e in results)


TRITON_TYPES = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "INT64": "TYPE_INT64", "INT32": "TYPE_INT32"}


def statistics_of(service: Service, name: str) -> dict[str, Any]:
    """Triton's ``ModelStatistics`` of one served model (its key), as JSON: the submissions its answers counted
    (``inference_count``, one image each) and the model calls the worker ran for it (``execution_count``, one batch
    each: several images share one, an explanation's steps take several)."""
    return service.stats[name].triton(name, MODEL_VERSION, service.metrics.executions.get(name, 0))


def config_of(name: str, model: ImageClassifier, max_batch: int) -> ModelConfig:
    """The model's metadata as Triton's ``ModelConfig``: each tensor's dimensions without the batch's (an ``image``
    is one element per image: ``dims [1]`` reshaped to ``[]``, so a request's shape is ``[N]``)."""
    meta = metadata_of(name, model)

    def tensor(t: MetadataTensor, fmt: str | None = None) -> ConfigTensor:
        reshape: dict[str, list[int]] | None = None if len(t.shape) > 1 else {"shape": []}
        dims = t.shape[1:] if len(t.shape) > 1 else [1]
        return ConfigTensor(name=t.name, data_type=TRITON_TYPES[t.datatype], dims=dims, reshape=reshape, format=fmt)

    return ModelConfig(
        name=name, platform=meta.platform, max_batch_size=max_batch,
        input=[tensor(meta.inputs[0], "FORMAT_NONE"), tensor(meta.inputs[1], "FORMAT_NCHW")],
        output=[tensor(t) for t in meta.outputs],
    )


def _wanted_outputs(req: InferRequest) -> list[tuple[str, dict[str, Scalar]]]:
    """The outputs the request names, each with its parameters ([] when it names none)."""
    if req.outputs is None:
        return []
    names = [o.name for o in req.outputs]
    for n in names:
        if n not in CLASSIFY_OUTPUTS + EXPLAIN_OUTPUTS:
            raise bad(f"unknown output {n!r}; the outputs are {', '.join(CLASSIFY_OUTPUTS + EXPLAIN_OUTPUTS)}")
    if len(set(names)) != len(names):
        raise bad("an output is requested twice")
    for o in req.outputs:
        k = o.parameters.get("classification")
        if k is not None and (o.name != "probabilities" or not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise bad(f"output {o.name!r}: the classification parameter is a count >= 1 on 'probabilities' only, got {k!r}")
    return [(o.name, o.parameters) for o in req.outputs]


def _first_failure(failed: ExceptionGroup[Exception]) -> ApiError:
    """The error a request whose images failed answers: the first :class:`ApiError`, else the first failure as a logged 500."""
    errors = list(failed.exceptions)
    return next((e for e in errors if isinstance(e, ApiError)), None) or internal_error(errors[0], "the inference of /v2/models/{name}")


def _attribute_params(req: InferRequest, wanted: list[tuple[str, dict[str, Scalar]]], model: str) -> tuple[AttributeCommon, bool]:
    """The /attribute parameters of the request (checked as /attribute checks them, 422 naming the
    one that is wrong) and whether an explanation runs."""
    given = {k: v for k, v in req.parameters.items() if k not in IGNORED_PARAMETERS and k != "explain"}
    for k in given:
        if k in RENDER_ONLY or k not in AttributeParams.model_fields:
            raise ApiError(422, f"parameter {k!r} is not an explanation parameter here; the model is the path's, and the outputs "
                           "are chosen by name (see /v2/models/NAME)", code="invalid_parameter")
    asked = any(n in EXPLAIN_OUTPUTS for n, _ in wanted)
    flag = req.parameters.get("explain")
    if flag is not None and not isinstance(flag, bool):
        raise ApiError(422, f"parameter 'explain' must be true or false, got {flag!r}", code="invalid_parameter")
    if flag is False and (asked or given):
        raise ApiError(422, "explain is false, yet the request asks for explanation outputs or parameters", code="invalid_parameter")
    check_json_types(given, AttributeParams, json_said=False)  # true is not target 1, nor "8" steps 8
    try:
        params = AttributeParams.model_validate({**given, "model": model, "top_k": 1, "return_heatmap": False, "return_overlay": False})
    except ValidationError as err:
        raise ApiError(422, first_error(err), code="invalid_parameter") from err
    metrics = {m.strip() for m in (params.faithfulness or "").split(",") if m.strip()}
    for n, _ in wanted:
        if n in ("insertion", "deletion") and n not in metrics:
            raise ApiError(422, f"output {n!r} needs the parameter faithfulness={n} (or insertion,deletion)", code="invalid_parameter")
        if n == "regions" and params.postprocess not in REGION_POSTPROCESS:
            raise ApiError(422, f"output 'regions' needs the parameter postprocess={' or '.join(REGION_POSTPROCESS)} (the map's "
                           f"ranked regions), got postprocess={params.postprocess}", code="invalid_parameter")
    return params, bool(flag) or asked or bool(given)


def batch_limits(service: Service, model: ImageClassifier) -> BatchLimits:
    """What one request to ``model`` may hold (:class:`BatchLimits`), for every door of the protocol."""
    return BatchLimits(service.settings.max_batch_files, 3 * model.preprocessing.crop_size ** 2)


def _images(tensors: list[Tensor], model: ImageClassifier) -> list[bytes | torch.Tensor]:
    """The request's images: encoded files from ``image``, or ``(3, S, S)`` tensors in [0, 1] from ``input`` (their
    count was bounded from the shapes, :class:`BatchLimits`, before their data was read)."""
    if len(tensors) != 1 or tensors[0].name not in ("image", "input"):
        raise bad(f"send exactly one input, 'image' (BYTES) or 'input' (FP32 pixels); got {[t.name for t in tensors]}")
    t = tensors[0]
    n = t.shape[0] if t.shape else 0
    if n < 1:
        raise bad(f"input {t.name!r} holds no image: its shape {t.shape} has no batch dimension of at least 1")
    if t.name == "image":
        if t.datatype != "BYTES" or len(t.shape) != 1:
            raise bad(f"input 'image' must be BYTES of shape [N] (one encoded image file each), got {t.datatype} {t.shape}")
        return list(t.items)
    return list(_pixels(t, model.preprocessing.crop_size))


def _pixels(t: Tensor, size: int) -> torch.Tensor:
    """``input`` as ``(N, 3, S, S)`` float32 in [0, 1]."""
    if t.array is None or t.datatype not in ("FP32", "UINT8"):
        raise bad(f"input 'input' must be FP32 (in [0, 1]) or UINT8 pixels, got {t.datatype}")
    layout = t.parameters.get("layout")
    nchw, nhwc = [t.shape[0], 3, size, size], [t.shape[0], size, size, 3]
    if layout is None:
        layout = "NCHW" if t.shape == nchw else "NHWC" if t.shape == nhwc else None
    if layout not in ("NCHW", "NHWC") or t.shape != (nchw if layout == "NCHW" else nhwc):
        raise bad(f"input 'input' must have the shape {nchw} (NCHW) or {nhwc} (NHWC) for this model, got {t.shape}"
                  + (f" with layout {layout!r}" if "layout" in t.parameters else ""))
    x = t.array.astype(np.float32) / (255.0 if t.datatype == "UINT8" else 1.0)
    if not np.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise bad("input 'input' must hold pixels in [0, 1] (the model normalises them itself), got values from "
                  f"{float(np.nanmin(x)):g} to {float(np.nanmax(x)):g} or not finite")
    pixels = torch.from_numpy(np.ascontiguousarray(x))
    return pixels if layout == "NCHW" else pixels.permute(0, 3, 1, 2).contiguous()


def _rows(rows: list[torch.Tensor]) -> np.ndarray[Any, Any]:
    """Curves of one row each as ``(N, K)`` float32, NaN-padded to the longest."""
    width = max((r.numel() for r in rows), default=0)
    out = np.full((len(rows), width), np.nan, dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, :r.numel()] = r.detach().float().cpu().reshape(-1).numpy()
    return out


def _classification(model: ImageClassifier, probs: np.ndarray[Any, Any], k: int) -> Output:
    """Triton's classification extension: the top ``k`` of each image as ``probability:index:label``."""
    k = min(k, probs.shape[1])
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    items = [f"{probs[i, c]:.6g}:{c}:{model.class_names[c]}".encode() for i in range(len(probs)) for c in top[i]]
    return Output("probabilities", items=items, shape=[len(probs), k])


def _outputs(model: ImageClassifier, results: list[tuple[torch.Tensor, Explanation | None]], checked: ExplainRequest | None,
             wanted: list[tuple[str, dict[str, Scalar]]], req: InferRequest) -> list[tuple[Output, bool]]:
    """The answer's outputs, in the order asked (default: every output this request produced)."""
    probs = np.stack([p.detach().float().cpu().numpy() for p, _ in results])
    found = [e for _, e in results if e is not None]
    made: dict[str, Callable[[], np.ndarray[Any, Any]]] = {
        "probabilities": lambda: probs,
        "predicted_class": lambda: probs.argmax(axis=1).astype(np.int64),
    }
    curve_output = None if checked is None else str(checked.planned.params["output"])  # what the method differentiated
    if found:
        made |= {
            "attribution": lambda: np.stack([e.result.attributions[0].detach().float().cpu().numpy() for e in found]),
            "target": lambda: np.asarray([e.target for e in found], dtype=np.int64),
            "curve_alpha": lambda: _rows([e.result.alphas[0] if e.result.alphas.dim() == 2 else e.result.alphas for e in found]),
            "curve_value": lambda: _rows([e.result.values[0] if e.result.values.dim() == 2 else e.result.values for e in found]),
        }
        if all(e.result.regions for e in found):  # postprocess=xrai or cam_regions: each pixel's region rank, 1 first
            made["regions"] = lambda: np.stack([e.result.regions[0].labels.numpy().astype(np.int32) for e in found])
        for metric in ("insertion", "deletion"):
            if all(metric in e.scores for e in found):
                made[metric] = lambda m=metric: np.asarray([e.scores[m] for e in found], dtype=np.float32)  # type: ignore[misc]
    names = wanted or [(n, {}) for n in made]
    default_binary = is_true(req.parameters.get("binary_data_output"))
    out = []
    for n, p in names:
        k = p.get("classification")  # checked by _wanted_outputs
        tensor = _classification(model, probs, int(k)) if k is not None else Output(n, array=made[n]())
        if n == "curve_value" and curve_output:
            tensor.parameters["output"] = curve_output
            if checked is not None:  # whose path: the photo's, or the first noisy copy's where SmoothGrad pools copies
                tensor.parameters["input"] = "noisy_copy" if checked.planned.options.post.get("smooth_samples") else "photo"
        out.append((tensor, is_true(p["binary_data"]) if "binary_data" in p else default_binary))
    return out
