"""SIC, the softmax information curve (PIC, Kapishnikov et al. 2019, https://arxiv.org/abs/1906.02825): the class's
softmax probability against the information (WebP size) of images rebuilt from the most salient pixels; the area
under it (higher is better). Computed with AIC from the same rebuilds by :mod:`idg_core.metrics.pic`."""

from __future__ import annotations

from idg_core.metrics.curves import Metric
from idg_core.metrics.pic import PIC_COST

SIC = Metric("sic", higher_is_better=True, cost=PIC_COST,
             summary="softmax information curve (PIC): the class's probability against the WebP size of images rebuilt from the "
                     "most salient pixels; an image predicted below 0.8 is skipped")
