"""Request and response bodies; their field descriptions are the OpenAPI docs at /docs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from idg_core.presets import DEFAULT_PRESET, Preset

MethodName = Literal["idg", "ig", "left_ig", "guided_ig", "agi"]


class PredictParams(BaseModel):
    """Form fields of POST /predict (multipart), or JSON keys beside ``image``."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model: str | None = Field(None, description="Model name from GET /models; default: the first loaded model")
    top_k: int = Field(5, ge=1, description="How many classes to return, best first")


class AttributeParams(PredictParams):
    """Form fields of POST /attribute (multipart), or JSON keys beside ``image``."""

    method: MethodName = Field("idg", description="Attribution method: idg (IDG with adaptive sampling), ig, left_ig, guided_ig, agi")
    target: int | None = Field(None, ge=0, description="Class index to explain; default: the predicted class")
    preset: Preset = Field(DEFAULT_PRESET, description="Cost preset: 'fast' (IDG with the fewest steps whose insertion and deletion stay "
                           "within noise of IDG-50/50 and no worse than IG-50, measured on sample photos) or 'paper' (the paper's 50 steps); "
                           "explicit steps / probe_steps / max_iter override it. The other methods run their paper settings under both")
    steps: int | None = Field(None, ge=1, description="Gradient samples M (idg), quadrature points (ig, left_ig) or steps S (guided_ig); default: the preset's")
    probe_steps: int | None = Field(None, ge=3, description="IDG only: uniform probe points N of the logit-α curve; default: the preset's")
    baseline: Literal["mean", "black"] = Field("mean", description="Path start: 'mean' (ImageNet mean colour, the authors' code) or 'black'")
    placement: Literal["aligned", "authors"] = Field("aligned", description="IDG: 'aligned' (samples of interval k inside it) or 'authors' (published code's drift)")
    importance: Literal["finite_difference", "exact"] = Field("finite_difference", description="IDG importance factor dF/dα: the paper's finite difference or the exact chain rule")
    uniform: bool = Field(False, description="IDG without adaptive sampling (uniform points, no probe)")
    rule: Literal["gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "uniform", "adaptive"] = Field(
        "gausslegendre", description="IG quadrature rule (Captum's names; 'uniform' is the IDG authors' IG; 'adaptive' uses IDG's sample placement)")
    fraction: float = Field(0.5, ge=0, le=1, description="Guided IG: share of features moved per sub-step, at least 0.01 (a step "
                            "takes up to 1/fraction + 2 sub-steps, each a pass over every feature; smaller shares are refused)")
    max_dist: float = Field(1.0, ge=0, le=1, description="Guided IG: how far features may run ahead of the straight path")
    epsilon: float = Field(0.05, ge=0, le=1, description="AGI: FGSM step in pixel units, above 0 (a zero step never moves the image)")
    max_iter: int = Field(20, ge=1, description="AGI: iterations per adversarial class; the request costs up to 2 x max_iter x "
                          "adversarial_classes gradient passes, at most IDG_MAX_PASSES")
    adversarial_classes: int = Field(1, ge=1, le=50, description="AGI: number of adversarial classes, drawn with `seed`")
    seed: int = Field(0, ge=0, description="AGI: seed of the adversarial class draw")
    signed: bool = Field(False, description="Heatmap of the signed channel sum (diverging colours) instead of its magnitude")
    outlier_perc: float = Field(2.0, ge=0, lt=100, description="Heatmap scaling: share of the attribution mass clipped as outliers (Captum's convention)")
    opacity: float = Field(0.6, ge=0, le=1, description="Overlay: largest blend weight of the heatmap over the photo")
    return_heatmap: bool = Field(True, description="Return the heatmap PNG (base64)")
    return_overlay: bool = Field(True, description="Return the heatmap over the input as a PNG (base64)")
    return_attribution: bool = Field(False, description="Return the raw (C, H, W) attribution as base64 float16 .npy")
    return_input: bool = Field(False, description="Return the model-size input image as a PNG (to layer the heatmap over it)")


class ImageJSON(BaseModel):
    image: str = Field(..., description="The image file, base64 (a data: URL prefix is accepted)")


class PredictJSON(ImageJSON, PredictParams):
    """JSON body of POST /predict."""


class AttributeJSON(ImageJSON, AttributeParams):
    """JSON body of POST /attribute."""


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
    timings: Timings


class Curve(BaseModel):
    """The logit-α curve: F along the path x' + α(x - x') for the target class."""

    probe_alphas: list[float] = Field(..., description="IDG's uniform probe positions α_k (empty for other methods)")
    probe_logits: list[float] = Field(..., description="Target logit at each probe position")
    alphas: list[float] = Field(..., description="Sample positions α_j where gradients were taken")
    logits: list[float] = Field(..., description="Target output (logit, or probability for guided_ig/agi) at each sample")
    importance: list[float] = Field(..., description="IDG importance factor dF/dα at each sample")
    weights: list[float] = Field(..., description="Quadrature weight of each sample")


class Cost(BaseModel):
    forward_passes: int = Field(..., description="Images pushed forward through the model for this request")
    backward_passes: int = Field(..., description="Images back-propagated for this request")


class Attribution(BaseModel):
    format: Literal["npy"] = "npy"
    dtype: Literal["float16"] = "float16"
    shape: list[int] = Field(..., description="(C, H, W) in the model's input resolution")
    data: str = Field(..., description="base64 of a NumPy .npy file (float16)")


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
    attribution: Attribution | None = Field(None, description="Raw attribution, if return_attribution")
    curve: Curve
    cost: Cost
    timings: Timings


class ModelInfo(BaseModel):
    name: str
    classes: int
    input_size: int
    resize_size: int
    interpolation: str
    default: bool


class ModelsResponse(BaseModel):
    models: list[ModelInfo]
    methods: dict[str, str] = Field(..., description="Method name -> description")
    device: str


class ErrorDetail(BaseModel):
    status: int
    code: str
    message: str = Field(..., description="What was wrong, in one sentence")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class BatchItem(BaseModel):
    filename: str = Field(..., description="The uploaded file's name")
    status: int = Field(..., description="HTTP status this image would have had alone")
    result: AttributeResponse | None = Field(None, description="The /attribute answer, when status is 200")
    error: ErrorDetail | None = Field(None, description="What was wrong, otherwise")


class BatchResponse(BaseModel):
    items: list[BatchItem] = Field(..., description="One entry per uploaded image, in upload order")
    succeeded: int
    failed: int


ERROR_RESPONSES: dict[int | str, dict[str, object]] = {c: {"model": ErrorResponse} for c in (400, 401, 404, 413, 415, 422, 503, 504)}
"""The error statuses the image routes answer, for their OpenAPI docs."""
