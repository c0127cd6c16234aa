"""Why did the compiled bf16 IDG of a tiny network disagree with eager on one image (cosine -0.40)?

Separates the two explanations of the failed GPU test
``tests/core/test_compiled.py::test_inductor_on_cuda_in_bf16_matches_eager_with_no_late_graph``:
- the compiled path is wrong: padding rows leak into real rows, or a stale graph runs; then the
  compiled logits of an image depend on what else is in its batch, and compiled-vs-eager differs in
  fp32 as much as in bf16;
- bf16 itself: IDG's weights are the derivative of the logit along the path, which on a tiny random
  network is small and flat, so bf16 rounding (different between inductor's fused kernels and eager)
  moves them a lot; then eager bf16 against eager fp32 disagrees as much, and IG (uniform points, no
  weights) agrees.

    python -m benchmarks.compiled_check   (CUDA; prints a table, writes --out/compiled-check.json)
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch.nn.functional import cosine_similarity

from idg_core import idg, ig
from idg_models import tune
from idg_models.compiled import warm_up_compiled
from tests.models import small_classifier

log = logging.getLogger(__name__)


def _cos(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    return [round(float(v), 4) for v in cosine_similarity(a.flatten(1).float(), b.flatten(1).float())]


def check(device: torch.device) -> dict[str, Any]:
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(6)).to(device)
    targets = [0, 1, 2]
    out: dict[str, Any] = {}
    for precision in ("fp32", "bf16"):
        compiled = tune(small_classifier().to(device), precision=precision, channels_last=True, compile=True, compile_sizes=[4, 8])
        warm_up_compiled(compiled, 16)
        eager = tune(small_classifier().to(device), precision=precision, channels_last=True)
        with torch.no_grad():
            together = compiled(x)  # 3 images padded to 4
            alone = torch.cat([compiled(x[i : i + 1]) for i in range(3)])  # each padded to 4 with copies of itself
            mixed = compiled(torch.cat([x, torch.rand(5, 3, 16, 16, device=device)]))[:3]  # at 8, beside other images
            plain = eager(x)
        out[f"{precision}: compiled logits, batch-mates changed (max abs diff)"] = float((together - alone).abs().max())
        out[f"{precision}: compiled logits, 5 other images beside (max abs diff)"] = float((together - mixed).abs().max())
        out[f"{precision}: compiled vs eager logits (max abs diff)"] = float((together - plain).abs().max())
        kw: dict[str, Any] = {"steps": 9, "probe_steps": 5, "batch_size": 8}
        got, want = idg(compiled, x, "mean", targets, **kw), idg(eager, x, "mean", targets, **kw)
        out[f"{precision}: IDG compiled vs eager, cosine per image"] = _cos(got.attributions, want.attributions)
        ig_got, ig_want = ig(compiled, x, "mean", targets, steps=9, batch_size=8), ig(eager, x, "mean", targets, steps=9, batch_size=8)
        out[f"{precision}: IG compiled vs eager, cosine per image"] = _cos(ig_got.attributions, ig_want.attributions)
        out[f"{precision}: eager logit rise along the path (target logit at x minus at the baseline)"] = [
            round(float(v), 4) for v in want.values[:, -1] - want.values[:, 0]] if want.values.dim() == 2 else None
    e32 = tune(small_classifier().to(device), precision="fp32", channels_last=True)
    e16 = tune(small_classifier().to(device), precision="bf16", channels_last=True)
    kw = {"steps": 9, "probe_steps": 5, "batch_size": 8}
    out["eager bf16 vs eager fp32 IDG, cosine per image"] = _cos(idg(e16, x, "mean", targets, **kw).attributions,
                                                                  idg(e32, x, "mean", targets, **kw).attributions)
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = ap.parse_args(argv)
    result = check(torch.device(args.device))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compiled-check.json").write_text(json.dumps(result, indent=1))
    for k, v in result.items():
        log.info("%s: %s", k, v)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
