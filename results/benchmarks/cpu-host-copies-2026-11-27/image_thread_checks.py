"""Image-thread checks of one 224-pixel map, one torch thread: the old and new concentration and finiteness, interleaved."""
import time

import numpy as np
import torch

from app.monitoring.prometheus import concentration

torch.set_num_threads(1)
a = torch.randn(3, 224, 224, generator=torch.Generator().manual_seed(0))


def old_concentration(attributions: torch.Tensor, top: float = 0.05) -> float:
    m = attributions.detach().float().abs().sum(0).flatten()
    k = max(1, round(top * m.numel()))
    return float(m.topk(k).values.sum()) / float(m.sum())


def ms(f, n: int = 300) -> float:
    f()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e3


for r in (1, 2, 3):
    print(f"round {r}: concentration old {ms(lambda: old_concentration(a)):.3f} ms new {ms(lambda: concentration(a)):.3f} ms; "
          f"finite old {ms(lambda: bool(torch.isfinite(a).all())):.3f} ms new {ms(lambda: bool(np.isfinite(a.numpy()).all())):.3f} ms; "
          f"values {old_concentration(a):.7f} {concentration(a):.7f}")
