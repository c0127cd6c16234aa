"""Fixed batch sizes for model calls, warmed before a service says it is ready.

On CUDA the first forward-and-gradient pass at a batch size the process has not run costs far more
than the next one at that size: cuDNN picks (and for some engines JIT-compiles) its kernels per
shape, seconds the first time against milliseconds again (measured: docs/results/speed.md). A batching
service whose calls take however many path points a round gathered (1 to 128) meets a new size on nearly
every call under fresh traffic.

:class:`CallShapes` fixes the set: a call of ``n`` images runs at :meth:`CallShapes.size_for` (the smallest
listed size ``>= n``), padded with copies of its last image; only the first ``n`` rows' outputs are read and
only they take part in the gradient (an eval-mode network treats the images of a batch independently), so
padding changes no answer. The service's warm-up (:func:`idg_serving.warm_up.warm_call_shapes`) runs every
size forward-only and with an input gradient before ready; a call at a (size, kind) that warm-up did not run
is counted in :attr:`CallShapes.unwarmed_calls` (the service exports it and it must stay 0 under traffic).
With ``sizes`` empty calls run at their own size (no padding) and the count shows how many met a size the
warm-up had not.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


def power_of_two_sizes(largest: int, smallest: int = 1) -> tuple[int, ...]:
    """``smallest``, doubled up to ``largest`` (``largest`` included even if not a power of two):
    (8, 128) -> 8, 16, 32, 64, 128. A call is padded to at most twice its rows."""
    if largest < 1 or smallest < 1:
        raise ValueError(f"batch sizes must be >= 1, got smallest {smallest}, largest {largest}")
    sizes = []
    size = min(smallest, largest)
    while size < largest:
        sizes.append(size)
        size *= 2
    sizes.append(largest)
    return tuple(sizes)


@dataclass
class CallShapes:
    """The batch sizes a model is called at (empty: any) and which (size, gradient) pairs were warmed."""

    sizes: tuple[int, ...] = ()
    warmed: set[tuple[int, bool]] = field(default_factory=set)
    warm_seconds: float | None = None
    """Seconds the warm-up took; None until it ran (calls before it are not counted)."""
    unwarmed_calls: int = 0
    padded_rows: int = 0
    """Rows of padding added to calls (a measure of the compute fixed sizes waste)."""
    real_rows: int = 0
    use_graphs: bool = False
    """Capture each (size, kind) as a CUDA graph during warm-up (:mod:`idg_models.cuda_graphs`)."""
    graphs: dict[tuple[int, bool], Any] = field(default_factory=dict)
    """The captured :class:`~idg_models.cuda_graphs.GraphedCall` s, by (size, gradient)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if any(s < 1 for s in self.sizes):
            raise ValueError(f"call sizes must be positive, got {list(self.sizes)}")
        self.sizes = tuple(sorted(set(self.sizes)))

    @property
    def fixed(self) -> bool:
        return bool(self.sizes)

    @property
    def largest(self) -> int | None:
        return self.sizes[-1] if self.sizes else None

    def size_for(self, n: int) -> int:
        """The batch size a call of ``n`` rows runs at (``n`` itself when sizes are not fixed)."""
        if not self.sizes:
            return n
        if n > self.sizes[-1]:
            raise ValueError(f"a call of {n} rows is larger than the largest call size {self.sizes[-1]}")
        return next(s for s in self.sizes if s >= n)

    def fill(self, available: int, tolerance: float = 0.25) -> int:
        """How many of ``available`` rows one call should take: all of them (up to the largest size)
        when padding them up wastes at most ``tolerance`` of the call, else the largest size below
        (the rest goes in the next call, which is padded less). Without fixed sizes: all."""
        if not self.sizes or available <= 0:
            return max(available, 0)
        n = min(available, self.sizes[-1])
        size = self.size_for(n)
        if (size - n) <= tolerance * size:
            return n
        below = [s for s in self.sizes if s <= n]
        return below[-1] if below else n

    def note(self, size: int, rows: int, grad: bool) -> None:
        """Count one call of ``rows`` real rows run at ``size`` (after warm-up: whether it was warmed)."""
        with self._lock:
            if self.warm_seconds is None:
                self.warmed.add((size, grad))
                return
            self.padded_rows += size - rows
            self.real_rows += rows
            if (size, grad) not in self.warmed:
                self.unwarmed_calls += 1
                if self.fixed and (self.unwarmed_calls <= 3 or self.unwarmed_calls % 100 == 0):
                    log.warning("a model call at batch size %d (%s) that warm-up did not run (%d such calls)",
                                size, "with gradient" if grad else "forward", self.unwarmed_calls)

    def info(self) -> dict[str, object]:
        return {"call_sizes": list(self.sizes) or None, "warm_seconds": self.warm_seconds, "cuda_graphs": bool(self.graphs),
                "warmed": sorted({s for s, _ in self.warmed}), "unwarmed_calls": self.unwarmed_calls}
