"""A model that fails numerically on some images: that request gets a 500 that says so (never a
heatmap of NaNs), and the requests batched with it are answered as usual."""

from __future__ import annotations

import asyncio
import base64

import pytest
import torch
from torch import Tensor, nn

from app.core.config import Settings
from app.main import create_app
from idg_models import ImageClassifier, Preprocessing
from tests.models import TinyNet, imagenet_class_names
from tests.service.conftest import image_bytes, serve


class _NanGradWhenGreen(torch.autograd.Function):
    """Identity forward; backward gives NaN for the images whose raw green mean is high."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        green = x[:, 1].mean(dim=(1, 2)) > 1.5  # normalised: bright green uploads only
        return torch.where(green.view(-1, 1, 1, 1), torch.full_like(grad, float("nan")), grad)


class _Overflowing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = TinyNet()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(_NanGradWhenGreen.apply(x))


class _InfiniteWhenGreen(nn.Module):
    """TinyNet whose logits are infinite (or NaN) where an image's normalised green mean lies in ``band``."""

    def __init__(self, band: tuple[float, float] = (1.5, float("inf")), value: float = float("inf")) -> None:
        super().__init__()
        self.net = TinyNet()
        self.band = band
        self.value = value

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x)
        green = x[:, 1].mean(dim=(1, 2))
        bad = (green > self.band[0]) & (green < self.band[1])
        return torch.where(bad.view(-1, 1), torch.full_like(out, self.value), out)


class _InfiniteOnThePath(_InfiniteWhenGreen):
    """Finite on the bright green image (normalised green ~2.3) and the mean baseline (0), infinite at the path's points
    between 0.3 and 1.2: the probe's curve is not finite."""

    def __init__(self) -> None:
        super().__init__((0.3, 1.2))


@pytest.mark.parametrize(("net", "fields"), [
    (_Overflowing, {"method": "ig", "steps": "8", "return_attribution": "true"}),  # NaN gradients: a map of NaNs
    (_InfiniteWhenGreen, {"method": "idg", "target": "3"}),  # infinite logits on the image: no class can be ranked
    (_InfiniteOnThePath, {"method": "idg", "target": "3"}),  # infinite logits on the path: IDG's probe curve is not finite
])
async def test_a_non_finite_answer_is_a_500_that_says_why_and_fails_only_its_request(net: type[nn.Module],
                                                                                     fields: dict[str, str]) -> None:
    model = ImageClassifier("tiny", net(), Preprocessing(36, 32), imagenet_class_names())
    app = create_app(Settings(models=["tiny"], batch_wait_ms=50.0), models={"tiny": model})
    async with serve(app) as client:
        def post(color: tuple[int, int, int]) -> object:
            return client.post("/attribute", files={"file": ("x.png", image_bytes(color=color))}, data=fields)

        bad, good = await asyncio.gather(post((20, 250, 20)), post((40, 120, 200)))
        assert bad.status_code == 500, bad.text
        error = bad.json()["error"]
        assert error["code"] == "model_error" and "not finite" in error["message"] and "fp32" in error["message"], error
        assert good.status_code == 200, good.text
        assert good.json()["heatmap_png"]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
async def test_logits_that_are_not_finite_are_a_500_on_every_route_never_a_ranking(value: float) -> None:
    """softmax of a logit that is NaN or infinite makes every probability NaN: /predict and /v2 had answered 200 with an
    arbitrary order of the classes (probability null, NaN in /v2), /attribute with the target's probability null."""
    model = ImageClassifier("tiny", _InfiniteWhenGreen(value=value), Preprocessing(36, 32), imagenet_class_names())
    app = create_app(Settings(models=["tiny"], batch_wait_ms=5.0), models={"tiny": model})
    bad, good = image_bytes(color=(20, 250, 20)), image_bytes(color=(40, 120, 200))
    async with serve(app) as client:
        for photo, status in ((bad, 500), (good, 200)):
            answers = [
                await client.post("/predict", files={"file": ("x.png", photo)}),
                await client.post("/attribute", files={"file": ("x.png", photo)}, data={"return_overlay": "false", "target": "0"}),
                await client.post("/v2/models/tiny/infer", json={"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                                                            "data": [base64.b64encode(photo).decode()]}]}),
            ]
            for r in answers:
                assert r.status_code == status, r.text
                if status == 500:
                    assert "not finite" in r.text and "fp32" in r.text, r.text


class _Evil:
    def __reduce__(self) -> tuple:
        import os

        return (os.system, ("echo pwned",))


def test_a_malicious_hf_weights_file_ends_in_the_one_line_error_naming_the_model(tmp_path) -> None:
    """A pickle that would run code is refused by torch.load(weights_only=True) with an UnpicklingError, which had
    escaped start-up as a raw traceback (#29 item 4)."""
    import pickle

    pytest.importorskip("transformers")
    from app.core.model_loading import ModelLoadError, load_models
    from idg_models._torchvision_compat import import_torchvision

    import_torchvision()  # transformers imports torchvision (see that module: PyPI's wheel beside CPU torch)
    from tests.models import tiny_model_maker

    entry = tiny_model_maker().MAKERS["hf_vit"](tmp_path)
    folder = tmp_path / "hf-vit"
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"vit.embeddings.cls_token": _Evil()}))
    with pytest.raises(ModelLoadError, match="cannot load model 'hfvit'") as err:
        load_models([entry], torch.device("cpu"))
    assert "\n" not in str(err.value)
