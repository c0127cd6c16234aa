"""Start-up with a bf16 calibration (IDG_CALIBRATION_FILE, IDG_CALIBRATE_IMAGES): the decision and its
numbers in /models, stored decisions used only for the model they measured, bad files refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from app.core.config import Settings
from app.core.model_loading import ModelLoadError
from app.main import create_app
from idg_models import set_tf32
from idg_models.calibrate import calibrate, read_calibrations, write_calibration
from tests.models import bf16_trap_classifier, write_photos
from tests.service.conftest import image_bytes, serve


def _app(device: str = "cpu", **settings: object) -> object:
    models = {"same": bf16_trap_classifier(False, "same"), "wrong": bf16_trap_classifier(True, "wrong")}
    return create_app(Settings(models=list(models), device=device, warmup=False, batch_wait_ms=5.0, **settings), models=models)


async def test_a_stored_calibration_shows_in_models_for_the_model_it_measured(tmp_path: Path) -> None:
    """On the CPU the precision stays IEEE fp32 whatever the decision (auto); the decision and its numbers
    are listed. A stored decision for other weights is not used."""
    photos = write_photos(tmp_path / "photos", 4)
    same = calibrate(bf16_trap_classifier(False, "same"), photos, curve_steps=8)
    path = tmp_path / "calib.json"
    write_calibration(path, same)
    other = bf16_trap_classifier(True, "wrong")
    with torch.no_grad():
        other.net.w.add_(0.5)  # "wrong" as measured had other weights than the one served
    write_calibration(path, calibrate(other, photos, curve_steps=8))
    app = _app(calibration_file=path)
    async with serve(app) as client:
        listed = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
        cal = listed["same"]["calibration"]
        assert cal["decision"] == "bf16" and cal["photos"] == 4 and cal["folder"] == str(photos.resolve())
        assert cal["insertion"] == {"mean": 0.0, "half_width": 0.0, "n": 4} and cal["deletion"]["n"] == 4
        assert cal["source"] == "test:bf16-trap:same" and "both paired 95% intervals" in cal["rule"]
        assert listed["same"]["precision"] == "fp32" and listed["same"]["precision_source"] == "auto"  # the CPU: fp32 anyway
        assert listed["wrong"]["calibration"] is None and listed["wrong"]["precision_source"] == "auto"
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes(size=(40, 36)))}, data={"model": "same", "steps": "4"})
        assert r.status_code == 200 and r.json()["precision"] == "fp32", r.text


async def test_calibrate_images_measures_each_auto_model_before_ready_and_adds_it_to_the_file(tmp_path: Path) -> None:
    photos = write_photos(tmp_path / "photos", 4)
    path = tmp_path / "calib.json"
    app = create_app(Settings(models=["same", "wrong", "fixed"], device="cpu", warmup=False, calibrate_images=photos,
                              calibration_file=path),
                     models={"same": bf16_trap_classifier(False, "same"), "wrong": bf16_trap_classifier(True, "wrong"),
                             "fixed": _fixed(bf16_trap_classifier(False, "fixed"))})
    async with serve(app) as client:
        assert (await client.get("/health/ready")).status_code == 200
        listed = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
    assert listed["same"]["calibration"]["decision"] == "bf16" and listed["same"]["calibration"]["photos"] == 4
    assert listed["wrong"]["calibration"]["decision"] == "fp32"  # its bf16 gradient misleads: refused
    assert listed["fixed"]["calibration"] is None and listed["fixed"]["precision_source"] == "models file"
    stored = read_calibrations(path)
    assert {n: c.decision for n, c in stored.items()} == {"same": "bf16", "wrong": "fp32"}
    assert stored["wrong"].deletion._asdict() == listed["wrong"]["calibration"]["deletion"]


def _fixed(model: torch.nn.Module) -> torch.nn.Module:
    model.speed = {"precision": "fp32"}  # as a models-file table with precision = "fp32" sets it
    return model


def _start_error(**settings: object) -> str:
    async def start() -> None:
        async with serve(_app(**settings)):
            pass

    with pytest.raises(ModelLoadError) as err:
        asyncio.run(start())
    return str(err.value)


def test_a_bad_calibration_setting_stops_start_up_with_a_sentence(tmp_path: Path) -> None:
    assert "IDG_CALIBRATION_FILE /nope.json does not exist (idg-calibrate writes it" in _start_error(calibration_file="/nope.json")
    (tmp_path / "bad.json").write_text('{"models": []}')
    assert "is not one idg-calibrate wrote" in _start_error(calibration_file=tmp_path / "bad.json")
    (tmp_path / "empty").mkdir()
    folder = _start_error(calibration_file=tmp_path / "empty")  # it had said the folder "does not exist"
    assert f"IDG_CALIBRATION_FILE {tmp_path / 'empty'} is a folder, not a calibration file" in folder
    msg = _start_error(calibrate_images=tmp_path / "empty")
    assert "cannot calibrate model 'same' on IDG_CALIBRATE_IMAGES=" in msg and "no photos" in msg


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
async def test_on_cuda_bf16_only_where_calibration_kept_it_and_tf32_elsewhere(tmp_path: Path) -> None:
    app = _app(device="cuda", calibrate_images=write_photos(tmp_path / "photos", 6))
    async with serve(app) as client:
        listed = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
    set_tf32(False)  # the process-wide switch, back to the other tests' IEEE fp32
    assert (listed["same"]["precision"], listed["same"]["precision_source"]) == ("bf16", "calibration")
    assert (listed["wrong"]["precision"], listed["wrong"]["precision_source"]) == ("tf32", "calibration")
