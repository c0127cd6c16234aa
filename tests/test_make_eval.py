"""``make eval`` with no folder named evaluates the checkout's own photos in ``samples/`` (issue #73: it had defaulted to a
folder outside the checkout), writing to ``out/evaluation`` so that ``results/evaluation`` stays the 65 ImageNet photos'."""

from __future__ import annotations

import csv
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "python").exists(),
                                reason="needs make and the project's .venv")


def _planned(*args: str) -> list[str]:
    """The evaluation command ``make eval`` runs (``make -n``: printed, not run), split as the shell splits it."""
    env = {k: v for k, v in os.environ.items() if k not in ("IDG_IMAGENET_SAMPLES", "IMAGES", "EVAL_OUT", "EVAL_ARGS")}
    lines = subprocess.run(["make", "--no-print-directory", "-n", "eval", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=60, check=True).stdout.splitlines()
    return shlex.split(next(line for line in lines if "idg_evaluation" in line))


def test_make_eval_reads_samples_unless_told_otherwise() -> None:
    cmd = _planned()
    assert cmd[cmd.index("--images") + 1] == "samples" and cmd[cmd.index("--out") + 1] == "out/evaluation"
    cmd = _planned("IMAGES=/photos/imagenet")
    assert cmd[cmd.index("--images") + 1] == "/photos/imagenet" and cmd[cmd.index("--out") + 1] == "results/evaluation"


@pytest.mark.slow  # ~40 s: a real evaluation, if a tiny one
def test_what_make_eval_runs_on_samples_explains_each_photos_prediction(tmp_path: Path) -> None:
    """The command make plans, run for real on samples/ (a tiny TorchScript model and one row, to stay short): the
    names carry no WNID, so the targets are the model's predictions and the report claims no Top-1."""
    from tests.models import tiny_model_maker

    entry = tiny_model_maker().MAKERS["torchscript"](tmp_path)
    out = tmp_path / "eval"
    args = (f"--model {entry} --models-file {tmp_path / 'models.toml'} --device cpu --methods IG --no-ablation --no-road "
            "--rise-step 576 --workers 0 --limit 2")
    cmd = _planned(f"EVAL_OUT={out}", f"EVAL_ARGS={args}")
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with (out / "per_image.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["image"] for r in rows] == sorted(p.name for p in (ROOT / "samples").glob("*.jpg"))[:2]
    assert all(r["label"] == "" and 0 <= int(r["pred"]) < 10 for r in rows)
    assert "Top-1 not known" in (out / "summary.md").read_text()
