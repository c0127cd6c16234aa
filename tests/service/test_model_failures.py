"""A model that fails numerically on some images: that request gets a 500 that says so (never a
heatmap of NaNs), and the requests batched with it are answered as usual."""

from __future__ import annotations

import asyncio

import torch
from torch import Tensor, nn

from app.core.config import Settings
from app.main import create_app
from idg_core.models import ImageClassifier, Preprocessing
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


async def test_a_non_finite_attribution_is_a_500_that_says_why_and_fails_only_its_request() -> None:
    model = ImageClassifier("tiny", _Overflowing(), Preprocessing(36, 32), imagenet_class_names())
    app = create_app(Settings(models=["tiny"], batch_wait_ms=50.0), models={"tiny": model})
    async with serve(app) as client:
        def post(color: tuple[int, int, int]) -> object:
            return client.post("/attribute", files={"file": ("x.png", image_bytes(color=color))},
                               data={"method": "ig", "steps": "8", "return_attribution": "true"})

        bad, good = await asyncio.gather(post((20, 250, 20)), post((40, 120, 200)))
        assert bad.status_code == 500, bad.text
        error = bad.json()["error"]
        assert error["code"] == "model_error" and "not finite" in error["message"] and "fp32" in error["message"]
        assert good.status_code == 200, good.text
        assert good.json()["heatmap_png"]
