"""Docstrings and comments in the library and the packages beside it say what the code does and why, not its history:
no date and no issue number (history goes to commit messages, measurements to ``docs/results/``). A date inside a path
that points at the evidence (``results/evaluation-2026-11-27/``) is a reference, not history, and is allowed."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("idg_core", "idg_models", "idg_evaluation")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
ISSUE = re.compile(r"\bissues? #\d*", re.IGNORECASE)


def prose(source: str) -> list[tuple[int, str]]:
    """Each docstring (a string standing alone as a statement: module, class, function and attribute docstrings) and
    each comment of ``source``, with its first line."""
    found = [(node.lineno, node.value.value) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]
    found += [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT]
    return found


def history(text: str) -> list[str]:
    """The dates (outside a path) and issue numbers in ``text``."""
    dates = [m.group() for m in DATE.finditer(text) if "/" not in _word_around(text, m.start(), m.end())]
    return dates + [m.group() for m in ISSUE.finditer(text)]


def _word_around(text: str, start: int, end: int) -> str:
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    while end < len(text) and not text[end].isspace():
        end += 1
    return text[start:end]


def test_no_docstring_or_comment_carries_a_date_or_an_issue_number() -> None:
    wrong = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, text in prose(path.read_text()):
                if found := history(text):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {', '.join(found)}")
    assert len(wrong) == 0, ("history in docstrings or comments (say what and why; the history goes to the commit "
                             "message, a measurement to docs/results/): " + "; ".join(wrong))


def test_the_scan_finds_history_and_lets_references_and_strings_be() -> None:
    source = '''"""Module docstring: until 2026-11-27 it ranked otherwise."""

X = 1
"""Chosen by issue #47's rule."""


def f() -> str:
    """The tables: ``results/evaluation-2026-11-27/``."""
    # measured 2026-11-28 on the VM
    return "a message may say 2026-11-28 and issue #47"
'''
    found = [(line, history(text)) for line, text in prose(source) if history(text)]
    assert found == [(1, ["2026-11-27"]), (4, ["issue #47"]), (9, ["2026-11-28"])]
