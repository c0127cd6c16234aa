"""AIC, the accuracy information curve (PIC, Kapishnikov et al. 2019, https://arxiv.org/abs/1906.02825): as SIC, with
1 where the class is still the top one and 0 elsewhere; the area under it (higher is better). Computed with SIC from
the same rebuilds by :mod:`idg_core.metrics.pic`."""

from __future__ import annotations

from idg_core.metrics.curves import Metric
from idg_core.metrics.pic import PIC_COST

AIC = Metric("aic", higher_is_better=True, cost=PIC_COST,
             summary="accuracy information curve (PIC): as SIC, with 1 where the class is still the top one, else 0")
