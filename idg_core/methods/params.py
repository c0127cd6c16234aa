"""Each method's parameters, declared once: name, type, default, range and one-line meaning.

A method file lists its :class:`Param` s in a :class:`Params`; from it come the library's checks
(:meth:`Params.validate`, an explicit call that fills defaults and names what was wrong), the
public function's signature and ``Args`` text, the service's request fields with their OpenAPI
descriptions and bounds, and the parameter listing of ``GET /models``."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from idg_core._validation import check_choice, check_float, check_int


class InvalidParameter(ValueError):
    """A method parameter out of its range, of the wrong type, or not one the method takes.
    ``name`` is the parameter (the service answers 422 with the message)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


SEED_MAX = 2**53 - 1
"""The largest seed taken: ``torch.Generator.manual_seed`` takes up to 2**64 - 1 (2**64 overflows),
but a double, as JSON clients, schema tools and ``GET /models``' ranges read numbers, is exact only
up to 2**53 - 1 (2**64 - 1 reads as 2**64)."""

@dataclass(frozen=True)
class Param:
    """One keyword parameter of a method.

    ``kind`` is ``int``, ``float``, ``bool``, ``str`` (then ``choices`` lists the values) or
    ``list`` (of class indices, None allowed; checked against the others by the method's ``joint``);
    numbers lie in ``[low, high]`` (``(low, high]`` with ``low_open``; None: unbounded); ``why``
    ends the message of a range error. ``service``: False for library-only parameters (the
    service sets them itself, e.g. ``num_classes``, or has no field for them). ``step``: a count of
    model passes per image (steps, iterations, samples): the service bounds it by ``IDG_MAX_STEPS``,
    and the page's Steps box sets a method's first one."""

    name: str
    kind: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    why: str = ""
    service: bool = True
    step: bool = False

    def check(self, value: Any) -> Any:
        """``value`` if valid for this parameter, else :class:`InvalidParameter` naming it."""
        try:
            if self.kind is bool:
                if not isinstance(value, bool):
                    raise ValueError(f"{self.name} must be a bool, got {value!r}")
                return value
            if self.kind is list:
                if value is None:
                    return None
                if isinstance(value, (str, bytes)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                    raise ValueError(f"{self.name} must be a list of integers, got {value!r}")
                return list(value)
            if self.kind is str:
                return check_choice(self.name, value, self.choices)
            if self.kind is int:
                high = None if self.high is None else int(self.high)
                return check_int(self.name, value, int(self.low if self.low is not None else -(2**62)), high)
            low = -math.inf if self.low is None else self.low
            high_f = math.inf if self.high is None else self.high
            return check_float(self.name, value, low, high_f, low_open=self.low_open, why=self.why)
        except InvalidParameter:
            raise
        except ValueError as err:
            raise InvalidParameter(self.name, str(err)) from err

    @property
    def bounds(self) -> str:
        """The range in words, e.g. ``>= 2``, ``in (0, 1]``, ``one of a, b``; empty when unbounded."""
        if self.kind is str:
            return "one of " + ", ".join(self.choices)
        if self.kind in (bool, list) or (self.low is None and self.high is None):
            return ""
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        if self.low is None:
            return f"<= {_num(self.high)}"
        return f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}]"

    def describe(self) -> str:
        """One line: meaning, range, default."""
        parts = [self.help.rstrip(".")]
        if self.bounds:
            parts.append(self.bounds)
        if self.default is not None:
            parts.append(f"default {self.default!r}" if self.kind is str else f"default {self.default}")
        return "; ".join(parts)


def _num(v: float | None) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Params:
    """A method's parameters, in order, with an optional check across several of them
    (``joint``: gets every value, raises :class:`InvalidParameter`)."""

    method: str
    items: tuple[Param, ...]
    joint: Callable[[dict[str, Any]], None] | None = field(default=None, compare=False)
    inert: Callable[[dict[str, Any]], set[str]] | None = field(default=None, compare=False)
    """The parameters that take no effect given the values of the others (IDG's probe with ``uniform``): an answer does
    not report them as used."""

    def __iter__(self) -> Iterator[Param]:
        return iter(self.items)

    def __contains__(self, name: object) -> bool:
        return any(p.name == name for p in self.items)

    def __getitem__(self, name: str) -> Param:
        for p in self.items:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.items)

    @property
    def steps(self) -> tuple[str, ...]:
        """The parameters that count model passes (:attr:`Param.step`), the first the main one."""
        return tuple(p.name for p in self.items if p.step)

    @property
    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.items}

    def in_effect(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` without the parameters that take no effect given the others (:attr:`inert`)."""
        inert = self.inert(dict(values)) if self.inert is not None else set()
        return {k: v for k, v in values.items() if k not in inert}

    def refuse_unknown(self, given: Iterable[str], listed: Iterable[str] | None = None) -> None:
        """:class:`InvalidParameter` for the first name the method does not take; the message lists
        ``listed`` as its parameters (default: all of them; the service lists those it exposes)."""
        unknown = [k for k in given if k not in self]
        if unknown:
            names = ", ".join(self.names if listed is None else listed)
            raise InvalidParameter(unknown[0], f"{self.method} takes no parameter {unknown[0]!r}; its parameters are {names}")

    def validate(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every parameter's value (``given`` over the defaults), checked; :class:`InvalidParameter`
        for an unknown name (naming the method's parameters) or a bad value (naming it)."""
        self.refuse_unknown(given)
        values = {p.name: p.check(given[p.name]) if p.name in given else p.default for p in self.items}
        if self.joint is not None:
            self.joint(values)
        return values

    def signature(self, head: inspect.Signature) -> inspect.Signature:
        """``head`` (the positional arguments and the shared keywords) with these keywords inserted
        before the shared ones: the signature ``help()`` and ``inspect`` show for the method."""
        positional = [p for p in head.parameters.values() if p.kind is not p.KEYWORD_ONLY and p.kind is not p.VAR_KEYWORD]
        shared = [p for p in head.parameters.values() if p.kind is p.KEYWORD_ONLY]
        own = [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default, annotation=_annotation(p)) for p in self.items]
        return head.replace(parameters=[*positional, *own, *shared])

    def doc(self) -> str:
        """The ``Args`` lines of the method's docstring."""
        return "\n".join(f"    {p.name}: {p.describe()}." for p in self.items)


def _annotation(p: Param) -> str:
    if p.kind is str:
        return "str"
    if p.kind is list:
        return "Sequence[int] | None"
    name = p.kind.__name__
    return f"{name} | None" if p.default is None else name


def output_param(default: str) -> Param:
    """The ``output`` every method differentiates: the target's logit or its softmax probability."""
    return Param("output", str, default, "What the method differentiates: the target class's logit or its softmax probability",
                 choices=("logit", "probability"))
