"""Model calls replayed as CUDA graphs, one per fixed call size and kind (forward, or forward with an
input gradient).

With fixed call sizes (:mod:`idg_core.call_shapes`) every call of a model has one of a few shapes, so
each can be captured once during warm-up and replayed: one launch instead of hundreds. A network of
many small kernels (EfficientNet-Lite0: depthwise convolutions) is otherwise bound by the host
launching them: the device counts as busy while its SMs sit mostly idle (measured: docs/results/speed.md).

A graph reads its inputs from static tensors and writes static outputs: :meth:`GraphedCall.run` copies
a call's (padded) inputs and row selection in, replays, and returns copies of the real rows' outputs
(the next replay overwrites the static ones, and a pipelined caller may not have read them yet). Every
row of the graph selects its own target (padding rows whatever they held), so real rows' answers are
those of an eager call. All graphs of a model share one memory pool, replayed one at a time on one
stream. A network that cannot be captured (a host synchronisation inside, a data-dependent shape) is
run eagerly (:func:`capture_graphs` returns no graphs and says why). The service captures them in its warm-up
(:mod:`idg_serving.warm_up`); a library user gets them with :func:`graphed_shapes` and passes the result to any
method (``idg(model, x, "mean", t, shapes=graphed_shapes(model, (128,), 224))``). After a failed capture, torch 2.11's
CUDA default generator refuses draws on the device ("Offset increment outside graph capture"); the service
draws its random numbers on the CPU (AGI's and SmoothGrad's seeded generators, the warm-up's inputs), so it is
not affected.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import Tensor

from idg_core.call_shapes import CallShapes
from idg_core.model_calls import RowSelect, run_call
from idg_core.types import Model

log = logging.getLogger(__name__)


class GraphedCall:
    """One model call of ``size`` images (``grad``: with the input gradient) captured as a CUDA graph."""

    def __init__(self, model: Model, size: int, grad: bool, input_size: int, device: torch.device, pool: Any = None,
                 channels: int = 3) -> None:
        self.size, self.grad = size, grad
        # drawn on the CPU: after a capture on another thread, PyTorch 2.11's CUDA generator refused a draw outside
        # one ("Offset increment outside graph capture encountered unexpectedly")
        self.x = torch.rand(size, channels, input_size, input_size).to(device)
        self.targets = torch.zeros(size, dtype=torch.long, device=device)
        self.is_prob = torch.zeros(size, dtype=torch.bool, device=device)
        rows = RowSelect(self.targets, self.is_prob, 0)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # the warm calls PyTorch asks for before a capture (allocator, cuDNN, autograd)
            for _ in range(2):
                run_call(model, self.x, rows, grad)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = run_call(model, self.x, rows, grad)

    def run(self, inputs: Tensor, rows: RowSelect) -> tuple[Tensor, Tensor | None, Tensor]:
        """The outputs of :func:`idg_core.model_calls.run_call` for ``inputs`` (padded to this size) and ``rows``."""
        n = int(rows.targets.shape[0])
        classes = self.out[2].shape[1]
        if rows.max_target >= classes:
            raise ValueError(f"target must be < {classes} (the model's classes), got {rows.max_target}")
        self.x.copy_(inputs)
        self.targets[:n].copy_(rows.targets)
        if rows.is_prob is None:
            self.is_prob.zero_()
        else:
            self.is_prob[:n].copy_(rows.is_prob)
        self.graph.replay()
        values, grads, logits = self.out
        return values[:n].clone(), None if grads is None else grads[:n].clone(), logits[:n].clone()


def capture_graphs(model: Model, sizes: tuple[int, ...], input_size: int, device: torch.device) -> dict[tuple[int, bool], GraphedCall]:
    """Every (size, kind) of ``model`` captured, sharing one memory pool; empty if any capture fails
    (logged: the model then runs eagerly, without graphs)."""
    graphs: dict[tuple[int, bool], GraphedCall] = {}
    pool = torch.cuda.graph_pool_handle()
    try:
        for size in sorted(sizes, reverse=True):  # the largest first: the pool's blocks then fit the smaller ones
            for grad in (False, True):
                graphs[(size, grad)] = GraphedCall(model, size, grad, input_size, device, pool)
    except Exception as err:  # noqa: BLE001 - any capture failure means: run this model eagerly
        log.warning("CUDA graphs not used for %s: %s: %s (its calls run eagerly)", type(model).__name__, type(err).__name__,
                    str(err)[:300])
        torch.cuda.synchronize(device)
        return {}
    return graphs


def graphed_shapes(model: Model, sizes: tuple[int, ...], input_size: int, device: torch.device | str | None = None) -> CallShapes:
    """Fixed call sizes ``sizes`` for ``model`` with each (size, kind) captured as a CUDA graph, for a method's
    ``shapes=``: its calls are padded to these sizes and replay the graphs (one launch each instead of hundreds).
    ``device``: the model's (default: where its first parameter is); on a CPU, or where the network cannot be
    captured, the sizes stay fixed and the calls run eagerly. Calls are counted as warmed from here on (``warm_seconds``:
    the capture's time)."""
    started = time.perf_counter()
    dev = torch.device(device) if device is not None else next(model.parameters()).device  # type: ignore[attr-defined]
    shapes = CallShapes(tuple(sizes), use_graphs=dev.type == "cuda")
    if shapes.use_graphs:
        shapes.graphs = capture_graphs(model, shapes.sizes, input_size, dev)
    shapes.warmed = {(s, g) for s in shapes.sizes for g in (False, True)}
    shapes.warm_seconds = time.perf_counter() - started
    return shapes
