"""May this model run in bf16? Measure it on your own photos, and keep bf16 only where faithfulness stays.

A calibration explains ``N`` photos with IDG at the ``fast`` preset twice, once in IEEE fp32 (the
reference: the model as loaded, TF32 off) and once the way the service would run it in bf16 (autocast,
batch norm folded), each scored by RISE insertion and deletion in its own precision, on the class the
fp32 model predicts. The two scores are paired per photo; bf16 is **kept only where both 95% intervals
of (bf16 − fp32) include 0 or favour bf16** (higher insertion, lower deletion): the rule of
``benchmarks/gpu_variants.py``, whose statistics live here (:func:`paired_against`,
:func:`keeps_faithfulness`, :func:`insertion_deletion`). With fewer than two photos nothing is known,
and the answer is fp32.

``idg-calibrate`` (:func:`main`) measures one ``IDG_MODELS`` entry and writes the decision and its
numbers to a JSON file, one entry per model name, that the service reads at start-up
(``IDG_CALIBRATION_FILE``); ``IDG_CALIBRATE_IMAGES`` calibrates at start-up instead. A stored
decision is used only for the model it measured: same source, same weights (:func:`weights_sha256`).
On the CPU the command works alike (bf16 autocast there is slower, not faster, and the service keeps
IEEE fp32 on the CPU whatever the decision); on CUDA the decision picks bf16 or TF32 for ``auto``
(:func:`~idg_models.speed.default_precision`).

    idg-calibrate --model cnn=torchscript:/models/cnn.ts --models-file /models/models.toml \\
        --photos /my/photos -n 64 --out calib.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from idg_core.heatmap import saliency
from idg_core.methods import idg
from idg_core.metrics import METRICS, deletion, insertion
from idg_core.metrics.curves import mean_ci
from idg_core.model_calls import default_batch_size
from idg_core.preprocess import decode_image, image_files
from idg_core.presets import preset_params
from idg_models.calibration import DEFAULT_CURVE_STEPS, KEEP_METRICS, Calibration, Paired, _cell
from idg_models.cli_args import count
from idg_models.cli_args import device as cli_device
from idg_models.speed import fold_batchnorm, set_tf32
from idg_models.zoo import ImageClassifier

log = logging.getLogger(__name__)

FORMAT = "idg-calibration/1"
DEFAULT_PHOTOS = 64
"""Photos a calibration uses by default (the first of the folder, by name)."""


def paired_difference(candidate: Sequence[float | None], reference: Sequence[float | None], *,
                      lower_is_better: bool = False) -> Paired:
    """Per-image ``candidate − reference`` (negated where lower is better), images where either is None left out."""
    sign = -1.0 if lower_is_better else 1.0
    diffs = [sign * (a - b) for a, b in zip(candidate, reference, strict=True) if a is not None and b is not None]
    return Paired(*mean_ci(diffs))


def paired_against(scores: Mapping[str, Sequence[float | None]],
                   reference: Mapping[str, Sequence[float | None]]) -> dict[str, Paired]:
    """Every metric of ``scores`` paired against ``reference``, signed by its direction (:data:`idg_core.metrics.METRICS`)."""
    return {m: paired_difference(scores[m], reference[m], lower_is_better=not METRICS[m].higher_is_better) for m in scores}


def keeps_faithfulness(paired: Mapping[str, Paired]) -> bool:
    """Faithfulness kept: the insertion and deletion intervals both include 0 or favour the candidate."""
    return all(m in paired and paired[m].within_noise_or_better for m in KEEP_METRICS)


def insertion_deletion(model: ImageClassifier, x: Tensor, maps: Tensor, *, step: int, batch_size: int) -> dict[str, list[float | None]]:
    """Insertion and deletion AUC per image of the ``(B, H, W)`` saliency ``maps``, scored by ``model`` in its
    own precision (blur and substrate from its preprocessing, as the evaluation does)."""
    p = model.preprocessing
    maps = maps.to(x.device)
    ins = insertion(model, x, maps, mean=p.mean, std=p.std, step=step, batch_size=batch_size)
    dele = deletion(model, x, maps, substrate=p.mean, step=step, batch_size=batch_size)
    return {"insertion": [c.auc for c in ins], "deletion": [c.auc for c in dele]}


def weights_sha256(model: ImageClassifier) -> str:
    """SHA-256 of the model's state (every parameter and buffer, normalisation included, by name): a
    stored calibration is used only for the weights it measured."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def photo_files(folder: Path, n: int) -> list[Path]:
    """The first ``n`` photo files of ``folder`` (JPEG, PNG, ...; by name); a ``ValueError`` sentence where there are none."""
    if not folder.exists():
        raise ValueError(f"photo folder {folder} does not exist")
    if not folder.is_dir():
        raise ValueError(f"photo folder {folder} is not a folder")
    files = image_files(folder)[:n]
    if not files:
        raise ValueError(f"no photos (JPEG, PNG) in {folder}")
    return files


def load_photos(model: ImageClassifier, folder: Path, n: int) -> tuple[Tensor, list[Path]]:
    """The first ``n`` photos of ``folder`` (JPEG, PNG, ...; by name) as the model's input, and their paths."""
    files = photo_files(folder, n)
    images = []
    for f in files:
        try:
            images.append(model.prepare(decode_image(f.read_bytes())))
        except ValueError as err:  # ImageDecodeError and its kinds
            raise ValueError(f"photo {f}: {err}") from err
    return torch.stack(images), files


def _view(model: ImageClassifier, net: torch.nn.Module, autocast: torch.dtype | None) -> ImageClassifier:
    """``model``'s preprocessing around ``net`` (shared, not copied) in this autocast dtype, on its device."""
    view = ImageClassifier(model.name, net, model.preprocessing, model.class_names).to(model.mean.device)
    view.autocast_dtype = autocast
    return view


def calibrate(model: ImageClassifier, folder: Path, *, photos: int = DEFAULT_PHOTOS, batch_size: int | None = None,
              curve_steps: int = DEFAULT_CURVE_STEPS, fold_bn: bool = True) -> Calibration:
    """Measure bf16 against IEEE fp32 on the first ``photos`` photos of ``folder``, on ``model``'s device.

    ``model`` is the model as loaded (in eval mode; untouched: bf16 runs on a view of it, batch norm
    folded into copies where ``fold_bn``, as the service folds it). TF32 is off while it runs and
    restored after."""
    started = time.perf_counter()
    device = model.mean.device
    batch_size = batch_size or default_batch_size(device)
    x, files = load_photos(model, folder, photos)
    x = x.to(device)
    step = max(1, math.ceil(x.shape[-2] * x.shape[-1] / curve_steps))
    reference = _view(model, model.net, None)
    candidate = _view(model, fold_batchnorm(model.net) if fold_bn else model.net, torch.bfloat16)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    set_tf32(False)
    try:
        with torch.no_grad():
            targets = torch.cat([reference(chunk).argmax(1) for chunk in x.split(batch_size)]).tolist()
        scores = {}
        for name, m in (("fp32", reference), ("bf16", candidate)):
            result = idg(m, x, "mean", targets, batch_size=batch_size, **preset_params("idg", "fast"))
            maps = torch.stack([saliency(a) for a in result.attributions])
            scores[name] = insertion_deletion(m, x, maps, step=step, batch_size=batch_size)
            log.info("calibration of %s: %s done (%d photos)", model.name, name, len(files))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    paired = paired_against(scores["bf16"], scores["fp32"])
    means = {name: {m: float(sum(v for v in s[m] if v is not None) / max(1, sum(v is not None for v in s[m]))) for m in s}
             for name, s in scores.items()}
    cal = Calibration(
        model=model.name, source=model.source, weights_sha256=weights_sha256(model),
        decision="bf16" if keeps_faithfulness(paired) else "fp32", insertion=paired["insertion"], deletion=paired["deletion"],
        photos=len(files), folder=str(folder.resolve()), fp32=means["fp32"], bf16=means["bf16"], curve_steps=curve_steps, fold_bn=fold_bn,
        device=str(device), date=time.strftime("%Y-%m-%d %H:%M:%S"), seconds=round(time.perf_counter() - started, 2))
    log.info("calibration: %s", cal.summary())
    return cal


def read_calibrations(path: Path) -> dict[str, Calibration]:
    """``{model name: calibration}`` from a file :func:`write_calibration` wrote; a ``ValueError`` sentence otherwise."""
    if not path.is_file():
        raise ValueError(f"calibration file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"calibration file {path} is not JSON: {err}") from err
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("models"), dict):
        raise ValueError(f"calibration file {path} is not one idg-calibrate wrote (format {FORMAT!r} with a 'models' object)")
    out = {}
    for name, entry in data["models"].items():
        where = f"calibration file {path}, model {name!r}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not a calibration written by idg-calibrate")
        out[name] = Calibration.from_json(entry, where)
    return out


def check_calibration_path(path: Path) -> dict[str, Calibration]:
    """What the calibration file at ``path`` holds now (nothing where it is still to be made); a ``ValueError``
    sentence where :func:`write_calibration` could not add to it: a folder, not a regular file, not a file
    idg-calibrate wrote, or under something that is not a folder. Makes nothing: the command checks ``--out``
    before the work."""
    if path.is_dir():
        raise ValueError(f"calibration file {path} is a folder: give a file in it, e.g. {path / 'calibration.json'}")
    if path.exists() and not path.is_file():
        raise ValueError(f"calibration file {path} is not a regular file")
    if path.is_file():
        return read_calibrations(path)
    here = path.absolute().parent
    while not here.exists():
        here = here.parent
    if not here.is_dir():
        raise ValueError(f"calibration file {path} cannot be made: {here} is not a folder")
    if not os.access(here, os.W_OK | os.X_OK):
        raise ValueError(f"calibration file {path} cannot be made: the folder {here} is not writable")
    return {}


def write_calibration(path: Path, cal: Calibration) -> None:
    """Add (or replace) ``cal`` under its model's name in the JSON file at ``path``, keeping the file's other models.
    Written whole or not at all: a write that fails leaves the file as it was, and no ``.tmp`` file beside it."""
    models = {name: c.to_json() for name, c in check_calibration_path(path).items()}
    models[cal.model] = cal.to_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps({"format": FORMAT, "models": models}, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def mismatch(cal: Calibration, model: ImageClassifier, fingerprint: str | None = None) -> str | None:
    """Why ``cal`` does not describe ``model`` (another source, other weights), or None where it does."""
    if cal.source != model.source:
        return f"it measured {cal.source}, not {model.source}"
    if (fingerprint or weights_sha256(model)) != cal.weights_sha256:
        return "it measured other weights (the model's file changed since)"
    return None


def table(cal: Calibration) -> str:
    """The short table ``idg-calibrate`` prints."""
    rows = [("metric", "fp32 mean", "bf16 mean", "bf16 - fp32 (> 0 favours bf16)", "within noise or better")]
    for m in KEEP_METRICS:
        p: Paired = getattr(cal, m)
        rows.append((m, f"{cal.fp32.get(m, float('nan')):.4f}", f"{cal.bf16.get(m, float('nan')):.4f}",
                     _cell(p).replace(" (> 0: bf16 deletes better)", ""), "yes" if p.within_noise_or_better else "no"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = (f"{cal.model} ({cal.source}): IDG {cal.preset} on {cal.photos} photos of {cal.folder}, {cal.device}, "
            f"{cal.curve_steps}-step curves, {cal.seconds:.0f} s")
    verdict = (f"decision: {cal.decision} " + ("(bf16 keeps faithfulness)" if cal.bf16_kept else
                                               "(bf16 is not shown to keep faithfulness: the service keeps float32)"))
    return "\n".join([head, *lines, verdict]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="idg-calibrate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an IDG_MODELS entry: a packaged name, ARCH=/path, or NAME=KIND:...")
    p.add_argument("--weights", default=None, help="a bare torchvision ARCH's weights file (other entries ignore it)")
    p.add_argument("--models-file", type=Path, default=None, help="the service's IDG_MODELS_FILE (input size, mean, std, labels)")
    p.add_argument("--photos", type=Path, required=True, help="a folder of your photos (JPEG, PNG, ...; the first N by name)")
    p.add_argument("-n", "--count", type=int, default=DEFAULT_PHOTOS, help=f"photos to use (default {DEFAULT_PHOTOS}; at least 2)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:N or cpu")
    p.add_argument("--batch-size", type=count(1), default=None, help="images per model call (default 128 on CUDA, 8 on CPU)")
    p.add_argument("--curve-steps", type=int, default=DEFAULT_CURVE_STEPS, help="steps of each insertion and deletion curve")
    p.add_argument("--fold-bn", action=argparse.BooleanOptionalAction, default=True,
                   help="fold batch norm in the bf16 run, as the service does by default (IDG_FOLD_BN)")
    p.add_argument("--out", type=Path, default=Path("calibration.json"),
                   help="the JSON file to add this model's decision to (IDG_CALIBRATION_FILE); default calibration.json")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.count < 2 or args.curve_steps < 1:
        p.error("--count must be at least 2 and --curve-steps at least 1")
    from idg_models.sources import load_entry  # the loaders pull in optional extras only when used

    try:
        # before the model loads and the work (a minute or more), so a wrong --out or --photos fails at once
        check_calibration_path(args.out)
        photo_files(args.photos, args.count)
        device = cli_device(args.device)
        model = load_entry(args.model, args.weights, args.models_file, device)
        cal = calibrate(model, args.photos, photos=args.count, batch_size=args.batch_size, curve_steps=args.curve_steps,
                        fold_bn=args.fold_bn)
        write_calibration(args.out, cal)
    except (ValueError, OSError, ImportError, RuntimeError) as err:
        log.error("idg-calibrate: %s", err)
        return 2
    sys.stdout.write(table(cal) + f"written to {args.out} (IDG_CALIBRATION_FILE={args.out} uses it)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
