"""The model calls: every method's points go through here (:func:`evaluate_queries`, :func:`run_plans`, and
the service's worker through :func:`prepare_call` / :func:`run_prepared` / :func:`book_call`). Named apart from
:mod:`idg_evaluation`, the benchmark tool.

Points of all queries (of all images, targets and methods) are chunked together into model calls
of at most ``batch_size`` images; forward-only rows run under ``torch.no_grad()``, gradient rows
take ``torch.autograd.grad`` of the selected outputs with respect to the input only (no parameter
``.grad`` is touched, no graph or hook outlives the call). A driver that must stop work between
model calls (a request past its deadline) passes ``skip``, asked before every call.

A call with a row that asks for the CAM layer's activations (``Query.features``: the CAM family) hooks the layer
:func:`run_feature_call` finds and takes the gradient with respect to its output too (:func:`run_feature_call`); it runs
eagerly, never as a CUDA graph.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch
from torch import Tensor

from idg_core.call_shapes import CallShapes
from idg_core.cam_layer import module_calls
from idg_core.types import Answer, Model, PlanOf, Query, to_device

log = logging.getLogger(__name__)
R = TypeVar("R")


def default_batch_size(device: torch.device) -> int:
    """Images per model call when the caller gives none: 8 on CPU, where small batches stay in
    cache, 128 on CUDA, where larger calls gain little more for their memory (measured: docs/results/speed.md)."""
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
class RowSelect:
    """What a model call selects per row, known on the host (so the hot path never waits on the
    device to decide): target classes, which rows want a probability, and their extremes; sent to
    the device without a synchronisation (:func:`idg_core.types.to_device`)."""

    targets: Tensor  # (rows,) long, on the device
    is_prob: Tensor | None  # (rows,) bool on the device, None when no row wants a probability
    max_target: int
    features: bool = False  # a row wants the CAM layer's activations and their gradient (Query.features)

    @staticmethod
    def of(queries: Sequence[Query], chunk: list[tuple[int, int, int]], device: torch.device) -> RowSelect:
        targets = [queries[qi].target for qi, a, b in chunk for _ in range(b - a)]
        probs = [queries[qi].output == "probability" for qi, a, b in chunk for _ in range(b - a)]
        is_prob = to_device(torch.tensor(probs), device) if any(probs) else None
        features = any(queries[qi].features for qi, _, _ in chunk)
        return RowSelect(to_device(torch.tensor(targets, dtype=torch.long), device), is_prob, max(targets), features)


def _select(logits: Tensor, rows: RowSelect) -> Tensor:
    """Per row: the target's logit, or its softmax probability where the row asks for one."""
    if rows.max_target >= logits.shape[1]:
        raise ValueError(f"target must be < {logits.shape[1]} (the model's classes), got {rows.max_target}")
    chosen = logits.gather(1, rows.targets.view(-1, 1)).squeeze(1)
    if rows.is_prob is not None:
        probs = torch.softmax(logits, dim=1).gather(1, rows.targets.view(-1, 1)).squeeze(1)
        chosen = torch.where(rows.is_prob, probs, chosen)
    return chosen


def _logits(out: object, rows: int) -> Tensor:
    """The model's output, checked from its shape alone (no wait for the device): ``(rows, classes)`` floats. A model
    returning more rows is refused rather than cut off silently, and other shapes fail here rather than deep in torch."""
    if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[0] != rows or not out.is_floating_point():
        got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"the model must return float logits of shape (batch, classes) = ({rows}, classes) for an input batch "
                         f"of {rows}, got {got}")
    return out


def run_call(model: Model, inputs: Tensor, rows: RowSelect, grad: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """One model call on ``inputs`` (``(size, C, H, W)``, possibly padded past the ``n`` rows of
    ``rows``): the selected outputs of the ``n`` real rows, their input gradients (or None) and their
    logits. Padding rows are computed but never read, and take no part in the gradient."""
    n = rows.targets.shape[0]
    if not grad:
        with torch.no_grad():
            logits = _logits(model(inputs), inputs.shape[0])[:n]
            return _select(logits, rows).detach(), None, logits.detach()
    inputs = inputs.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = _logits(model(inputs), inputs.shape[0])[:n]
        chosen = _select(logits, rows)
        (grads,) = torch.autograd.grad(chosen.sum(), inputs)
    return chosen.detach(), grads[:n].detach(), logits.detach()


NO_CAM_LAYER = "the model is not a torch.nn.Module and has no cam_target() method returning (forward function, layer module)"


def run_feature_call(model: Model, inputs: Tensor, rows: RowSelect) -> tuple[tuple[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
    """:func:`run_call` with a gradient, and the CAM layer's output for the ``n`` real rows with the selected outputs'
    gradient with respect to it: ``((values, grads, logits), (features, feature_grads))``.

    The layer: the one ``model.cam_target()`` returns with the function to run (an ``idg_models.ImageClassifier``'s:
    found once, or named in its models file), else, for a plain ``nn.Module``, the last spatial map of this very forward
    pass (:mod:`idg_core.cam_layer`). The layer's last spatial output in this thread's forward pass is the one read (a
    module called more than once, as EfficientNet-Lite's shared ReLU6: the head's); a ``ValueError`` says why where
    there is none."""
    find = getattr(model, "cam_target", None)
    if not callable(find) and not isinstance(model, torch.nn.Module):
        raise ValueError(NO_CAM_LAYER)
    forward, layer = find() if callable(find) else (model, None)
    n = rows.targets.shape[0]
    inputs = inputs.detach().requires_grad_(True)
    with torch.enable_grad():
        with module_calls(layer if layer is not None else model, itself=layer is not None) as seen:  # type: ignore[arg-type]
            logits = _logits(forward(inputs), inputs.shape[0])[:n]
        if layer is None:
            seen.cam_layer()  # the rule's checks: a map, and no token sequence after it
        if seen.last_map is None or not seen.last_map.requires_grad:
            raise ValueError(f"the model's CAM layer ({type(layer).__name__}) gave no (batch, channels, height, width) map "
                             "that the logits depend on in this forward pass")
        chosen = _select(logits, rows)
        grads, feature_grads = torch.autograd.grad(chosen.sum(), (inputs, seen.last_map))
    return (chosen.detach(), grads[:n].detach(), logits.detach()), (seen.last_map[:n].detach(), feature_grads[:n].detach())


@dataclass
class PreparedCall:
    """A model call made ready on the host side: its inputs gathered (and padded to a fixed size),
    what it selects per row, and where each row's answer goes (``chunk``: query, start, stop)."""

    inputs: Tensor
    rows: RowSelect
    grad: bool
    chunk: list[tuple[int, int, int]]
    features: tuple[Tensor, Tensor] | None = None
    """The CAM layer's output and its gradient for the real rows, once run (:func:`run_feature_call`)."""

    @property
    def n(self) -> int:
        return int(self.rows.targets.shape[0])

    @property
    def size(self) -> int:
        return int(self.inputs.shape[0])


def prepare_call(queries: Sequence[Query], chunk: list[tuple[int, int, int]], grad: bool,
                 shapes: CallShapes | None = None) -> PreparedCall:
    """Gather the points of ``chunk`` into one batch, padded to ``shapes``' size for it with copies of its last point.

    Each query writes its points straight into the batch (:meth:`Query.write_points`): building each query's points,
    concatenating them and padding the result would copy the batch three more times."""
    n = sum(b - a for _, a, b in chunk)
    size = shapes.size_for(n) if shapes is not None and shapes.fixed else n
    like = queries[chunk[0][0]].origin
    inputs = torch.empty((size, *like.shape[-3:]), dtype=like.dtype, device=like.device)
    row = 0
    for qi, a, b in chunk:  # (rows, C, H, W) from several queries
        queries[qi].write_points(a, b, inputs[row : row + b - a])
        row += b - a
    if size > n:
        inputs[n:] = inputs[n - 1 : n]
    return PreparedCall(inputs, RowSelect.of(queries, chunk, inputs.device), grad, chunk)


def run_prepared(model: Model, call: PreparedCall, graphs: Mapping[tuple[int, bool], Any] | None = None,
                 ) -> tuple[Tensor, Tensor | None, Tensor]:
    """:func:`run_call` on a prepared call, or the replay of its (size, kind)'s CUDA graph where ``graphs`` holds one
    (:mod:`idg_models.cuda_graphs`: the same outputs). A call with CAM rows runs eagerly, its layer's output and
    gradient kept in ``call.features``."""
    if call.rows.features:
        eager, call.features = run_feature_call(model, call.inputs, call.rows)
        return eager
    graph = (graphs or {}).get((call.size, call.grad))
    if graph is not None:
        out: tuple[Tensor, Tensor | None, Tensor] = graph.run(call.inputs, call.rows)
        return out
    return run_call(model, call.inputs, call.rows, call.grad)


def book_call(call: PreparedCall, queries: Sequence[Query], answers: list[Answer | None],
              out: tuple[Tensor, Tensor | None, Tensor], top1: Tensor | None = None) -> None:
    """Store a call's outputs (from :func:`run_call`) into the answers of its queries (None: not booked yet).

    A query whose rows all lie in this call (and that has no answer yet) is answered with views of the call's
    outputs: its gradients are not copied, nor memory allocated for them (at 224 pixels, 9.6 MB a copy for an
    explanation's 16 gradient rows, and the page faults of a new buffer). A query split over calls gets a buffer
    of its own, filled call by call. The values, the arg-max classes (``top1``: computed here when None) and the logits
    may be host copies of a call on a GPU (the service's device stage makes them, so its plans read them without a wait)
    while the gradients stay on the GPU: a split query's buffers are made where each output is."""
    values, grads, logits = out
    top1 = logits.argmax(1) if top1 is None else top1
    row = 0
    for qi, a, b in call.chunk:
        q, rows = queries[qi], slice(row, row + b - a)
        ans = answers[qi]
        if ans is None and a == 0 and b == q.n:
            answers[qi] = Answer(values[rows].to(torch.get_default_dtype()), None if grads is None or not q.grad else grads[rows],
                                 top1[rows], logits[rows] if q.full else None, *_feature_rows(call, q, rows))
        else:
            if ans is None:
                ans = answers[qi] = _allocated_answer(q, values.device)
            ans.values[a:b] = values[rows].to(ans.values.dtype)
            ans.top1[a:b] = top1[rows]
            if grads is not None and ans.grads is not None:
                ans.grads[a:b] = grads[rows]
            if q.full:
                part = logits[rows]
                ans.all_logits = part if ans.all_logits is None else torch.cat([ans.all_logits, part])
            _store_features(ans, q.n, a, b, *_feature_rows(call, q, rows))
        row += b - a


def _feature_rows(call: PreparedCall, q: Query, rows: slice) -> tuple[Tensor | None, Tensor | None]:
    """The CAM layer's output and gradient for ``rows`` of ``call`` where query ``q`` asked for them."""
    if not q.features or call.features is None:
        return None, None
    return call.features[0][rows], call.features[1][rows]


def _store_features(ans: Answer, n: int, a: int, b: int, features: Tensor | None, grads: Tensor | None) -> None:
    """Rows ``a:b`` of an answer of ``n`` rows given over several calls: the CAM layer's (buffers made at the first)."""
    if features is None or grads is None:
        return
    if ans.features is None or ans.feature_grads is None:
        ans.features, ans.feature_grads = features.new_empty((n, *features.shape[1:])), grads.new_empty((n, *grads.shape[1:]))
    ans.features[a:b] = features
    ans.feature_grads[a:b] = grads


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


def _allocated_answer(q: Query, host: torch.device | None = None) -> Answer:
    """Buffers for all ``q.n`` rows of a query answered over several calls: the gradients on the query's device, the
    values and arg-max classes on ``host`` (where the calls' values are; default: the query's device)."""
    dev = q.origin.device
    at = dev if host is None else host
    grads = torch.empty((q.n, *q.origin.shape[-3:]), device=dev, dtype=q.origin.dtype) if q.grad else None
    return Answer(torch.empty(q.n, device=at), grads, torch.empty(q.n, dtype=torch.long, device=at))


def booked_answers(queries: Sequence[Query], answers: Sequence[Answer | None]) -> list[Answer]:
    """``answers`` after :func:`book_call`, a query no call booked (no rows, or skipped) given one of the right
    shapes, unfilled."""
    return [_allocated_answer(q) if ans is None else ans for q, ans in zip(queries, answers, strict=True)]


def evaluate_queries(
    model: Model, queries: Sequence[Query], batch_size: int, stats: CallStats | None = None,
    skip: Callable[[int], bool] | None = None, shapes: CallShapes | None = None, graphs: bool = True,
) -> list[Answer]:
    """Answer every query; model calls hold at most ``batch_size`` points from any queries (with
    ``shapes`` fixed: at most its largest size, each call padded to one of its sizes; a call whose (size, kind)
    has a CUDA graph in ``shapes.graphs`` replays it instead of running the model eagerly, unless ``graphs`` is false:
    a graph's inputs are buffers of its own, which a replay on another stream may be reading).

    ``skip(i)``, if given, is called before every model call for each query ``i`` that still has
    rows to evaluate; once it returns True no more of that query's rows are evaluated, and its
    :class:`Answer` is left incomplete (the caller must drop it). Rows already in the call run."""
    answers: list[Answer | None] = [None] * len(queries)
    if shapes is not None and shapes.largest is not None:
        batch_size = min(batch_size, shapes.largest)
    for grad in (False, True):
        index = [i for i, q in enumerate(queries) if q.grad == grad and q.n > 0]
        for chunk in _chunks(queries, index, batch_size, skip):
            call = prepare_call(queries, chunk, grad, shapes)
            out = run_prepared(model, call, shapes.graphs if shapes is not None and graphs else None)
            if stats is not None:
                stats.record(call.size, grad)
            if shapes is not None:
                shapes.note(call.size, call.n, grad)
            book_call(call, queries, answers, out)
    return booked_answers(queries, answers)


Rows = list[tuple[int, int, int]]
"""Rows of a plan's current step: (query index, start, stop)."""


class PlanState:
    """One plan driven a step at a time, by :func:`run_plans` here and by the service's worker
    (whose jobs are plan states): ``pending`` holds the queries of the current step, ``take``
    hands out their rows for a model call (all at once, or a budget of one kind), ``part`` makes
    a query of some rows, ``store`` keeps the model's answer to them, and once the step is
    answered ``advance`` sends the answers to the plan and takes its next step or its result."""

    def __init__(self, plan: PlanOf[Any]) -> None:
        self.plan = plan
        self.pending = None
        self.answers: list[Answer | None] = []
        self.taken = 0
        """Rows of ``pending`` already taken into a model call."""
        self.result: Any = None

    def advance(self, answers: list[Answer] | None = None) -> bool:
        """Send ``answers`` (None: start the plan); True while it goes on (its next step is
        pending), False once it returned (its value in ``result``). A plan's error propagates."""
        try:
            pending = self.plan.send(answers)  # type: ignore[arg-type]  # None starts a generator
        except StopIteration as stop:
            self.pending, self.result = None, stop.value
            return False
        self.pending = pending
        self.answers = [_empty_answer(q) if q.n == 0 else None for q in pending]
        self.taken = 0
        return True

    @property
    def pending(self) -> list[Query] | None:
        """The queries of the current step (None once the plan returned)."""
        return self._pending

    @pending.setter
    def pending(self, queries: list[Query] | None) -> None:
        self._pending = queries
        self._sizes = [q.n for q in queries or []]
        self._step_rows = sum(self._sizes)
        """The step's rows, counted once: the scheduler reads ``rows`` of every waiting job before every call
        (128 jobs of several queries each: thousands of tensor-shape reads per call on the worker thread)."""

    def step_answers(self) -> list[Answer]:
        return [a for a in self.answers if a is not None]

    @property
    def rows(self) -> int:
        """Points of the current step not yet taken into a model call."""
        return self._step_rows - self.taken

    @property
    def step_answered(self) -> bool:
        return self.taken == self._step_rows and all(a is not None for a in self.answers)

    @property
    def next_grad(self) -> bool:
        """Whether the next row not yet taken needs a gradient."""
        pos = 0
        for q, n in zip(self._pending or [], self._sizes, strict=True):
            pos += n
            if pos > self.taken:
                return q.grad
        return False

    def ready_rows(self, grad: bool) -> int:
        """Rows of the step not yet taken that one call of kind ``grad`` could take (those before the first
        row of the other kind)."""
        count = pos = 0
        for q, n in zip(self._pending or [], self._sizes, strict=True):
            start = max(self.taken - pos, 0)
            pos += n
            if start >= n:
                continue
            if q.grad != grad:
                break
            count += n - start
        return count

    def take(self, budget: int | None = None, grad: bool | None = None) -> Rows:
        """Up to ``budget`` (None: every) rows of the step not taken yet, in order and, with ``grad``
        given, while they are of that kind."""
        out: Rows = []
        pos = 0
        for qi, (q, n) in enumerate(zip(self._pending or [], self._sizes, strict=True)):
            start = max(self.taken - pos, 0)
            pos += n
            if start >= n:
                continue
            if budget == 0 or (grad is not None and q.grad != grad):
                break
            stop = n if budget is None else min(n, start + budget)
            out.append((qi, start, stop))
            if budget is not None:
                budget -= stop - start
            self.taken += stop - start
        return out

    def part(self, qi: int, start: int, stop: int) -> Query:
        """Rows ``start:stop`` of pending query ``qi`` as a query of their own."""
        q = (self.pending or [])[qi]
        if start == 0 and stop == q.n:
            return q
        if q.direction is None:
            return replace(q, origin=q.origin[start:stop], alphas=q.alphas[start:stop])
        return replace(q, alphas=q.alphas[start:stop])

    def store(self, qi: int, start: int, stop: int, ans: Answer) -> None:
        """Keep the model's answer to rows ``start:stop`` of pending query ``qi``."""
        n = self._sizes[qi]
        if start == 0 and stop == n:
            self.answers[qi] = ans
            return
        full = self.answers[qi]
        if full is None:
            full = self.answers[qi] = Answer(
                ans.values.new_empty(n), None if ans.grads is None else ans.grads.new_empty((n, *ans.grads.shape[1:])),
                ans.top1.new_empty(n), None if ans.all_logits is None else ans.all_logits.new_empty((n, ans.all_logits.shape[1])),
            )
        full.values[start:stop] = ans.values
        full.top1[start:stop] = ans.top1
        if full.grads is not None and ans.grads is not None:
            full.grads[start:stop] = ans.grads
        if full.all_logits is not None and ans.all_logits is not None:
            full.all_logits[start:stop] = ans.all_logits
        _store_features(full, n, start, stop, ans.features, ans.feature_grads)


def _empty_answer(q: Query) -> Answer:
    dev = q.origin.device
    grads = torch.empty((0, *q.origin.shape[-3:]), device=dev, dtype=q.origin.dtype) if q.grad else None
    return Answer(torch.empty(0, device=dev), grads, torch.empty(0, dtype=torch.long, device=dev))


S = TypeVar("S", bound=PlanState)


def answer_rows(
    model: Model, work: Sequence[tuple[S, Rows]], batch_size: int, stats: CallStats | None = None,
    skip: Callable[[S], bool] | None = None, shapes: CallShapes | None = None, graphs: bool = True,
) -> list[tuple[S, int, int, int, Query, Answer]]:
    """Evaluate the rows of several plan states in shared model calls (:func:`evaluate_queries`);
    returns each part with its answer, for the caller to store. ``skip(state)``, asked before every
    call, drops the remaining rows of a state (their answers are then incomplete)."""
    owners = [(state, qi, a, b) for state, rows in work for qi, a, b in rows]
    queries = [state.part(qi, a, b) for state, qi, a, b in owners]
    answers = evaluate_queries(model, queries, batch_size, stats, None if skip is None else lambda i: skip(owners[i][0]), shapes,
                               graphs)
    return [(state, qi, a, b, q, ans) for (state, qi, a, b), q, ans in zip(owners, queries, answers, strict=True)]


def run_plans(model: Model, plans: Sequence[PlanOf[R]], batch_size: int, stats: CallStats | None = None,
              shapes: CallShapes | None = None) -> list[R]:
    """Drive several plans in lock-step, pooling the points of all of them into shared model calls
    (``shapes``: fixed call sizes and their CUDA graphs, as :func:`evaluate_queries` takes them).
    A plan may yield an empty list (a checkpoint between long host steps); it gets one back."""
    states = [PlanState(plan) for plan in plans]
    active = [s for s in states if s.advance()]
    while active:
        work = [(s, s.take()) for s in active]
        for state, qi, a, b, _, ans in answer_rows(model, work, batch_size, stats, shapes=shapes):
            state.store(qi, a, b, ans)
        active = [s for s in active if s.advance(s.step_answers())]
    return [s.result for s in states]
