"""``explain_if``: a tiny condition language on a prediction, parsed by hand (never ``eval``).

Grammar (keywords case-insensitive)::

    expr       := conj ("or" conj)*
    conj       := atom ("and" atom)*
    atom       := "(" expr ")" | quantity OP number | "class" "in" int ("," int)*
    quantity   := "confidence" | "margin" | "entropy"
    OP         := "<" | "<=" | ">" | ">=" | "==" | "!="

``confidence`` is the top-1 probability, ``margin`` top-1 minus top-2, ``entropy`` the Shannon
entropy of the softmax in nats, ``class`` the predicted (top-1) class index.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

MAX_LENGTH = 500
MAX_DEPTH = 16
QUANTITIES = ("confidence", "margin", "entropy")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}
_TOKEN = re.compile(r"\s*(?:(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)|(?P<op><=|>=|==|!=|<|>)|(?P<word>[A-Za-z_]+)|(?P<punct>[(),]))")


class ConditionError(ValueError):
    """The condition does not parse; ``position`` is the 0-based column of the problem."""

    def __init__(self, message: str, position: int, text: str) -> None:
        super().__init__(f"explain_if: {message} at column {position + 1}: {text[:position]!r} >>> {text[position:]!r}")
        self.position = position


@dataclass(frozen=True)
class Token:
    kind: str  # num | op | word | punct | end
    value: str
    pos: int


@dataclass(frozen=True)
class Facts:
    """What a condition may look at."""

    confidence: float
    margin: float
    entropy: float
    predicted: int

    @staticmethod
    def of(probs: Tensor) -> Facts:
        p = probs.detach().double().flatten()
        top = p.topk(min(2, p.numel())).values
        second = float(top[1]) if top.numel() > 1 else 0.0
        ent = float(-(p * torch.log(p.clamp_min(1e-300))).sum())
        return Facts(float(top[0]), float(top[0]) - second, ent, int(p.argmax()))


Condition = Callable[[Facts], bool]


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            start = pos + len(text[pos:]) - len(text[pos:].lstrip())
            raise ConditionError(f"unexpected character {text[start]!r}", start, text)
        kind = m.lastgroup or ""
        tokens.append(Token(kind, m.group(kind).lower() if kind == "word" else m.group(kind), m.start(kind)))
        pos = m.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def fail(self, what: str) -> ConditionError:
        got = "the end" if self.tok.kind == "end" else repr(self.tok.value)
        return ConditionError(f"expected {what}, got {got}", self.tok.pos, self.text)

    def take(self, kind: str, value: str | None = None) -> Token | None:
        t = self.tok
        if t.kind == kind and (value is None or t.value == value):
            self.i += 1
            return t
        return None

    def parse(self) -> Condition:
        cond = self.expr()
        if self.tok.kind != "end":
            raise self.fail("'and', 'or' or the end")
        return cond

    def expr(self) -> Condition:
        parts = [self.conj()]
        while self.take("word", "or"):
            parts.append(self.conj())
        return parts[0] if len(parts) == 1 else _any(tuple(parts))

    def conj(self) -> Condition:
        parts = [self.atom()]
        while self.take("word", "and"):
            parts.append(self.atom())
        return parts[0] if len(parts) == 1 else _all(tuple(parts))

    def atom(self) -> Condition:
        if self.take("punct", "("):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ConditionError(f"parentheses nest deeper than {MAX_DEPTH}", self.tokens[self.i - 1].pos, self.text)
            inner = self.expr()
            self.depth -= 1
            if not self.take("punct", ")"):
                raise self.fail("')'")
            return inner
        if self.take("word", "class"):
            if not self.take("word", "in"):
                raise self.fail("'in' after 'class'")
            classes = {self.integer()}
            while self.take("punct", ","):
                classes.add(self.integer())
            frozen = frozenset(classes)
            return lambda f: f.predicted in frozen
        word = self.take("word")
        if word is None or word.value not in QUANTITIES:
            if word is not None:
                self.i -= 1
            raise self.fail("confidence, margin, entropy, 'class in' or '('")
        op = self.take("op")
        if op is None:
            raise self.fail("a comparison (<, <=, >, >=, ==, !=)")
        num = self.take("num")
        if num is None:
            raise self.fail("a number")
        value, compare, name = float(num.value), _OPS[op.value], word.value
        if not math.isfinite(value):
            raise ConditionError("the number is not finite", num.pos, self.text)
        return lambda f: compare(float(getattr(f, name)), value)

    def integer(self) -> int:
        t = self.take("num")
        if t is None or not t.value.isdigit():
            if t is not None:
                self.i -= 1
            raise self.fail("a class index (a whole number)")
        return int(t.value)


def _any(parts: tuple[Condition, ...]) -> Condition:
    return lambda f: any(p(f) for p in parts)


def _all(parts: tuple[Condition, ...]) -> Condition:
    return lambda f: all(p(f) for p in parts)


def parse_condition(text: str) -> Condition:
    """Parse ``text`` into a predicate on :class:`Facts`; :class:`ConditionError` points at the problem."""
    if len(text) > MAX_LENGTH:
        raise ConditionError(f"the condition is longer than {MAX_LENGTH} characters", MAX_LENGTH, text)
    if not text.strip():
        raise ConditionError("the condition is empty", 0, text)
    return _Parser(text).parse()
