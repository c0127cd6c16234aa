"""One file per method; :data:`METHODS` is the registry the library, the service, the page and the
evaluation dispatch through. A method's file declares everything about it in its ``METHOD``
(:class:`Method`): its parameters once (``PARAMS``, :mod:`idg_core.methods.params`), which of them
count steps, its presets, its cost bound, its summary and whether IDGI applies.

Adding a method: write ``methods/<name>.py`` ending in ``METHOD = Method(...)``, and add it to the
tuple below."""

from __future__ import annotations

from idg_core.budget import WorkBound
from idg_core.methods import agi as _agi
from idg_core.methods import eg as _eg
from idg_core.methods import gradcam as _gradcam
from idg_core.methods import gradcam_pp as _gradcam_pp
from idg_core.methods import guided_ig as _guided_ig
from idg_core.methods import idg as _idg
from idg_core.methods import idg_eg as _idg_eg
from idg_core.methods import ig as _ig
from idg_core.methods import la as _la
from idg_core.methods import left_ig as _left_ig
from idg_core.methods import spectral_ig as _spectral_ig
from idg_core.methods._common import DEFAULT_PRESET, POST_STEPS, PRESET_BASE, PRESET_NAMES, Method, Preset, run_method
from idg_core.methods.agi import agi, agi_plan
from idg_core.methods.eg import eg, eg_plan
from idg_core.methods.gradcam import gradcam, gradcam_plan
from idg_core.methods.gradcam_pp import gradcam_pp, gradcam_pp_plan
from idg_core.methods.guided_ig import guided_ig, guided_ig_plan
from idg_core.methods.idg import idg, idg_plan
from idg_core.methods.idg_eg import idg_eg, idg_eg_plan
from idg_core.methods.ig import ig, ig_plan
from idg_core.methods.la import la, la_plan
from idg_core.methods.left_ig import left_ig, left_ig_plan
from idg_core.methods.params import InvalidParameter, Param, Params
from idg_core.methods.spectral_ig import spectral_ig, spectral_ig_plan

__all__ = [
    "DEFAULT_PRESET", "METHODS", "POST_STEPS", "PRESET_BASE", "PRESET_NAMES", "InvalidParameter", "Method", "Param", "Params", "Preset",
    "WorkBound", "agi", "agi_plan", "eg", "eg_plan", "gradcam", "gradcam_plan", "gradcam_pp", "gradcam_pp_plan", "guided_ig",
    "guided_ig_plan", "idg", "idg_eg", "idg_eg_plan", "idg_plan",
    "ig", "ig_plan", "la", "la_plan", "left_ig", "left_ig_plan", "run_method", "spectral_ig", "spectral_ig_plan",
]

METHODS: dict[str, Method] = {
    m.METHOD.name: m.METHOD
    for m in (_idg, _ig, _left_ig, _guided_ig, _agi, _eg, _idg_eg, _la, _spectral_ig, _gradcam, _gradcam_pp)
}
"""Every method by name, in the order the service and the page list them."""
