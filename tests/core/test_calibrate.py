"""The bf16 calibration (idg_models.calibrate, idg-calibrate): the keep rule on forced numbers,
forced outcomes on models whose bf16 path is exact or misleading, the file, and the command end to end
on a TorchScript model saved as a user would."""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from idg_models.calibrate import (
    calibrate,
    keeps_faithfulness,
    main,
    mismatch,
    paired_against,
    paired_difference,
    read_calibrations,
    table,
    weights_sha256,
    write_calibration,
)
from idg_models.calibration import Calibration, Paired
from tests.models import Bf16Trap, bf16_trap_classifier, write_photos

ROOT = Path(__file__).resolve().parents[2]


def test_the_keep_rule_on_forced_numbers() -> None:
    same = paired_difference([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])
    assert same == Paired(0.0, 0.0, 3) and same.within_noise_or_better
    worse = paired_difference([0.4, 0.5, 0.61], [0.5, 0.6, 0.7])  # insertion lower on every image
    assert worse.mean < 0 and worse.mean + worse.half_width < 0 and not worse.within_noise_or_better
    noisy = paired_difference([0.6, 0.5, 0.7, 0.62], [0.5, 0.6, 0.7, 0.6])  # the interval holds 0
    assert noisy.mean - noisy.half_width < 0 < noisy.mean + noisy.half_width and noisy.within_noise_or_better
    deleted_better = paired_difference([0.1, 0.2, 0.15], [0.2, 0.3, 0.26], lower_is_better=True)  # lower deletion: > 0
    assert deleted_better.mean > 0 and deleted_better.within_noise_or_better
    assert paired_difference([0.5, None, 0.7], [0.5, 0.6, None]).n == 1  # an image missing on either side is left out
    assert not paired_difference([0.9], [0.1]).within_noise_or_better  # one image: no interval, nothing known
    paired = paired_against({"insertion": [0.6, 0.7, 0.8], "deletion": [0.3, 0.2, 0.1]},
                            {"insertion": [0.6, 0.7, 0.8], "deletion": [0.2, 0.1, 0.0]})
    assert paired["insertion"].within_noise_or_better and paired["deletion"].mean == pytest.approx(-0.1)
    assert not keeps_faithfulness(paired)  # deletion 0.1 higher on every image: bf16 not kept
    assert keeps_faithfulness({"insertion": same, "deletion": deleted_better})
    assert not keeps_faithfulness({"insertion": same})  # both metrics are needed


def test_bf16_is_kept_where_it_computes_the_same_and_refused_where_it_misleads(tmp_path: Path) -> None:
    """Bf16Trap computes exactly the same in bf16 (elementwise arithmetic only): every paired difference is
    0 and bf16 is kept. Its ``wrong`` twin keeps its logits but under bf16 its gradient points at pixels that
    change nothing: deletion gets worse on the photos and bf16 is refused. The measured model is left as it was."""
    photos = write_photos(tmp_path / "photos", 6)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        same_model = bf16_trap_classifier(wrong=False)
        same = calibrate(same_model, photos, photos=6, curve_steps=16)
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32  # restored after the IEEE run
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    assert same.decision == "bf16" and same.bf16_kept
    assert same.insertion == Paired(0.0, 0.0, 6) and same.deletion == Paired(0.0, 0.0, 6)
    assert same.fp32 == same.bf16 and 0 < same.fp32["deletion"] < same.fp32["insertion"] < 1
    assert same_model.autocast_dtype is None and isinstance(same_model.net, Bf16Trap)  # measured on a view

    wrong = calibrate(bf16_trap_classifier(wrong=True), photos, photos=6, curve_steps=16)
    assert wrong.decision == "fp32" and not wrong.bf16_kept
    assert wrong.fp32 == same.fp32  # the reference is the same model in IEEE fp32
    assert wrong.deletion.mean + wrong.deletion.half_width < 0  # deletes worse (higher) on these photos, beyond noise
    assert wrong.bf16["deletion"] > wrong.fp32["deletion"] and wrong.bf16["insertion"] < wrong.fp32["insertion"]
    assert (wrong.photos, wrong.folder, wrong.device, wrong.preset) == (6, str(photos.resolve()), "cpu", "fast")
    text = table(wrong)
    assert "decision: fp32" in text and text.split("\ndeletion")[1].splitlines()[0].endswith("no")


def test_too_few_photos_or_none_say_so(tmp_path: Path) -> None:
    one = calibrate(bf16_trap_classifier(wrong=False), write_photos(tmp_path / "one", 1), curve_steps=4)
    assert one.decision == "fp32" and one.insertion.n == 1 and math.isnan(one.insertion.half_width)  # nothing known: fp32
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no photos"):
        calibrate(bf16_trap_classifier(wrong=False), tmp_path / "empty")
    with pytest.raises(ValueError, match="does not exist"):
        calibrate(bf16_trap_classifier(wrong=False), tmp_path / "nowhere")
    (tmp_path / "empty" / "broken.jpg").write_bytes(b"not a JPEG")
    with pytest.raises(ValueError, match="photo .*broken.jpg: "):
        calibrate(bf16_trap_classifier(wrong=False), tmp_path / "empty")


def test_the_file_keeps_each_models_decision_and_matches_source_and_weights(tmp_path: Path) -> None:
    model = bf16_trap_classifier(wrong=False)
    cal = Calibration("trap", model.source, weights_sha256(model), "bf16", Paired(0.001, 0.002, 9), Paired(-0.001, 0.003, 9),
                      9, "/photos", fp32={"insertion": 0.5, "deletion": 0.2}, bf16={"insertion": 0.501, "deletion": 0.201})
    path = tmp_path / "calib.json"
    write_calibration(path, cal)
    write_calibration(path, replace(cal, model="other", decision="fp32"))
    write_calibration(path, replace(cal, photos=10))  # a new measurement replaces the model's old one
    stored = read_calibrations(path)
    assert set(stored) == {"trap", "other"} and stored["trap"] == replace(cal, photos=10) and not stored["other"].bf16_kept
    assert json.loads(path.read_text())["models"]["trap"]["insertion"] == {"mean": 0.001, "half_width": 0.002, "n": 9}

    assert mismatch(stored["trap"], model) is None
    moved = bf16_trap_classifier(wrong=False)
    moved.source = "torchscript:/elsewhere.ts"
    assert mismatch(stored["trap"], moved) == "it measured test:bf16-trap:same, not torchscript:/elsewhere.ts"
    with torch.no_grad():
        model.net.w.mul_(1.01)  # the model's file changed since
    assert "other weights" in str(mismatch(stored["trap"], model))

    (tmp_path / "bad.json").write_text('{"models": {}}')
    with pytest.raises(ValueError, match="not one idg-calibrate wrote"):
        read_calibrations(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text('{"format": "idg-calibration/1", "models": {"m": {"decision": "bf16"}}}')
    with pytest.raises(ValueError, match="model 'm' is not a calibration written by idg-calibrate"):
        read_calibrations(tmp_path / "bad.json")
    data = json.loads(path.read_text())
    data["models"]["trap"]["decision"] = "fp16"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="decision must be bf16 or fp32"):
        read_calibrations(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="is not JSON"):
        read_calibrations(tmp_path / "bad.json")


def test_idg_calibrate_end_to_end_on_a_torchscript_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user's TorchScript files and models file, their photos: the command prints its table and adds each
    model's decision to --out; a model it cannot load or photos it cannot find exit 2 with a sentence."""
    for name, wrong in (("wrong", True), ("same", False)):
        torch.jit.save(torch.jit.script(Bf16Trap(wrong=wrong).eval()), tmp_path / f"{name}.ts")
    (tmp_path / "models.toml").write_text("".join(f"[models.{n}]\ninput_size = 32\nresize_size = 36\nmean = [0.5, 0.5, 0.5]\n"
                                                  "std = [0.25, 0.25, 0.25]\n\n" for n in ("wrong", "same")))
    photos = write_photos(tmp_path / "photos", 5)
    out = tmp_path / "calib.json"
    common = ["--models-file", str(tmp_path / "models.toml"), "--photos", str(photos), "-n", "5", "--curve-steps", "16",
              "--device", "cpu", "--out", str(out)]
    assert main(["--model", f"wrong=torchscript:{tmp_path / 'wrong.ts'}", *common]) == 0
    printed = capsys.readouterr().out
    assert "wrong (torchscript:" in printed and "IDG fast on 5 photos" in printed and "decision: fp32" in printed
    assert main(["--model", f"same=torchscript:{tmp_path / 'same.ts'}", *common]) == 0
    assert "decision: bf16 (bf16 keeps faithfulness)" in capsys.readouterr().out
    stored = read_calibrations(out)
    assert {n: c.decision for n, c in stored.items()} == {"wrong": "fp32", "same": "bf16"}
    assert stored["same"].source == f"torchscript:{tmp_path / 'same.ts'}" and stored["same"].photos == 5
    assert stored["same"].insertion == Paired(0.0, 0.0, 5)

    assert main(["--model", f"gone=torchscript:{tmp_path / 'gone.ts'}", *common]) == 2
    assert main(["--model", f"same=torchscript:{tmp_path / 'same.ts'}", *common[:2], "--photos", str(tmp_path / "none")]) == 2
    assert set(read_calibrations(out)) == {"wrong", "same"}  # failures write nothing
    with pytest.raises(SystemExit):
        main(["--model", "x", "--photos", str(photos), "-n", "1"])


def test_idg_calibrate_is_a_console_script() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, func = scripts["idg-calibrate"].partition(":")
    assert getattr(__import__(module, fromlist=[func]), func) is main
