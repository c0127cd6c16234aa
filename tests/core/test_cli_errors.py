"""The library's commands on wrong arguments: idg-evaluate (``python -m idg_evaluation``) and idg-calibrate
say what is wrong in one line, exit 2, and check the paths they are given before the model loads or the work
starts (it had been a traceback, or an error after the work, or a run that did nothing and said it had)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import pytest
import torch

import idg_evaluation.__main__ as evaluate
import idg_models.calibrate as calibrate_cli
from idg_models.calibrate import read_calibrations, weights_sha256, write_calibration
from idg_models.calibration import Calibration, Paired
from tests.models import Bf16Trap, bf16_trap_classifier, write_photos


def _not_called(*args: Any, **kwargs: Any) -> NoReturn:
    raise AssertionError("the arguments should have been refused before this")


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model or evaluating fails the test: the checks come first."""
    monkeypatch.setattr(evaluate, "load_entry", _not_called)
    monkeypatch.setattr(evaluate, "evaluate_folder", _not_called)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error line of idg-evaluate refusing ``argv`` (argparse: exit 2)."""
    with pytest.raises(SystemExit) as exc:
        evaluate.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("idg-evaluate: error: ") and "Traceback" not in err, err
    return last


def test_idg_evaluate_checks_images_and_out_before_the_model_loads(tmp_path: Path, no_model: None,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    photos = write_photos(tmp_path / "photos", 1)
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not photos")
    (tmp_path / "empty" / "readme.txt").write_text("no photo here")
    out = ["--out", str(tmp_path / "out")]
    assert "--images " in _refused(["--images", str(tmp_path / "nowhere"), *out], capsys)  # FileNotFoundError after the model
    assert "does not exist" in _refused(["--images", str(tmp_path / "nowhere"), *out], capsys)
    assert "is not a folder" in _refused(["--images", str(photos / "photo00.png"), *out], capsys)  # NotADirectoryError
    assert "holds no photos" in _refused(["--images", str(tmp_path / "empty"), *out], capsys)  # had written an empty report
    assert not (tmp_path / "out").exists()
    line = _refused(["--images", str(photos), "--out", str(tmp_path / "notes.txt" / "x")], capsys)
    assert line.startswith("idg-evaluate: error: --out ") and "is not a folder" in line  # NotADirectoryError after the model
    assert "is a file, not a folder" in _refused(["--images", str(photos), "--out", str(tmp_path / "notes.txt")], capsys)
    assert "--pair-with" in _refused(["--images", str(photos), *out, "--pair-with", str(tmp_path / "gone.csv")], capsys)


@pytest.mark.parametrize("option", ["--limit", "--rise-step", "--batch-size"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_idg_evaluate_counts_must_be_at_least_one(option: str, value: str, tmp_path: Path, no_model: None,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``--limit 0`` had run every image and ``--limit -1`` all but one; ``--rise-step 0`` divided by zero."""
    photos = write_photos(tmp_path / "photos", 1)
    line = _refused(["--images", str(photos), "--out", str(tmp_path / "out"), option, value], capsys)
    assert f"argument {option}: must be at least 1" in line


def test_idg_evaluate_workers_may_be_zero_not_negative(tmp_path: Path, no_model: None, capsys: pytest.CaptureFixture[str]) -> None:
    photos = write_photos(tmp_path / "photos", 1)
    assert "argument --workers: must be at least 0" in _refused(["--images", str(photos), "--workers", "-1"], capsys)
    assert "expected a whole number" in _refused(["--images", str(photos), "--limit", "two"], capsys)


def test_idg_evaluate_names_a_model_or_device_it_cannot_load(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluate, "evaluate_folder", _not_called)
    photos = write_photos(tmp_path / "photos", 1)
    common = ["--images", str(photos), "--out", str(tmp_path / "out"), "--device", "cpu"]
    line = _refused([*common, "--model", "resnet18"], capsys)  # a ValueError traceback
    assert "--model resnet18 could not be loaded: unknown model 'resnet18'" in line
    line = _refused([*common, "--model", f"x=torchscript:{tmp_path / 'x.ts'}", "--models-file", str(tmp_path / "none.toml")], capsys)
    assert "could not be loaded" in line and "none.toml does not exist" in line
    assert "--device 'gpu' is not a device" in _refused([*common, "--device", "gpu"], capsys)  # a RuntimeError traceback
    if not torch.cuda.is_available():
        assert "CUDA is not available" in _refused([*common, "--device", "cuda"], capsys)


def test_idg_evaluate_is_the_programs_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        evaluate.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: idg-evaluate ")  # it had been __main__.py


# idg-calibrate


@pytest.fixture
def no_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the model or calibrating fails the test: --out and --photos are checked first."""
    monkeypatch.setattr("idg_models.sources.load_entry", _not_called)
    monkeypatch.setattr(calibrate_cli, "calibrate", _not_called)


def _calibrate_refuses(argv: list[str], caplog: pytest.LogCaptureFixture) -> str:
    caplog.clear()
    assert calibrate_cli.main(["--model", "m=torchscript:/m.ts", "--device", "cpu", *argv]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    return errors[0]


def test_idg_calibrate_checks_out_before_the_work(tmp_path: Path, no_calibration: None, caplog: pytest.LogCaptureFixture) -> None:
    photos = ["--photos", str(write_photos(tmp_path / "photos", 2))]
    (tmp_path / "notes.txt").write_text("not a calibration")
    assert "is not JSON" in _calibrate_refuses([*photos, "--out", str(tmp_path / "notes.txt")], caplog)  # had been after 45 s
    assert (tmp_path / "notes.txt").read_text() == "not a calibration"
    (tmp_path / "other.json").write_text('{"models": {}}')
    assert "not one idg-calibrate wrote" in _calibrate_refuses([*photos, "--out", str(tmp_path / "other.json")], caplog)
    folder = tmp_path / "results"
    folder.mkdir()
    line = _calibrate_refuses([*photos, "--out", str(folder)], caplog)  # [Errno 21] after the work, and a stray results.tmp
    assert "is a folder" in line and not (tmp_path / "results.tmp").exists()
    line = _calibrate_refuses([*photos, "--out", str(tmp_path / "notes.txt" / "c.json")], caplog)  # [Errno 17] File exists
    assert "notes.txt is not a folder" in line
    assert "is not a regular file" in _calibrate_refuses([*photos, "--out", "/dev/null"], caplog)


def test_idg_calibrate_checks_photos_before_the_model_loads(tmp_path: Path, no_calibration: None,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    out = ["--out", str(tmp_path / "c.json")]
    (tmp_path / "a.png").write_bytes(b"")
    assert "is not a folder" in _calibrate_refuses(["--photos", str(tmp_path / "a.png"), *out], caplog)  # had said "does not exist"
    assert "does not exist" in _calibrate_refuses(["--photos", str(tmp_path / "none"), *out], caplog)
    (tmp_path / "empty").mkdir()
    assert "no photos" in _calibrate_refuses(["--photos", str(tmp_path / "empty"), *out], caplog)
    assert "--device 'gpu' is not a device" in _calibrate_refuses(["--photos", str(tmp_path), *out, "--device", "gpu"], caplog)
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("value", ["0", "-3"])
def test_idg_calibrate_batch_size_is_at_least_one(value: str, tmp_path: Path, no_calibration: None,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # 0 had been taken (the default), -3 a torch error after the model loaded
        calibrate_cli.main(["--model", "m", "--photos", str(tmp_path), "--batch-size", value])
    assert exc.value.code == 2 and "argument --batch-size: must be at least 1" in capsys.readouterr().err


def test_idg_calibrate_adds_to_an_existing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An existing calibration file passes the check and keeps its other models (the command adds to it)."""
    torch.jit.save(torch.jit.script(Bf16Trap(wrong=False).eval()), tmp_path / "same.ts")
    (tmp_path / "models.toml").write_text("[models.same]\ninput_size = 32\nresize_size = 36\nmean = [0.5, 0.5, 0.5]\n"
                                          "std = [0.25, 0.25, 0.25]\n")
    out = tmp_path / "calib.json"
    model = bf16_trap_classifier(wrong=False)
    earlier = Calibration("earlier", model.source, weights_sha256(model), "fp32", Paired(0.0, 0.1, 3), Paired(0.0, 0.1, 3), 3, "/p")
    write_calibration(out, earlier)
    argv = ["--model", f"same=torchscript:{tmp_path / 'same.ts'}", "--models-file", str(tmp_path / "models.toml"),
            "--photos", str(write_photos(tmp_path / "photos", 2)), "-n", "2", "--curve-steps", "4", "--device", "cpu",
            "--batch-size", "1", "--out", str(out)]
    assert calibrate_cli.main(argv) == 0
    assert "written to" in capsys.readouterr().out
    stored = read_calibrations(out)
    assert set(stored) == {"earlier", "same"} and stored["earlier"] == earlier
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_write_calibration_leaves_no_tmp_file_when_it_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = bf16_trap_classifier(wrong=False)
    cal = Calibration("trap", model.source, weights_sha256(model), "bf16", Paired(0.0, 0.1, 3), Paired(0.0, 0.1, 3), 3, "/p")
    folder = tmp_path / "results"
    folder.mkdir()
    with pytest.raises((ValueError, OSError)):
        write_calibration(folder, cal)  # a folder: the rename had failed and left results.tmp
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"] and not any(folder.iterdir())

    path = tmp_path / "calib.json"
    write_calibration(path, cal)
    before = path.read_text()

    def full_disk(self: Path, target: Any) -> NoReturn:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_calibration(path, replace(cal, model="other"))
    assert path.read_text() == before and json.loads(before)["models"].keys() == {"trap"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.json", "results"]
