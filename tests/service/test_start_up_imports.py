"""What a server process imports before it can answer: not what only compiling or the faithfulness metrics need.

Every server process (IDG_PROCESSES starts several, a replacement starts one) and every tool pays its imports before
its first answer. ``torch._dynamo`` (for ``torch.compile``) cost 1.5 s of the 4.8 s of importing ``app.main`` on the
2-core VM and scipy (PIC's and ROAD's rebuilds) 0.5 s; both are imported where they are used.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported_after(module: str, candidates: tuple[str, ...]) -> list[str]:
    probe = f"import sys, {module}; print(' '.join(m for m in {candidates!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    return done.stdout.split()


def test_the_server_starts_without_importing_the_compiler_or_scipy() -> None:
    assert _imported_after("app.main", ("torch._dynamo", "scipy", "sympy")) == []


def test_the_metrics_still_find_scipy_where_they_rebuild_an_image() -> None:
    import numpy as np

    from idg_core.metrics.pic import blur_from_known_pixels
    from idg_core.metrics.road import spsolve_impute

    image = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    known = np.zeros((8, 8), dtype=bool)
    known[::2, ::2] = True
    rebuilt = blur_from_known_pixels(image, known)
    assert rebuilt.shape == image.shape and (rebuilt[known] == image[known]).all()
    keep = np.ones((8, 8), dtype=bool)
    keep[3:5, 3:5] = False
    flat = np.ones((3, 8, 8))
    assert np.allclose(spsolve_impute(flat, keep), 1.0)  # a constant image is rebuilt as itself
