"""IDG at the ``fast`` preset (8 probe, 16 main steps) in bf16 autocast against IEEE fp32, per photo: the cosine of the
two attributions, with the paper's finite-difference importance and with ``importance=exact`` (∇F·(x−x'), no logit
differences). EfficientNet-Lite0, trained weights, black baseline, the class fp32 predicts.

    python results/benchmarks/cpu-bf16-logit-steps-2026-11-27/importance_bf16.py [N]
"""

import glob
import sys

import torch
from PIL import Image

from idg_core import idg
from idg_models.zoo import load_model


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def main() -> None:
    torch.set_num_threads(2)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    model = load_model("efficientnet_lite0").eval()
    print("| photo | cosine bf16 to fp32, finite difference | exact |")
    print("|---|---|---|")
    for file in sorted(glob.glob("../shared/data/imagenet-samples/*"))[:n]:
        x = model.prepare(Image.open(file).convert("RGB")).unsqueeze(0)
        with torch.no_grad():
            target = int(model(x).argmax())
        row = []
        for importance in ("finite_difference", "exact"):
            maps = []
            for dtype in (None, torch.bfloat16):
                model.autocast_dtype = dtype
                maps.append(idg(model, x, "black", target, steps=16, probe_steps=8, importance=importance).attributions)
            model.autocast_dtype = None
            row.append(cosine(*maps))
        print(f"| {file.rsplit('/', 1)[-1]} | {row[0]:.3f} | {row[1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
