"""Warm each fixed call size before the service says it is ready (see :mod:`idg_core.call_shapes` for why),
and on CUDA capture each as a graph (:mod:`idg_models.cuda_graphs`)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from idg_core.call_shapes import CallShapes
from idg_core.model_calls import RowSelect, run_call
from idg_core.types import Model
from idg_models.cuda_graphs import capture_graphs


def warm_call_shapes(model: Model, shapes: CallShapes, input_size: int, device: torch.device,
                     sizes: Sequence[int] | None = None) -> float:
    """Run ``model`` forward-only and with an input gradient at each size (``sizes``, default the
    fixed ones), through the evaluator's own call so autocast and memory format are those of
    traffic; then mark the shapes warm. Returns the seconds it took."""
    started = time.perf_counter()
    for size in sizes or shapes.sizes:
        x = torch.rand(size, 3, input_size, input_size).to(device)  # drawn on the CPU: see idg_models.cuda_graphs
        rows = RowSelect(torch.zeros(size, dtype=torch.long, device=device), None, 0)
        for grad in (False, True):
            _, grads, _ = run_call(model, x, rows, grad)
            if grads is not None and not bool(torch.isfinite(grads).all()):
                raise RuntimeError(f"the model gave a non-finite input gradient at batch {size}")
            shapes.warmed.add((size, grad))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        if shapes.use_graphs and shapes.fixed and sizes is None:
            shapes.graphs = capture_graphs(model, shapes.sizes, input_size, device)
            torch.cuda.synchronize(device)
    shapes.warm_seconds = time.perf_counter() - started
    return shapes.warm_seconds
