"""Names that say one thing: the curve says which output its values are; errors are told apart by
their type, not their text; JSON bodies take base64 as ``base64`` prints it (wrapped lines)."""

from __future__ import annotations

import base64

import pytest
import torch
from torch import Tensor, nn

from app.core.config import Settings
from app.core.images import _api_error
from app.main import create_app
from idg_core.preprocess import ImageDecodeError, UnsupportedImageError
from idg_models import ImageClassifier, Preprocessing, imagenet_class_names
from tests.service.conftest import AppFactory, image_bytes, serve


async def test_json_base64_with_line_breaks_is_accepted(tiny_app: AppFactory) -> None:
    png = image_bytes(size=(300, 200))  # > 76 bytes of base64, so encodebytes wraps it
    wrapped = base64.encodebytes(png).decode()
    assert "\n" in wrapped.strip()
    async with serve(tiny_app()) as client:
        for image in (wrapped, wrapped.replace("\n", "\r\n"), "data:image/png;base64," + wrapped):
            r = await client.post("/predict", json={"image": image, "top_k": 2})
            assert r.status_code == 200, r.text
            assert len(r.json()["top_k"]) == 2
        r = await client.post("/predict", json={"image": wrapped.replace("\n", "\n!")})
        assert r.status_code == 400 and r.json()["error"]["message"] == "image is not valid base64"


@pytest.mark.parametrize(("method", "output"), [("idg", "logit"), ("guided_ig", "probability")])
async def test_the_curve_names_its_output(tiny_app: AppFactory, method: str, output: str) -> None:
    async with serve(tiny_app()) as client:
        fields = {"method": method, "steps": "4"} | ({"fraction": "0.5"} if method == "guided_ig" else {})
        r = await client.post("/attribute", data=fields, files={"file": ("x.png", image_bytes())})
        assert r.status_code == 200, r.text
        c = r.json()["curve"]
        assert c["output"] == output and c["values"] and c["values"] == c["logits"] and c["probe_values"] == c["probe_logits"]
        if output == "probability":
            assert all(0 <= v <= 1 for v in c["values"])


def test_image_errors_are_told_apart_by_type_not_text() -> None:
    unsupported = (_api_error(UnsupportedImageError("whatever it says")).status, _api_error(UnsupportedImageError("x")).code)
    assert unsupported == (415, "unsupported_image")
    broken = _api_error(ImageDecodeError("not in a supported format, it says, but it is a broken file"))
    assert (broken.status, broken.code) == (400, "bad_image")


async def test_batch_file_limit_counts_files_not_fields(tiny_app: AppFactory) -> None:
    async with serve(tiny_app(max_batch_files=2)) as client:
        files = [("files", (f"{i}.png", image_bytes())) for i in range(2)]
        # a field whose value reads like a file part, and a file whose bytes mention "filename": neither is a third file
        r = await client.post("/attribute/batch", data={"steps": "3", "return_heatmap": "false"}, files=files)
        assert r.status_code == 200 and r.json()["succeeded"] == 2, r.text
        r = await client.post("/attribute/batch", files=[*files, ("files", ("2.png", image_bytes()))])
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
        r = await client.post("/attribute/batch", files=[("files", ("a.png", b"Content-Disposition: x; filename=y\r\n" * 3))])
        assert r.status_code == 200 and r.json()["items"][0]["status"] == 415, r.text


class Refuses(nn.Module):
    """A model whose forward raises ValueError: a failure of the model, not of the request."""

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] > 0 and float(x.mean()) > -100:
            raise ValueError("shapes do not match inside the model")
        return torch.zeros(x.shape[0], 1000)


async def test_a_value_error_inside_the_worker_is_a_500_not_the_clients_422() -> None:
    model = ImageClassifier("refuses", Refuses(), Preprocessing(36, 32), imagenet_class_names())
    app = create_app(Settings(models=["refuses"], warmup=False), models={"refuses": model})
    async with serve(app) as client:
        r = await client.post("/predict", files={"file": ("x.png", image_bytes())})
        assert r.status_code == 500 and r.json()["error"]["code"] == "model_error", r.text
        r = await client.post("/attribute", data={"steps": "1"}, files={"file": ("x.png", image_bytes())})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_parameter"  # checked before the worker
