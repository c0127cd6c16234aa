"""``torch.compile`` at a fixed set of batch sizes, so a service never compiles under traffic.

A compiled network is specialised to the shapes it saw: every new batch size is a new graph, which
costs seconds to minutes while the requests of that round wait, and past dynamo's recompile limit
(8 graphs a function) PyTorch silently falls back to eager. :class:`FixedBatchCompiled` instead
compiles each size of a short list (``sizes``) once, during warm-up before the service says it is
ready (:func:`warm_up_compiled`), and runs a call of ``n`` images at the smallest listed size
``>= n``, padded with copies of its last image (only the first ``n`` outputs are returned, so the
padding takes no part in any gradient: eval-mode networks treat the images of a batch
independently). A call larger than the largest size runs in pieces of that size.

Every graph dynamo hands to the backend is counted (:attr:`FixedBatchCompiled.graphs`); one
compiled after warm-up is logged as a warning and counted in :attr:`FixedBatchCompiled.late_graphs`,
which the service exports (``idg_compile_late_graphs``), so a recompile under traffic is seen.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

Backend = Callable[[torch.fx.GraphModule, list[Tensor]], Callable[..., Any]]

DEFAULT_BACKEND = "inductor"
"""The ``torch.compile`` backend :class:`FixedBatchCompiled` uses unless told (tests use ``eager``,
which captures the same graphs without generating code)."""

MAX_SIZES = 5
"""Sizes :func:`default_compile_sizes` lists at most: each is two graphs (forward only, and forward
for an input gradient), and each graph is a compilation at start-up."""


def default_compile_sizes(max_batch: int) -> tuple[int, ...]:
    """The largest batch and its halves, at most :data:`MAX_SIZES` of them: 8 -> (1, 2, 4, 8),
    128 -> (8, 16, 32, 64, 128). A call smaller than the smallest size is padded up to it (on a GPU
    a batch of 8 costs about what a batch of 1 does)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [max_batch]
    while len(sizes) < MAX_SIZES and sizes[-1] > 1:
        sizes.append(max(1, sizes[-1] // 2))
    return tuple(sorted(set(sizes)))


def _entry_point(net: nn.Module, size: int) -> Callable[[Tensor], Tensor]:
    """A function that calls ``net``, with a code object of its own. Dynamo keeps its graphs per code
    object, at most ``recompile_limit`` (8) of them, then runs the function eagerly without a word;
    that limit is a per-thread setting (a ContextVar), so raising it where the models load would not
    reach the worker thread. One entry point per batch size holds two graphs, far from it."""

    def call(x: Tensor) -> Tensor:
        out: Tensor = net(x)
        return out

    code = call.__code__.replace(co_name=f"batch_{size}", co_qualname=f"batch_{size}")
    return types.FunctionType(code, call.__globals__, f"batch_{size}", call.__defaults__, call.__closure__)


class FixedBatchCompiled(nn.Module):
    """``net`` compiled once per batch size in ``sizes`` (``backend``: a ``torch.compile`` backend
    name or callable, :data:`DEFAULT_BACKEND` by default). Calls run padded to the nearest listed size; the
    padded batch keeps the input's memory format (channels-last or not), so it meets the same graph."""

    def __init__(self, net: nn.Module, sizes: Sequence[int], *, backend: str | Backend | None = None) -> None:
        super().__init__()
        if not sizes or min(sizes) < 1:
            raise ValueError(f"compile sizes must be a non-empty list of positive batch sizes, got {list(sizes)}")
        self.sizes = tuple(sorted({int(s) for s in sizes}))
        self.graphs = 0
        self.late_graphs = 0
        self.warm = False
        self.compile_seconds: float | None = None
        backend = backend or DEFAULT_BACKEND
        import torch._dynamo  # here, not at the top: its import slows the start of every process that compiles nothing

        inner: Backend = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend

        def counting(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
            self.graphs += 1
            if self.warm:
                self.late_graphs += 1
                shapes = [tuple(t.shape) for t in example_inputs if isinstance(t, Tensor)][:1]
                log.warning("torch.compile: a new graph after warm-up (input %s; sizes %s): a grad mode, dtype or "
                            "memory format the warm-up did not see", shapes, self.sizes)
            return inner(gm, example_inputs)

        self.net = net  # the network itself, uncompiled (and its parameters, under their own names)
        self.entries = {size: torch.compile(_entry_point(net, size), backend=counting, dynamic=False) for size in self.sizes}

    def size_for(self, n: int) -> int:
        """The batch size a call of ``n`` images runs at (the largest size for a piece of a bigger call)."""
        return next((s for s in self.sizes if s >= n), self.sizes[-1])

    def forward(self, x: Tensor) -> Tensor:
        n, top = x.shape[0], self.sizes[-1]
        if n > top:
            return torch.cat([self(piece) for piece in x.split(top)])
        size = self.size_for(n)
        if size > n:
            channels_last = x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
            x = torch.cat([x, x[-1:].expand(size - n, *x.shape[1:])])
            x = x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        out: Tensor = self.entries[size](x)
        return out[:n] if size > n else out


def compiled_part(model: nn.Module) -> FixedBatchCompiled | None:
    """The :class:`FixedBatchCompiled` network of an ``ImageClassifier`` (its ``net``), or None."""
    net = getattr(model, "net", None)
    return net if isinstance(net, FixedBatchCompiled) else None


def warm_up_compiled(model: nn.Module, input_size: int) -> float:
    """Compile every graph ``model`` (an ``ImageClassifier`` whose ``net`` is a
    :class:`FixedBatchCompiled`) will run: each size forward only and forward with an input
    gradient, through the model itself (so its autocast and memory format are those of traffic).
    Returns the seconds it took (0 for a model not compiled); afterwards a new graph is a warning."""
    part = compiled_part(model)
    if part is None:
        return 0.0
    device = next((b.device for b in model.buffers()), torch.device("cpu"))
    started = time.perf_counter()
    for size in part.sizes:
        x = torch.rand(size, 3, input_size, input_size, device=device)
        with torch.no_grad():
            model(x)
        x.requires_grad_(True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(model(x)[:, 0].sum(), x)
        if not bool(torch.isfinite(grad).all()):
            raise RuntimeError(f"compiled model gave a non-finite input gradient at batch {size}")
    part.compile_seconds = time.perf_counter() - started
    part.warm = True
    log.info("compiled %d graphs at batch sizes %s in %.1f s", part.graphs, part.sizes, part.compile_seconds)
    return part.compile_seconds
