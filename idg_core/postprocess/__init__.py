"""Post-steps that wrap any method's plan: IDGI and RankMix (no extra model pass) and SmoothGrad / VarGrad
(noisy copies whose points share the same model calls)."""

from idg_core.postprocess.compose import POSTPROCESS, build_plan, postprocess_bound
from idg_core.postprocess.idgi import IDGI_METHODS, idgi, idgi_plan
from idg_core.postprocess.rankmix import rank_mix, rankmix_plan, with_idgi
from idg_core.postprocess.smoothgrad import SMOOTH_KINDS, smooth_plan

__all__ = ["IDGI_METHODS", "POSTPROCESS", "SMOOTH_KINDS", "build_plan", "idgi", "idgi_plan", "postprocess_bound", "rank_mix",
           "rankmix_plan", "smooth_plan", "with_idgi"]
