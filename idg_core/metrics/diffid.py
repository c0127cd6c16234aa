"""DiffID: insertion minus deletion on the same image (higher is better), one number that rewards a map for both
games at once. It has no model pass of its own: the evaluation's report computes it from each image's insertion and
deletion scores, as :attr:`~idg_core.metrics.curves.Metric.derived_from` declares."""

from __future__ import annotations

from idg_core.metrics.curves import Metric


def diffid(insertion: float, deletion: float) -> float:
    """One image's DiffID from its insertion and deletion AUCs."""
    return insertion - deletion


DIFFID = Metric("diffid", higher_is_better=True, derived_from=("insertion", "deletion"), combine=diffid,
                cost="none of its own: the image's insertion and deletion scores",
                summary="insertion − deletion on the same image")
