"""Where the photos are.

- ``samples/`` in the checkout: the few freely licensed photos the README, the docs, the page and the tests use
  (``samples/README.md`` says where each comes from and its licence).
- The 65-photo ImageNet folder (file name = ``WNID_class``) that the evaluation, the speed benchmarks and a few tests
  read: not in the checkout. ``IDG_IMAGENET_SAMPLES`` names it; without it, ``../shared/data/imagenet-samples`` beside
  the checkout where that exists. What needs it and does not find it says so in one line (tests skip).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "samples"
ESPRESSO = PHOTOS / "coffee.jpg"
"""A cup of espresso: EfficientNet-Lite0 says 'espresso' (class 967) at 0.96."""
CAT = PHOTOS / "cat.jpg"
"""A tabby cat: 'tiger cat' (282) at 0.39 before 'Egyptian cat' at 0.36, an unsure prediction."""
IMAGENET_SAMPLES_SETTING = "IDG_IMAGENET_SAMPLES"
DEFAULT_IMAGENET_SAMPLES = ROOT.parent / "shared" / "data" / "imagenet-samples"


def imagenet_samples() -> Path:
    """The ImageNet sample folder: ``IDG_IMAGENET_SAMPLES``, else ``../shared/data/imagenet-samples`` (may not exist)."""
    given = os.environ.get(IMAGENET_SAMPLES_SETTING, "").strip()
    return Path(given) if given else DEFAULT_IMAGENET_SAMPLES


def imagenet_photos(limit: int | None = None) -> list[Path]:
    """The folder's ``*.JPEG`` files by name (the first ``limit``); [] where the folder is missing."""
    folder = imagenet_samples()
    photos = sorted(folder.glob("*.JPEG")) if folder.is_dir() else []
    return photos[:limit] if limit is not None else photos


def missing_imagenet_samples() -> str:
    """The one line a test or tool says when the folder is not there."""
    return (f"the ImageNet sample photos are not at {imagenet_samples()}: set {IMAGENET_SAMPLES_SETTING} to a folder of "
            "WNID_class.JPEG photos")


def bench_photos() -> Path:
    """The photos a benchmark reads by default: the ImageNet folder where it exists (labels from the file names), else
    the checkout's ``samples/`` (4 photos; the model's own predictions are then the targets)."""
    folder = imagenet_samples()
    return folder if folder.is_dir() else PHOTOS
