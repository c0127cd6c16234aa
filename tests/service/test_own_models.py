"""The user's own classifiers through the real app: timm, transformers, TorchScript and torch.export
files saved at test time (tiny, random weights), loaded from IDG_MODELS in the lifespan."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from app.core.config import Settings
from app.core.model_loading import ModelLoadError
from app.main import create_app
from benchmarks.samples import ESPRESSO
from idg_core import METHODS
from tests.models import tiny_model_maker
from tests.service.conftest import image_bytes, serve, tiny_classifier

ROOT = Path(__file__).resolve().parents[2]
PHOTO = ESPRESSO.read_bytes()  # the checkout's own photo (samples/)
EXTRAS = {"timm": "timm", "hf_vit": "transformers", "hf_convnext": "transformers", "torchscript": None, "export": None}
METHOD_ARGS = {name: {p: str(int(m.params[p].low or 1) + 2) for p in m.params.steps} for name, m in METHODS.items()}
"""Each method's own step counts, small (read from the registry: a new method is covered without an edit)."""
CAMS = ("gradcam", "gradcam_pp")
NO_CAM_LAYER = ("scripted", "exported", "vit", "hfvit")
"""Models the CAM family refuses (422): graph files, whose layers cannot be read, and vision transformers."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Every source whose extra is installed: {kind: IDG_MODELS entry}, and the folder (models.toml)."""
    out = tmp_path_factory.mktemp("models")
    maker = tiny_model_maker()
    specs = {kind: maker.MAKERS[kind](out) for kind, extra in EXTRAS.items() if extra is None or importlib.util.find_spec(extra)}
    return out, specs


def _app(specs: list[str], models_file: Path | None = None, **kw: object) -> object:
    return create_app(Settings(models=specs, models_file=models_file, warmup=False, batch_wait_ms=5.0, **kw))


def _png(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


async def test_every_source_predicts_and_explains_with_every_method(tiny) -> None:
    folder, specs = tiny
    app = _app(list(specs.values()), folder / "models.toml")
    async with serve(app) as client:
        listed = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
        assert set(listed) == {s.split("=")[0] for s in specs.values()}
        for name, info in listed.items():
            size = info["input_size"]
            r = await client.post("/predict", files={"file": ("coffee.jpg", PHOTO)}, data={"model": name, "top_k": "3"})
            assert r.status_code == 200, r.text
            assert [c["name"] for c in r.json()["top_k"]][0] in app.state.service.models[name].class_names
            for method in METHODS:
                data = {"model": name, "method": method, "return_attribution": "true", **METHOD_ARGS[method]}
                r = await client.post("/attribute", files={"file": ("coffee.jpg", PHOTO)}, data=data)
                if method in CAMS and name in NO_CAM_LAYER:
                    assert r.status_code == 422 and "Grad-CAM" in r.json()["error"]["message"], f"{name} {method}: {r.text}"
                    continue
                assert r.status_code == 200, f"{name} {method}: {r.text}"
                body = r.json()
                assert _png(body["heatmap_png"]).size == (size, size) and _png(body["overlay_png"]).size == (size, size)
                arr = np.load(io.BytesIO(base64.b64decode(body["attribution"]["data"])))
                assert arr.shape == (3, size, size) and np.isfinite(arr).all() and np.abs(arr).sum() > 0, (name, method)
    if "timm" in specs:
        assert listed["vit"]["classes"] == 37 and listed["vit"]["input_size"] == 160  # head from the weights, size from timm
        assert listed["vit"]["resize_size"] == 168 and listed["vit"]["interpolation"] == "bicubic"  # 160 / crop_pct 0.95
    if "export" in specs:
        e = listed["exported"]
        assert (e["source"].startswith("export:"), e["classes"], e["input_size"], e["resize_size"], e["max_batch"]) == (True, 10, 48, 56, 4)
        assert e["class_names"] == ["airplane", "automobile", "bird", "cat", "deer"] and e["std"] == [0.25] * 3
    if "hf_convnext" in specs:
        c = listed["hfconvnext"]
        assert (c["classes"], c["input_size"], c["resize_size"], c["class_names"][0]) == (5, 64, 73, "breed 0")  # 64 / 0.875


async def test_hf_vit_names_targets_and_ig_completeness(tiny) -> None:
    folder, specs = tiny
    if "hf_vit" not in specs:
        pytest.skip("transformers is not installed (extra 'hf')")
    app = _app([specs["hf_vit"]])
    async with serve(app) as client:
        info = (await client.get("/models")).json()["models"][0]
        assert (info["classes"], info["input_size"], info["resize_mode"]) == (10, 64, "squash")
        assert info["class_names"] == ["airplane", "automobile", "bird", "cat", "deer"]
        r = await client.post("/attribute", files={"file": ("c.jpg", PHOTO)}, data={"method": "ig", "steps": "4", "target": "10"})
        assert r.status_code == 422 and "target must be < 10" in r.json()["error"]["message"]
        data = {"method": "ig", "steps": "48", "target": "9", "baseline": "black", "return_attribution": "true", "return_input": "true"}
        r = await client.post("/attribute", files={"file": ("c.jpg", PHOTO)}, data=data)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["target"] == {**body["target"], "index": 9, "name": "truck"}
        x = torch.from_numpy(np.array(_png(body["input_png"]).convert("RGB"))).permute(2, 0, 1).float().div(255)[None]
        model = app.state.service.models["hfvit"]
        with torch.no_grad():
            gap = float(model(x)[0, 9] - model(torch.zeros_like(x))[0, 9])
        total = float(np.load(io.BytesIO(base64.b64decode(body["attribution"]["data"]))).astype(np.float64).sum())
        assert abs(gap) > 1e-3 and abs(total - gap) <= 0.05 * abs(gap) + 1e-3, (total, gap)


class Echo(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class SigmoidHead(torch.nn.Module):
    """A binary classifier with one output logit: its softmax would be 1 for every image."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(1, 2, 3)).unsqueeze(1) - 0.5


class NoLogits(torch.nn.Module):
    """A head with no classes at all: a (batch, 0) tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :0]


def _start_error(specs: list[str], models_file: Path | None = None) -> str:
    async def start() -> None:
        async with serve(_app(specs, models_file)):
            pass

    with pytest.raises(ModelLoadError) as err:
        asyncio.run(start())
    return str(err.value)


def test_bad_model_files_stop_start_up_with_a_sentence(tiny, tmp_path: Path) -> None:
    folder, specs = tiny
    toml = folder / "models.toml"
    assert "model 'm' (torchscript:/nope.ts): file /nope.ts does not exist" in _start_error(["m=torchscript:/nope.ts"])
    assert "not a torch.export file" in _start_error([f"exported=export:{folder / 'cnn.ts'}"], toml)
    assert "not a TorchScript file" in _start_error([f"scripted=torchscript:{folder / 'cnn.pt2'}"], toml)
    msg = _start_error([f"scripted=torchscript:{folder / 'cnn.ts'}"])
    assert "give input_size, mean, std in the models file (IDG_MODELS_FILE), table [models.scripted]" in msg
    torch.jit.save(torch.jit.script(Echo()), tmp_path / "echo.ts")
    assert "not logits of shape (batch, classes)" in _start_error([f"scripted=torchscript:{tmp_path / 'echo.ts'}"], toml)
    torch.jit.save(torch.jit.script(SigmoidHead()), tmp_path / "sigmoid.ts")
    msg = _start_error([f"scripted=torchscript:{tmp_path / 'sigmoid.ts'}"], toml)
    assert "returns one logit per image (a sigmoid head?)" in msg and "[1 - sigmoid(z), sigmoid(z)]" in msg
    torch.jit.save(torch.jit.script(NoLogits()), tmp_path / "none.ts")
    msg = _start_error([f"scripted=torchscript:{tmp_path / 'none.ts'}"], toml)
    assert "returns no logits (a (2, 0) tensor" in msg and "sigmoid" not in msg  # not called a sigmoid head (found by review)
    (tmp_path / "bad.toml").write_text("[models.scripted]\ninput_size = 48\nmean = [0.5, 0.5]\nstd = [1, 1, 1]\n")
    assert "mean must be a list of 3 finite numbers" in _start_error([f"scripted=torchscript:{folder / 'cnn.ts'}"], tmp_path / "bad.toml")
    assert "IDG_MODELS names the model 'a' twice" in _start_error(["a=torchscript:/a.ts", "a=export:/a.pt2"])
    assert "the source must start with one of" in _start_error(["mine=/some/file.pt"])
    if "timm" in specs:
        wrong = specs["timm"].replace("timm:test_vit:", "timm:test_convnext:")
        assert "weights do not match timm architecture test_convnext" in _start_error([wrong])
        assert "timm has no architecture 'no_such_net'" in _start_error(["v=timm:no_such_net:/x.safetensors"])
    if "hf_vit" in specs:
        import transformers

        transformers.ViTModel(transformers.ViTConfig(image_size=32, patch_size=16, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=16)).save_pretrained(tmp_path / "base")
        assert "the weights do not match ViTForImageClassification" in _start_error([f"b=hf:{tmp_path / 'base'}"])
        bert = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
        bert.save_pretrained(tmp_path / "bert")
        assert "holds a BertConfig, not an image-classification model" in _start_error([f"b=hf:{tmp_path / 'bert'}"])
        assert "has no config.json" in _start_error([f"b=hf:{tmp_path}"])


def test_a_models_files_labels_are_read_only_inside_its_folder_unless_allowed(tiny, tmp_path: Path) -> None:
    """``labels`` is relative to the models file; a path that leaves its folder (``../``, absolute, or a
    link pointing out) stops start-up with a sentence, unless IDG_MODELS_FILE_ANY_PATH allows it."""
    folder, _ = tiny
    spec = f"scripted=torchscript:{folder / 'cnn.ts'}"
    conf = tmp_path / "conf"
    conf.mkdir()
    secret = tmp_path / "secret.txt"  # beside the folder, not in it: what a stray path would expose as class names
    secret.write_text("".join(f"secret line {i}\n" for i in range(10)))
    (conf / "link.txt").symlink_to(secret)
    (conf / "mine.txt").write_text("".join(f"class {i}\n" for i in range(10)))
    table = '[models.scripted]\ninput_size = 48\nmean = [0.5, 0.5, 0.5]\nstd = [0.25, 0.25, 0.25]\nlabels = "%s"\n'
    for given in ("../secret.txt", str(secret), "link.txt"):
        (conf / "models.toml").write_text(table % given)
        msg = _start_error([spec], conf / "models.toml")
        assert f"labels {given!r} is outside the models file's folder" in msg and "IDG_MODELS_FILE_ANY_PATH" in msg, msg
        assert "\n" not in msg

    async def class_names(**kw: object) -> list[str]:
        async with serve(_app([spec], conf / "models.toml", **kw)) as client:
            return list((await client.get("/models")).json()["models"][0]["class_names"])

    (conf / "models.toml").write_text(table % "mine.txt")  # inside: read relative to the file, not the working directory
    assert asyncio.run(class_names())[:2] == ["class 0", "class 1"]
    (conf / "models.toml").write_text(table % "../secret.txt")
    assert asyncio.run(class_names(models_file_any_path=True))[0] == "secret line 0"  # the operator allowed it


def test_the_launcher_says_why_it_cannot_start_in_one_line_without_a_traceback(tmp_path: Path) -> None:
    """``python -m app.server`` (what ``make run`` starts): a model that cannot load ends start-up with the
    ModelLoadError's sentence, not Starlette's traceback around it."""
    (tmp_path / "models.toml").write_text('[models.efficientnet_lite0]\nlabels = "../elsewhere.txt"\n')
    env = {**os.environ, "IDG_MODELS_FILE": str(tmp_path / "models.toml"), "IDG_WARMUP": "false", "IDG_DATA_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "app.server", "--port", "0"], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if "cannot start" in line]
    assert len(lines) == 1 and "labels '../elsewhere.txt' is outside the models file's folder" in lines[0], run.stderr
    assert "Traceback" not in run.stderr, run.stderr


async def test_the_models_file_sets_each_models_precision(tiny, tmp_path: Path) -> None:
    """precision / channels_last / compile per model: here one model in bf16 autocast beside one in
    IEEE fp32 (the service's default on a CPU); each answer names its model's precision."""
    folder, specs = tiny
    toml = tmp_path / "models.toml"
    toml.write_text((folder / "models.toml").read_text().replace("[models.scripted]\n", '[models.scripted]\nprecision = "bf16"\n'))
    (tmp_path / "labels.txt").write_text((folder / "labels.txt").read_text())  # beside the file that names it
    app = _app([specs["torchscript"], specs["export"]], toml)
    async with serve(app) as client:
        listed = {m["name"]: m["precision"] for m in (await client.get("/models")).json()["models"]}
        assert listed == {"scripted": "bf16", "exported": "fp32"}
        for name, precision in listed.items():
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"model": name, "steps": "4"})
            assert r.status_code == 200 and r.json()["precision"] == precision, r.text
        assert app.state.service.models["scripted"].autocast_dtype == torch.bfloat16
        assert app.state.service.models["exported"].autocast_dtype is None


def test_tf32_beside_fp32_stops_start_up_with_a_sentence(tiny, tmp_path: Path) -> None:
    folder, specs = tiny
    toml = tmp_path / "models.toml"
    toml.write_text((folder / "models.toml").read_text().replace("[models.scripted]\n", '[models.scripted]\nprecision = "tf32"\n'))
    (tmp_path / "labels.txt").write_text((folder / "labels.txt").read_text())
    msg = _start_error([specs["torchscript"], specs["export"]], toml)
    assert "TF32 is process-wide in PyTorch: scripted (tf32) and exported (fp32) cannot run in one service" in msg
    (tmp_path / "bad.toml").write_text('[models.scripted]\nprecision = "fp16"\ncompile = "yes"\n')
    assert "precision must be one of fp32, tf32, bf16, auto, got 'fp16'" in _start_error([specs["torchscript"]], tmp_path / "bad.toml")


def test_missing_extra_names_it(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm raises ImportError
    monkeypatch.setitem(sys.modules, "transformers", None)
    msg = _start_error(["v=timm:test_vit:/x.safetensors"])
    assert "need the optional extra 'timm'" in msg and ".venv/bin/pip install -e '.[timm]' torch==2.13.0" in msg
    (tiny[0] / "cfg").mkdir(exist_ok=True)
    (tiny[0] / "cfg" / "config.json").write_text("{}")
    assert "need the optional extra 'hf'" in _start_error([f"h=hf:{tiny[0] / 'cfg'}"])


async def test_models_share_the_worker_round_robin() -> None:
    """A slow model's long queue does not hold back another model's request queued after it, and a
    model's max_batch bounds its calls."""
    slow, fast = tiny_classifier(delay_s=0.01), tiny_classifier()
    fast.max_batch = 3
    app = create_app(Settings(models=["slow", "fast"], warmup=False, batch_wait_ms=20.0, max_batch_images=8),
                     models={"slow": slow, "fast": fast})
    done: list[str] = []
    async with serve(app) as client:
        async def one(model: str, i: int, steps: int) -> None:
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes((10 * i, 80, 90)))},
                                  data={"model": model, "method": "ig", "steps": str(steps)})
            assert r.status_code == 200, r.text
            done.append(f"{model}{i}")

        slow_jobs = [asyncio.create_task(one("slow", i, 64)) for i in range(8)]
        await asyncio.sleep(0.15)  # the slow jobs are queued and running
        await one("fast", 0, 16)
        await asyncio.gather(*slow_jobs)
    assert done.index("fast0") < 4, done  # FIFO by model would finish it after all eight (about 6 of 65 slow rounds)
    assert max(fast.net.calls) <= 3 and sum(fast.net.calls) >= 17, fast.net.calls


@pytest.mark.slow  # ~20 s of CPU: ViT-B/32's passes (the fast tests/core/test_torchvision_archs.py loads both kinds)
async def test_torchvision_resnet18_and_a_vit_from_the_users_weights_predict_and_explain(tmp_path: Path) -> None:
    """Issue #73: ``torchvision:ARCH:WEIGHTS`` for an architecture beyond the older six, from state dicts saved as a user
    saves them (random weights): each listed with the preprocessing torchvision declares, and answering both routes."""
    from idg_models import import_torchvision

    tv = import_torchvision()
    torch.save(tv.models.resnet18(num_classes=3).state_dict(), tmp_path / "pets-resnet18.pth")
    vit = tv.models.vit_b_32()  # ImageNet's 1000 classes
    torch.nn.init.normal_(vit.heads.head.weight, std=0.02)  # torchvision starts the head at 0: as trained, it is not
    torch.save(vit.state_dict(), tmp_path / "vit.pth")
    specs = [f"pets=torchvision:resnet18:{tmp_path / 'pets-resnet18.pth'}", f"vit=torchvision:vit_b_32:{tmp_path / 'vit.pth'}"]
    async with serve(_app(specs)) as client:
        listed = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
        assert {k: (m["classes"], m["input_size"], m["resize_size"], m["interpolation"]) for k, m in listed.items()} == {
            "pets": (3, 224, 256, "bilinear"), "vit": (1000, 224, 256, "bilinear")}
        assert listed["vit"]["class_names"][:2] == ["tench", "goldfish"] and listed["pets"]["class_names"][2] == "class 2"
        for name in listed:
            r = await client.post("/predict", files={"file": ("coffee.jpg", PHOTO)}, data={"model": name, "top_k": "2"})
            assert r.status_code == 200 and len(r.json()["top_k"]) == 2, r.text
            data = {"model": name, "method": "idg", "steps": "4", "return_attribution": "true"}
            r = await client.post("/attribute", files={"file": ("coffee.jpg", PHOTO)}, data=data)
            assert r.status_code == 200, f"{name}: {r.text}"
            body = r.json()
            assert body["model"] == name and _png(body["heatmap_png"]).size == (224, 224)
            arr = np.load(io.BytesIO(base64.b64decode(body["attribution"]["data"])))
            assert arr.shape == (3, 224, 224) and np.isfinite(arr).all() and np.abs(arr).sum() > 0, name
