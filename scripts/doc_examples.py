"""The examples of README.md and docs/ that scripts/smoke_test.sh runs: every fenced ``bash`` or ``python`` block
right after a line ``<!-- smoke -->`` (invisible on GitHub and on the site).

``python scripts/doc_examples.py --port P --root R`` prints a bash script that runs each block against the server on
127.0.0.1:P from the current directory (which holds the sample files the examples name: photo.jpg, a.jpg,
b.jpg, jay.jpg, photos/, photos.tar.gz, incoming/), with the examples' ``localhost:8000`` pointed at that port and their
repository paths (``.venv/bin/``, ``samples/``) at R, and ``IDG_URL`` set for idg-client. curl fails on an
HTTP error status and any command's failure fails its block; the script stops at the first failed block, naming
its file and line. ``--list`` prints where the blocks are."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- smoke -->"
FENCE = re.compile(r"^```(bash|python)\s*$")


@dataclass(frozen=True)
class Example:
    path: str
    line: int
    language: str
    code: str


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def examples(root: Path = ROOT) -> list[Example]:
    """Every marked block of the README and the docs, in page order."""
    found = []
    for page in pages(root):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != MARK:
                continue
            fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            if fence is None:
                raise ValueError(f"{page.relative_to(root)}:{i + 1}: {MARK} must stand right above a ```bash or ```python block")
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            found.append(Example(str(page.relative_to(root)), i + 3, fence.group(1), "\n".join(lines[i + 2:end])))
    return found


def localise(code: str, port: int, root: Path) -> str:
    """The example as it runs here: the server's port, this checkout's paths."""
    code = re.sub(r"\b(localhost|127\.0\.0\.1):8000\b", f"127.0.0.1:{port}", code)
    code = re.sub(r"(?<![\w/.])samples/", f"{root}/samples/", code)  # the checkout's photos
    return re.sub(r"(?<![\w/])\.venv/bin/", f"{root}/.venv/bin/", code)


def script(port: int, root: Path) -> str:
    """A bash script that runs every example, one subshell each, and stops at the first that fails."""
    py = shlex.quote(f"{root}/.venv/bin/python")
    # idg-client's server, as a user who ran `make run PORT=...` sets it; this checkout's code for the library examples
    out = ["set -uo pipefail", f"export IDG_URL=http://127.0.0.1:{port}", f"export PYTHONPATH={shlex.quote(str(root))}"]
    for n, ex in enumerate(examples(root)):
        where = f"{ex.path}:{ex.line}"
        code = localise(ex.code, port, root)
        tag = f"SMOKE_EXAMPLE_{n}"
        if ex.language == "bash":
            body = f"set -euo pipefail\ncurl() {{ command curl --fail-with-body \"$@\"; }}\n{code}"
            run = f"bash -s > example-{n}.log 2>&1 <<'{tag}'\n{body}\n{tag}"
        else:
            run = f"{py} - > example-{n}.log 2>&1 <<'{tag}'\n{code}\n{tag}"
        out += [run, f"if [ $? -ne 0 ]; then cat example-{n}.log; echo 'smoke: the example at {where} failed'; exit 1; fi",
                f"echo 'smoke: example {where} ok'"]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--list", action="store_true", help="where the examples are, one a line")
    args = parser.parse_args()
    if args.list:
        for ex in examples(args.root):
            sys.stdout.write(f"{ex.path}:{ex.line} {ex.language}\n")
    else:
        sys.stdout.write(script(args.port, args.root.resolve()))


if __name__ == "__main__":
    main()
