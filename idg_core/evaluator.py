"""The one path evaluator: every method's points go through :func:`evaluate_queries`.

Points of all queries (of all images, targets and methods) are chunked together into model calls
of at most ``batch_size`` images; forward-only rows run under ``torch.no_grad()``, gradient rows
take ``torch.autograd.grad`` of the selected outputs with respect to the input only (no parameter
``.grad`` is touched, no graph or hook outlives the call). A driver that must stop work between
model calls (a request past its deadline) passes ``skip``, asked before every call.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from idg_core.types import Answer, AttributionResult, Model, Plan, Query

log = logging.getLogger(__name__)


def default_batch_size(device: torch.device) -> int:
    """Images per model call when the caller gives none: 8 on CPU, where small batches stay in
    cache (IDG-50/50 on EfficientNet-Lite0, 2-core Xeon: 2.8 s at 8, 4.0 s at 32, 7.7 s at 64),
    128 on CUDA (ResNet-101 on an H100: 118 ms at 32, 90 ms at 128, 80 ms at 512 with 4x the memory)."""
    return 128 if device.type == "cuda" else 8


@dataclass
class CallStats:
    """Cost accounting: model calls, and images per call (forward and with gradient)."""

    calls: int = 0
    forward_images: int = 0
    backward_images: int = 0
    call_sizes: list[int] = field(default_factory=list)

    def record(self, size: int, grad: bool) -> None:
        self.calls += 1
        self.forward_images += size
        self.backward_images += size if grad else 0
        self.call_sizes.append(size)


@dataclass(frozen=True)
class _Rows:
    """What a model call selects per row, known on the host (so the hot path never waits on the
    device to decide): target classes, which rows want a probability, and their extremes."""

    targets: Tensor  # (rows,) long, on the device
    is_prob: Tensor | None  # (rows,) bool on the device, None when no row wants a probability
    max_target: int

    @staticmethod
    def of(queries: Sequence[Query], chunk: list[tuple[int, int, int]], device: torch.device) -> _Rows:
        targets = [queries[qi].target for qi, a, b in chunk for _ in range(b - a)]
        probs = [queries[qi].output == "probability" for qi, a, b in chunk for _ in range(b - a)]
        is_prob = torch.tensor(probs, device=device) if any(probs) else None
        return _Rows(torch.tensor(targets, dtype=torch.long, device=device), is_prob, max(targets))


def _select(logits: Tensor, rows: _Rows) -> Tensor:
    """Per row: the target's logit, or its softmax probability where the row asks for one."""
    if rows.max_target >= logits.shape[1]:
        raise ValueError(f"target must be < {logits.shape[1]} (the model's classes), got {rows.max_target}")
    chosen = logits.gather(1, rows.targets.view(-1, 1)).squeeze(1)
    if rows.is_prob is not None:
        probs = torch.softmax(logits, dim=1).gather(1, rows.targets.view(-1, 1)).squeeze(1)
        chosen = torch.where(rows.is_prob, probs, chosen)
    return chosen


def _run_chunk(model: Model, inputs: Tensor, rows: _Rows, grad: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """One model call: selected outputs, their input gradients (or None) and all logits."""
    if not grad:
        with torch.no_grad():
            logits = model(inputs)
            return _select(logits, rows).detach(), None, logits.detach()
    inputs = inputs.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = model(inputs)
        chosen = _select(logits, rows)
        (grads,) = torch.autograd.grad(chosen.sum(), inputs)
    return chosen.detach(), grads.detach(), logits.detach()


def _chunks(
    queries: Sequence[Query], index: list[int], batch_size: int, skip: Callable[[int], bool] | None,
) -> Iterator[list[tuple[int, int, int]]]:
    """The rows of ``queries[index]`` in chunks of (query, start, stop) segments of at most
    ``batch_size`` rows, planned one chunk at a time: before each, queries ``skip`` answers True
    for are left out of the rest."""
    todo = deque((qi, 0) for qi in index)  # (query, first row not yet in a chunk)
    while todo:
        if skip is not None:
            todo = deque(item for item in todo if not skip(item[0]))
        chunk: list[tuple[int, int, int]] = []
        room = batch_size
        while todo and room:
            qi, start = todo[0]
            stop = min(queries[qi].n, start + room)
            chunk.append((qi, start, stop))
            room -= stop - start
            if stop == queries[qi].n:
                todo.popleft()
            else:
                todo[0] = (qi, stop)
        if chunk:
            yield chunk


def evaluate_queries(
    model: Model, queries: Sequence[Query], batch_size: int, stats: CallStats | None = None,
    skip: Callable[[int], bool] | None = None,
) -> list[Answer]:
    """Answer every query; model calls hold at most ``batch_size`` points from any queries.

    ``skip(i)``, if given, is called before every model call for each query ``i`` that still has
    rows to evaluate; once it returns True no more of that query's rows are evaluated, and its
    :class:`Answer` is left incomplete (the caller must drop it). Rows already in the call run."""
    answers: list[Answer] = []
    for q in queries:
        dev = q.origin.device
        grads = torch.empty((q.n, *q.origin.shape[-3:]), device=dev, dtype=q.origin.dtype) if q.grad else None
        answers.append(Answer(torch.empty(q.n, device=dev), grads, torch.empty(q.n, dtype=torch.long, device=dev)))
    for grad in (False, True):
        index = [i for i, q in enumerate(queries) if q.grad == grad and q.n > 0]
        for chunk in _chunks(queries, index, batch_size, skip):
            # inputs: (rows, C, H, W) gathered from the segments of several queries
            inputs = torch.cat([queries[qi].points(a, b) for qi, a, b in chunk])
            values, grads, logits = _run_chunk(model, inputs, _Rows.of(queries, chunk, inputs.device), grad)
            top1 = logits.argmax(1)
            if stats is not None:
                stats.record(inputs.shape[0], grad)
            row = 0
            for qi, a, b in chunk:
                ans = answers[qi]
                ans.values[a:b] = values[row : row + b - a].to(ans.values.dtype)
                ans.top1[a:b] = top1[row : row + b - a]
                if grads is not None and ans.grads is not None:
                    ans.grads[a:b] = grads[row : row + b - a]
                if queries[qi].full:
                    part = logits[row : row + b - a]
                    ans.all_logits = part if ans.all_logits is None else torch.cat([ans.all_logits, part])
                row += b - a
    return answers


def run_plans(model: Model, plans: Sequence[Plan], batch_size: int, stats: CallStats | None = None) -> list[AttributionResult]:
    """Drive several plans in lock-step, pooling the points of all of them into shared model calls.
    A plan may yield an empty list (a checkpoint between long host steps); it gets one back."""
    results: list[AttributionResult | None] = [None] * len(plans)
    pending: dict[int, list[Query]] = {}
    for i, _plan in enumerate(plans):
        _advance(plans, i, None, pending, results)
    while pending:
        owners = list(pending)
        flat = [q for i in owners for q in pending[i]]
        answers = evaluate_queries(model, flat, batch_size, stats)
        pos = 0
        for i in owners:
            k = len(pending[i])
            _advance(plans, i, answers[pos : pos + k], pending, results)
            pos += k
    return [r for r in results if r is not None]


def _advance(
    plans: Sequence[Plan], i: int, answers: list[Answer] | None, pending: dict[int, list[Query]], results: list[AttributionResult | None],
) -> None:
    try:
        pending[i] = plans[i].send(answers)  # type: ignore[arg-type]
    except StopIteration as stop:
        pending.pop(i, None)
        results[i] = stop.value
