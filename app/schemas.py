"""Request and response bodies; their field descriptions are the OpenAPI docs at /docs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, create_model

from idg_core.heatmap import COLORMAPS
from idg_core.methods import METHODS, Param
from idg_core.methods.params import SEED_MAX
from idg_core.presets import DEFAULT_PRESET, Preset

if TYPE_CHECKING:
    MethodName = str
    ColourMapName = str
else:
    MethodName = Literal[tuple(METHODS)]
    """The registry's method names (:data:`idg_core.methods.METHODS`): a request for another is a 422."""
    ColourMapName = Literal[COLORMAPS]
    """The heatmap's colour maps (:data:`idg_core.heatmap.COLORMAPS`), Vertex AI's among them."""


class PredictParams(BaseModel):
    """Form fields of POST /predict (multipart), or JSON keys beside ``image``."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model: str | None = Field(None, description="Model name from GET /models; default: the first loaded model")
    top_k: int = Field(5, ge=1, description="How many classes to return, best first")


class AttributeCommon(PredictParams):
    """The fields of POST /attribute that every method shares; the methods' own parameters are
    added from their declarations (:func:`method_fields`) to make :data:`AttributeParams`."""

    method: MethodName = Field("idg", description="Attribution method: " + ", ".join(f"{n} ({m.summary})" for n, m in METHODS.items()))
    target: int | None = Field(None, ge=0, description="Class index to explain; default: the predicted class")
    preset: Preset = Field(DEFAULT_PRESET, description="Cost preset: 'balanced' (the default; for IDG 8 probe / 16 main steps "
                           "over 2 noisy copies sharing the probe, times Grad-CAM's map, 42 passes with the prediction: first or "
                           "tied on all five faithfulness metrics against AGI, IDG-50/50, Spectral IG and Grad-CAM on sample "
                           "photos; 'fast' where the model has no layer Grad-CAM can read), 'fast' (IDG 8 probe / 16 main alone, "
                           "25 passes), 'paper' (the paper's 50 steps) or 'quality' (IDG fast + RankMix + SmoothGrad over "
                           f"{METHODS['idg'].presets['quality']['smooth_samples']} noisy copies); GET /models lists what each "
                           "sets, costs and where it stands. Explicit steps / probe_steps / max_iter / postprocess / smooth_* "
                           "override it. The other methods run their own presets ('balanced': their 'fast')")
    baseline: Literal["mean", "black"] = Field(
        "mean", description="Path start: 'mean' (the model's normalisation mean, zero in its normalised space as in the authors' "
        "code and the evaluation: the ImageNet mean colour for ImageNet-normalised models, grey for EfficientNet-Lite) or 'black'")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="Seed of the random draws: AGI's adversarial classes and SmoothGrad's "
                      "noise; 0 to 2**53 - 1 (the largest integer every JSON client keeps exact; torch.Generator takes up to 2**64 - 1)")
    signed: bool = Field(False, description="Heatmap of the signed channel sum (diverging colours) instead of its magnitude")
    outlier_perc: float = Field(
        2.0, ge=0, lt=100, description="Heatmap scaling: share of the attribution mass clipped as outliers (Captum's convention)")
    opacity: float = Field(0.6, ge=0, le=1, description="Overlay: largest blend weight of the heatmap over the photo")
    visualization: Literal["pixels", "outlines"] = Field(
        "pixels", description="What the heatmap and overlay show (Vertex AI's type, docs/methods/visualization.md): 'pixels', "
        "each pixel's attribution in colour; 'outlines', the outlines of the top regions covering outline_share of the image: "
        "XRAI's regions with postprocess=xrai, Grad-CAM's blobs with cam_regions, else the map's strongest pixels (smoothed) "
        "as connected blobs")
    polarity: Literal["positive", "negative", "both"] | None = Field(
        None, description="Which attributions to show, of the channel sum Σ_c a_c (Vertex AI's polarity): 'positive' (for the "
        "class), 'negative' (against it), 'both' (as signed=true); unset: the magnitude Σ_c |a_c| (signed=true: the signed sum)")
    clip_percent_upperbound: float | None = Field(
        None, gt=0, le=100, description="Percentile of the shown map's magnitudes from which the colour is full (Vertex AI's; "
        "it uses 99.9); either clip_percent_* replaces outlier_perc's scaling; unset while the other is given: 100")
    clip_percent_lowerbound: float | None = Field(
        None, ge=0, lt=100, description="Percentile of the shown map's magnitudes at and below which nothing is shown (Vertex "
        "AI's; it uses 62 for IG, 70 for XRAI); unset while the other is given: 0")
    color_map: ColourMapName | None = Field(
        None, description="Colour map of the heatmap: inferno, viridis, gray, coolwarm, or Vertex AI's pink_green, red, green, "
        "red_green, pink_white_green; the two-sided ones (coolwarm, pink_green, red_green, pink_white_green) show negative "
        "values on their first half, the others the magnitude; unset: inferno, coolwarm for both signs")
    overlay_type: Literal["original", "grayscale", "mask_black", "none"] = Field(
        "original", description="What overlay_png draws over (Vertex AI's overlay_type): 'original', the photo; 'grayscale', "
        "the photo in grey so the colours stand out; 'mask_black', the photo itself kept where the map is strong and black "
        "where it is not (no colours); 'none', the heatmap alone")
    outline_share: float = Field(
        0.3, gt=0, le=1, description="With visualization=outlines: the share of the image the outlined regions cover, at most "
        "(XRAI's first regions; at least the first) or exactly (the strongest pixels); 0.3, the top 30 % Vertex AI's XRAI "
        "default (clip_percent_lowerbound 70) shows")
    return_heatmap: bool = Field(True, description="Return the heatmap PNG (base64)")
    return_overlay: bool = Field(True, description="Return the heatmap over the input as a PNG (base64)")
    return_attribution: bool = Field(False, description="Return the raw (C, H, W) attribution as a base64 .npy "
                                     "(float16 when it keeps every value to float16's precision, else float32)")
    return_input: bool = Field(False, description="Return the model-size input image as a PNG (to layer the heatmap over it)")
    faithfulness: str | None = Field(None, description="Score the returned map: 'insertion', 'deletion' or 'insertion,deletion' "
                                     "(RISE AUCs in [0, 1]); costs steps + 1 forward passes per metric (2 x 29 at the default 28 steps)")
    faithfulness_steps: int | None = Field(
        None, ge=1, le=224, description="Steps of the faithfulness games; default IDG_FAITHFULNESS_STEPS (28)")
    postprocess: Literal["none", "idgi", "rankmix", "xrai", "cam_regions", "cam_product"] = Field(
        "none", description="'idgi': IDGI (Yang et al. 2023) on the path of idg, ig or left_ig, from the same outputs and "
        "gradients; 'rankmix': the method's map and its IDGI map rank-averaged (a rank score per pixel, not additive), "
        "IDGI's gains without its deletion loss; 'xrai': XRAI (Kapishnikov et al. 2019) over any method's map, its ranked "
        "regions in the answer's `regions` (see xrai_order); these cost no extra model pass. 'cam_regions': any method's "
        "pixels ranked within Grad-CAM's blobs (a rank score); 'cam_product': the map times Grad-CAM's, scaled to [0, 1] "
        "(as Guided Grad-CAM); each costs Grad-CAM's 1 forward + 1 backward pass more and a model with a CAM layer")
    xrai_order: Literal["regions_then_pixels", "regions"] = Field(
        "regions_then_pixels", description="With postprocess=xrai, how the map ranks pixels: 'regions_then_pixels', by region "
        "and inside each region in the method's own order (keeps deletion); 'regions', by region alone (plain XRAI); "
        "given without postprocess=xrai: a 422")
    smooth_samples: int = Field(0, ge=0, le=64, description="SmoothGrad / VarGrad over this many noisy copies (0: off); costs "
                                "this many times the method's passes, pooled into the same model calls")
    smooth_std: float = Field(0.15, ge=0, le=1, description="Standard deviation of the SmoothGrad noise in pixel units (images in [0, 1])")
    smooth_kind: Literal["smoothgrad", "vargrad"] = Field(
        "smoothgrad", description="Pool the noisy copies' maps by mean (smoothgrad) or variance (vargrad)")
    smooth_probe: Literal["own", "shared"] = Field(
        "own", description="'shared': the noisy copies share one probe of the image itself (idg: its probe paid once, "
        "the copies sample where the image's own output moves); 'own': each copy probes its own path")

    def method_values(self) -> dict[str, Any]:
        """The method parameters this request gave explicitly (the others take the preset's or
        the method's defaults)."""
        return {k: getattr(self, k) for k in METHOD_FIELDS if k in self.model_fields_set}


_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def method_parameters(max_steps: int | None = None) -> dict[str, list[MethodParameter]]:
    """The parameters of each method that a request may give, from their declarations; a step count's
    ``maximum`` is ``max_steps`` (the server's ``IDG_MAX_STEPS``, as its OpenAPI schema states) where the
    declaration sets none."""
    return {
        m.name: [
            MethodParameter(name=p.name, type=_JSON_TYPES[p.kind], default=p.default, minimum=p.low,
                            exclusive_minimum=p.low_open, maximum=max_steps if p.step and p.high is None else p.high,
                            choices=list(p.choices), description=p.help)
            for p in m.params if p.service
        ]
        for m in METHODS.values()
    }


def method_fields() -> dict[str, Any]:
    """One optional request field per method parameter the service exposes (``Param.service``),
    from the methods' declarations: its type, its choices, its documented range and, per method,
    its meaning and default. The ranges are checked by the method's own validation (a 422 that
    names the method and says why), not here, so they are stated once."""
    uses: dict[str, list[tuple[str, Param]]] = {}
    for method in METHODS.values():
        for p in method.params:
            if p.service and p.name not in AttributeCommon.model_fields:
                uses.setdefault(p.name, []).append((method.name, p))
    fields: dict[str, Any] = {}
    for name, declared in uses.items():
        kinds = {p.kind for _, p in declared}
        if len(kinds) != 1:  # one request field per name: the methods must agree on its type
            raise TypeError(f"method parameter {name!r} has different types across methods: {kinds}")
        kind = kinds.pop()
        annotation: Any = kind
        if kind is str:
            annotation = Literal[tuple(dict.fromkeys(c for _, p in declared for c in p.choices))]
        schema: dict[str, Any] = {}
        lows, highs = [p.low for _, p in declared], [p.high for _, p in declared]
        if kind in (int, float) and None not in lows:
            schema["exclusiveMinimum" if all(p.low_open for _, p in declared) else "minimum"] = min(lows)  # type: ignore[type-var]
        if kind in (int, float) and None not in highs:
            schema["maximum"] = max(highs)  # type: ignore[type-var]
        owners = ", ".join(m for m, _ in declared)
        text = " | ".join(f"{m}: {p.describe()}" for m, p in declared)
        description = f"Only for {owners}; default: the preset's, else the method's. {text}"
        fields[name] = (annotation | None, Field(None, description=description, json_schema_extra=schema or None))
    return fields


AttributeParams: type[AttributeCommon] = create_model(
    "AttributeParams", __base__=AttributeCommon, __doc__="Form fields of POST /attribute (multipart), or JSON keys beside ``image``.",
    **method_fields(),
)
METHOD_FIELDS = tuple(k for k in AttributeParams.model_fields if k not in AttributeCommon.model_fields)
"""The request fields that are method parameters: a request may give only those of its method."""


EXPLAIN_IF_PATTERN = r"\S"
"""What JSON Schema says of an ``explain_if`` condition: not blank (a blank one is a 422, the condition is empty; in a form
an empty field is not given). Its grammar is the parser's (:mod:`app.service.explain_if`), in the field's description."""


class ImageJSON(BaseModel):
    image: str = Field(..., description="The image file, base64 (a data: URL prefix is accepted)")


class PredictExplainParams(PredictParams):
    """Form fields of POST /predict: the prediction, and an explanation when ``explain_if`` holds."""

    explain_if: str | None = Field(None, description="Explain the prediction only when this holds, e.g. 'confidence < 0.6 or "
                                   "class in 3,17,207': confidence, margin (top-1 minus top-2), entropy (nats) compared with "
                                   "< <= > >= == !=, 'class in' a list, joined with and / or and parentheses",
                                   json_schema_extra={"pattern": EXPLAIN_IF_PATTERN})
    method: MethodName = Field("idg", description="Method of the explanation when explain_if holds")
    preset: Preset = Field(DEFAULT_PRESET, description="Cost preset of the explanation when explain_if holds")
    faithfulness: str | None = Field(None, description="Score the explanation: insertion, deletion or both (see /attribute)")


class PredictJSON(ImageJSON, PredictExplainParams):
    """JSON body of POST /predict."""


AttributeJSON = cast(type[ImageJSON], create_model(
    "AttributeJSON", __doc__="JSON body of POST /attribute.",
    __base__=(ImageJSON, AttributeParams),
))


class ClassScore(BaseModel):
    index: int = Field(..., description="Class index")
    name: str = Field(..., description="Class name")
    probability: float = Field(..., description="Softmax probability")


class Timings(BaseModel):
    queued_ms: float = Field(..., description="From admission until the worker started the request")
    compute_ms: float = Field(..., description="From start in the worker until its result")
    render_ms: float = Field(0.0, description="Encoding PNGs and arrays (off the worker)")
    total_ms: float = Field(..., description="From receiving the request to sending the answer")


class PredictResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model: str = Field(..., description="Model that answered")
    top_k: list[ClassScore] = Field(..., description="Best classes, most probable first")
    timings: Timings = Field(..., description="Where the time of this request went, in milliseconds")
    explained: bool | None = Field(None, description="Whether explain_if held (null when none was given)")
    explanation: AttributeResponse | None = Field(None, description="The /attribute body for the predicted class, when explain_if held")


class OutputCurve(BaseModel):
    """The output-α curve: F along the path x' + α(x - x') for the target class, where F is the
    target's logit or its softmax probability (``output``: the method's choice)."""

    output: Literal["logit", "probability"] = Field(..., description="What F is: the target class's logit (idg, ig, left_ig) or its "
                                                    "softmax probability (guided_ig, agi, spectral_ig, as their authors' code)")
    probe_alphas: list[float] = Field(..., description="IDG's uniform probe positions α_k (empty for other methods)")
    probe_values: list[float] = Field(..., description="F (see `output`) at each probe position")
    alphas: list[float] = Field(..., description="Sample positions α_j where gradients were taken")
    values: list[float] = Field(..., description="F (see `output`) at each sample")
    importance: list[float] = Field(..., description="IDG importance factor dF/dα at each sample")
    weights: list[float] = Field(..., description="Quadrature weight of each sample")
    probe_logits: list[float] = Field(..., deprecated=True, description="Deprecated: the same numbers as `probe_values`, "
                                      "kept for older clients (probabilities when `output` is 'probability')")
    logits: list[float] = Field(..., deprecated=True, description="Deprecated: the same numbers as `values`, kept for older "
                                "clients (probabilities when `output` is 'probability', despite the name)")
    input: Literal["photo", "noisy_copy"] = Field(
        "photo", description="Whose path the curve follows: `photo` (x is the uploaded image), or `noisy_copy` with SmoothGrad / "
        "VarGrad (`smooth_samples` > 0, as in the idg `quality` preset): x is the first of the noisy copies x + N(0, σ²) whose "
        "maps were pooled, so F at α = 1 is that copy's, not the photo's (the prediction's probability is the photo's)")
    probe_input: Literal["photo", "noisy_copy"] = Field(
        "photo", description="Whose path the probe (`probe_alphas`, `probe_values`) follows: `photo`, also where the noisy copies "
        "share one probe of the photo (`smooth_probe=shared`: their samples are then placed where the photo's output moves and "
        "`values` are the first copy's), or `noisy_copy` where each copy runs its own probe")


class Cost(BaseModel):
    forward_passes: int = Field(..., description="Images pushed forward through the model for this request")
    backward_passes: int = Field(..., description="Images back-propagated for this request")


class RawAttribution(BaseModel):
    format: Literal["npy"] = Field("npy", description="Encoding of `data`: a NumPy .npy file (read with numpy.load)")
    dtype: Literal["float16", "float32"] = Field("float16", description="Element type of the array in `data`: float16 when "
                                                 "every nonzero magnitude lies in float16's normal range (~6.1e-5 to 65504), so each value "
                                                 "keeps float16's precision; float32 otherwise: never an infinity, never a value lost")
    shape: list[int] = Field(..., description="(C, H, W) in the model's input resolution")
    data: str = Field(..., description="base64 of a NumPy .npy file (of `dtype`)")


class Faithfulness(BaseModel):
    """How faithful the returned map is to the model (RISE, Petsiuk et al. 2018)."""

    insertion: float | None = Field(None, description="Insertion AUC in [0, 1]: probability of the predicted class as the most "
                                    "salient pixels are put back into a blurred image; higher is more faithful")
    deletion: float | None = Field(None, description="Deletion AUC in [0, 1]: probability as the most salient pixels are "
                                   "replaced by the mean colour; lower is more faithful")
    steps: int = Field(..., description="Steps of each game (its forward passes are steps + 1)")


class Region(BaseModel):
    rank: int = Field(..., description="The region's rank, 1 first: its pixels' value in `labels_png`")
    gain: float = Field(..., description="The order's key. XRAI: its mean saliency (Σ over channels of |attribution| of the "
                        "method's map) over its pixels when XRAI added it; the last region (pixels no segment reached) its own "
                        "mean. Grad-CAM's blobs (cam_regions): its mean Grad-CAM value")
    area: int = Field(..., description="Its pixels, at the model's input size")
    share: float = Field(..., description="Its share of the image, area / pixels")


class XraiRegions(BaseModel):
    """The map's ranked regions (postprocess=xrai: XRAI's; cam_regions: Grad-CAM's blobs), for a front end to outline or
    fill the top ones."""

    source: Literal["xrai", "cam_blobs"] = Field(..., description="Whose regions: XRAI's segments (postprocess=xrai) or "
                                                 "Grad-CAM's blobs, its map's bands cut into connected parts (cam_regions)")
    order: Literal["regions_then_pixels", "regions"] = Field(..., description="How the returned map ranks pixels (xrai_order)")
    labels_png: str = Field(..., description="base64 16-bit greyscale PNG at the model's input size: each pixel's region rank")
    regions: list[Region] = Field(..., description="Every region, first (highest gain) to last")


class AttributeResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model: str = Field(..., description="Model that answered")
    method: str = Field(..., description="Attribution method used")
    prediction: list[ClassScore] = Field(..., description="Top classes of the model on this image")
    target: ClassScore = Field(..., description="The class explained")
    parameters: dict[str, object] = Field(..., description="Every parameter the method actually ran with, with the preset's name")
    precision: str = Field(..., description="Arithmetic the model ran in: fp32 (IEEE), tf32 or bf16 (autocast)")
    heatmap_png: str | None = Field(None, description="Heatmap (model input size), base64 PNG")
    overlay_png: str | None = Field(None, description="Heatmap over the resized input, base64 PNG")
    input_png: str | None = Field(None, description="The resized, cropped input the model saw, base64 PNG, if return_input")
    attribution: RawAttribution | None = Field(None, description="Raw attribution, if return_attribution")
    curve: OutputCurve = Field(..., description="The target output along the path, where the method sampled it")
    cost: Cost = Field(..., description="Model passes this request took")
    faithfulness: Faithfulness | None = Field(None, description="Insertion / deletion AUCs of this map, if faithfulness was asked")
    regions: XraiRegions | None = Field(None, description="The map's ranked regions, with postprocess=xrai (XRAI's) or "
                                        "cam_regions (Grad-CAM's blobs)")
    timings: Timings = Field(..., description="Where the time of this request went, in milliseconds")


class ModelInfo(BaseModel):
    name: str = Field(..., description="Model name, the value of the `model` request field")
    classes: int = Field(..., description="Number of output classes")
    input_size: int = Field(..., description="Side of the square centre crop the model sees, in pixels")
    resize_size: int = Field(..., description="Shorter side the image is resized to before the crop, in pixels")
    interpolation: str = Field(..., description="Resize interpolation (e.g. bilinear, bicubic)")
    default: bool = Field(..., description="Whether requests without `model` use this model")
    source: str = Field("", description="Where the model came from: packaged:NAME, torchvision:ARCH:PATH, timm:ARCH:PATH, "
                        "hf:FOLDER, torchscript:PATH or export:PATH")
    class_names: list[str] = Field(default_factory=list, description="The first few class names, by index (up to 5)")
    resize_mode: str = Field("shorter", description="shorter: the shorter side is resized to resize_size, then centre-cropped; "
                             "squash: the whole image is resized to resize_size square (aspect ratio not kept), then cropped")
    mean: list[float] = Field(default_factory=list, description="Per-channel (RGB) mean subtracted from pixels in [0, 1], inside the model")
    std: list[float] = Field(
        default_factory=list, description="Per-channel (RGB) standard deviation pixels are divided by, inside the model")
    precision: str = Field("fp32", description="Arithmetic the model runs in: fp32, tf32 or bf16 (autocast)")
    precision_source: str = Field(
        "auto", description="Where `precision` came from: auto (IDG_PRECISION=auto: TF32 on CUDA, bf16 for a model whose bf16 "
        "faithfulness was checked, IEEE fp32 on the CPU), calibration (auto on CUDA, decided by `calibration`), models file, or "
        "setting (IDG_PRECISION)")
    calibration: dict[str, Any] | None = Field(
        None, description="The bf16 calibration the model started with (IDG_CALIBRATION_FILE or IDG_CALIBRATE_IMAGES, as "
        "idg-calibrate writes it): decision (bf16 or fp32), insertion and deletion as {mean, half_width, n} of bf16 - fp32 per "
        "photo (> 0 favours bf16; 95% interval), photos, folder, device, date; null: not calibrated")
    max_batch: int | None = Field(None, description="Most images in one call of this model (the models file's max_batch); "
                                  "null: the service's IDG_MAX_BATCH_IMAGES")
    compile_sizes: list[int] = Field(default_factory=list, description="Batch sizes the model was compiled at (IDG_COMPILE; "
                                     "calls are padded to the nearest); empty: not compiled")
    compile_seconds: float | None = Field(None, description="Start-up seconds its compilation took; null: not compiled")
    call_sizes: list[int] = Field(default_factory=list, description="Batch sizes every call of this model runs at, padded up "
                                  "(IDG_FIXED_CALL_SIZES; each warmed forward and with a gradient before ready); empty: any size")
    warm_seconds: float | None = Field(None, description="Start-up seconds the warm-up of its call sizes took")
    cuda_graphs: bool = Field(False, description="Whether its calls replay CUDA graphs captured at warm-up (IDG_CUDA_GRAPHS)")
    unwarmed_calls: int = Field(0, description="Model calls since ready at a batch size the warm-up did not run (stays 0 with "
                                "fixed call sizes)")


class MethodParameter(BaseModel):
    name: str = Field(..., description="The request field (and the library's keyword)")
    type: Literal["integer", "number", "boolean", "string"] = Field(..., description="JSON type of the value")
    default: int | float | bool | str | None = Field(..., description="The method's default (a preset may set step counts)")
    minimum: float | None = Field(None, description="Smallest value allowed (see exclusive_minimum)")
    exclusive_minimum: bool = Field(False, description="Whether `minimum` itself is refused")
    maximum: float | None = Field(None, description="Largest value allowed")
    choices: list[str] = Field(default_factory=list, description="The values allowed, for a string parameter")
    description: str = Field(..., description="What the parameter means")


class PresetInfo(BaseModel):
    name: str = Field(..., description="The preset's name (the request's `preset`)")
    default: bool = Field(..., description="Whether requests without `preset` use it (the default answer)")
    summary: str = Field(..., description="What it sets for IDG, in a line")
    standing: str = Field(..., description="Where it stands in the faithfulness measurements that chose it")
    parameters: dict[str, dict[str, object]] = Field(
        ..., description="Method name -> what the preset sets (step counts, post-steps); the rest take the method's defaults")
    cost: dict[str, Cost] = Field(..., description="Method name -> the most one answer costs at this preset, with the "
                                  "prediction's pass, counted as an answer's `cost` counts it")


class RowInfo(BaseModel):
    name: str = Field(..., description="The evaluation's row name (python -m idg_evaluation --methods NAME)")
    request: dict[str, str] = Field(..., description="The /attribute fields that ask for it")
    cost: Cost = Field(..., description="The most one answer costs, with the prediction's pass")
    standing: str = Field(..., description="Where it stands in the faithfulness measurements there are ('a hint' where "
                          "they are a few photos; 'not measured' where there are none)")


class ModelsResponse(BaseModel):
    models: list[ModelInfo] = Field(..., description="Loaded models, the default first")
    methods: dict[str, str] = Field(..., description="Method name -> description")
    method_parameters: dict[str, list[MethodParameter]] = Field(
        default_factory=dict, description="Method name -> the parameters a request for it may give (others are a 422)")
    presets: list[PresetInfo] = Field(default_factory=list, description="The cost presets, the default first: what each "
                                      "sets, costs and where it stands")
    rows: list[RowInfo] = Field(default_factory=list, description="Region rows beside the presets (Grad-CAM, XRAI and "
                                "Grad-CAM's post-steps over IDG): what to ask, what it costs and where it stands")
    device: str = Field(..., description="Device the models run on (cpu, cuda, cuda:1, ...)")


class ErrorDetail(BaseModel):
    status: int = Field(
        ..., description="The HTTP status (also the response's status, except for /attribute/batch items and stream events)")
    code: str = Field(
        ..., description="Stable machine-readable reason, e.g. bad_image, unsupported_image, invalid_parameter, too_large, busy, deadline")
    message: str = Field(..., description="What was wrong, in one sentence")
    request_id: str | None = Field(
        None, description="The request's ID (its X-Request-ID): quote it to find the request's log lines, a failure's traceback among them")


class ErrorResponse(BaseModel):
    error: ErrorDetail = Field(..., description="What went wrong")


class BatchItem(BaseModel):
    filename: str = Field(..., description="The uploaded file's name")
    status: int = Field(..., description="HTTP status this image would have had alone")
    result: AttributeResponse | None = Field(None, description="The /attribute answer, when status is 200")
    error: ErrorDetail | None = Field(None, description="What was wrong, otherwise")


class BatchResponse(BaseModel):
    items: list[BatchItem] = Field(..., description="One entry per uploaded image, in upload order")
    succeeded: int = Field(..., description="How many items have status 200")
    failed: int = Field(..., description="How many items have another status")


ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "The body could not be read: not an image, a broken file, or a malformed multipart/base64 body",
    401: "Missing or wrong API key (only when IDG_API_KEY is set)",
    404: "Unknown model name",
    408: "The request body did not arrive within IDG_BODY_TIMEOUT_S",
    413: "The body, the image's pixels or the batch is larger than the limits",
    415: "Not multipart/form-data or application/json, or an image format that is not supported",
    422: "A parameter is invalid (wrong type or range, unknown field, missing file) or the image cannot be used",
    500: "An unexpected failure of this request (logged with a traceback)",
    503: "Not ready yet, shutting down, or the queue is full (with Retry-After)",
    504: "The request ran past its deadline",
}
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {c: {"model": ErrorResponse, "description": d} for c, d in ERROR_DESCRIPTIONS.items()}
"""The error statuses the image routes answer, for their OpenAPI docs."""
