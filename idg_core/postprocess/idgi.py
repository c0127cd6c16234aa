"""IDGI (Yang, Wang and Bilen, CVPR 2023, "IDGI: A Framework to Eliminate Explanation Noise from
Integrated Gradients", https://arxiv.org/abs/2303.14242), Algorithm 1, as a post-step.

For path points ``x_j`` in path order with outputs ``f_j = F(x_j)`` and gradients ``g_j = ∇F(x_j)``,
every step keeps only the part of its output change ``d_j = f_{j+1} - f_j`` along the gradient::

    IDGI = Σ_{j < n-1}  g_j ⊙ g_j · d_j / ‖g_j‖²

so each step's attribution sums to ``d_j`` and the whole map to ``f_{n-1} - f_0`` (completeness on
the sampled points). It needs no model pass beyond the path method's own: :func:`idgi_plan` wraps
a path method's plan, keeps the points, outputs and gradients of its gradient pass and replaces
the attributions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from idg_core.methods import METHODS
from idg_core.types import Answer, AttributionResult, Plan, Query, to_device

IDGI_METHODS = tuple(name for name, m in METHODS.items() if m.straight_path)
"""Methods whose gradient pass is one straight path (IDGI applies to them): ``Method.straight_path``."""


def idgi(alphas: Tensor, values: Tensor, grads: Tensor) -> Tensor:
    """IDGI attribution ``(C, H, W)`` from path positions ``alphas (n,)``, outputs ``values (n,)`` and
    gradients ``grads (n, C, H, W)`` (any order: sorted by α here). Steps whose gradient is zero
    everywhere contribute nothing."""
    if grads.dim() != 4 or values.shape[0] != grads.shape[0] or alphas.shape[0] != grads.shape[0]:
        raise ValueError(f"need n alphas, n values and (n, C, H, W) grads, "
                         f"got {tuple(alphas.shape)}, {tuple(values.shape)}, {tuple(grads.shape)}")
    order = to_device(torch.argsort(alphas.detach().cpu(), stable=True), grads.device)
    g = grads[order].double()
    f = to_device(values.detach(), grads.device)[order].double()  # the values may be on the host (a service's GPU calls)
    sq = g * g  # (n, C, H, W)
    norm = sq.flatten(1).sum(1)  # (n,)
    d = f[1:] - f[:-1]  # (n - 1,)
    scale = torch.where(norm[:-1] > 0, d / norm[:-1].clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(d))
    return (sq[:-1] * scale.view(-1, 1, 1, 1)).sum(0).to(grads.dtype)


def idgi_plan(inner: Plan) -> Plan:
    """Wrap a path method's plan: its queries and answers pass through unchanged; from the last
    gradient query on a straight path (``Query.path`` with ``grad=True``) the attributions are
    recomputed with :func:`idgi`. No extra model pass."""
    captured: tuple[Query, Answer] | None = None
    try:
        queries = inner.send(None)  # type: ignore[arg-type]
        while True:
            answers = yield queries
            paths = [(q, a) for q, a in zip(queries, answers, strict=True) if q.grad and q.direction is not None and a.grads is not None]
            captured = paths[-1] if paths else captured  # the last gradient pass along the path: kept until the end
            queries = inner.send(answers)
            del answers, paths  # views of whole model calls' outputs: not kept while the next calls run
    except StopIteration as stop:
        result: AttributionResult = stop.value
    finally:
        inner.close()
    if captured is None:
        raise ValueError(f"IDGI needs a method with one gradient pass along a straight path ({', '.join(IDGI_METHODS)})")
    q, a = captured
    assert a.grads is not None
    result.attributions = idgi(q.alphas, a.values, a.grads).unsqueeze(0)
    return result
