"""The layers keep to their side: the doors (``app/api``, the job runner) reach the worker and the image decoder only
through the service's one call (:mod:`app.service`), and the worker knows no protocol (no HTTP errors in it).
Read from the source's imports (AST), so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
DOORS = sorted((APP / "api").rglob("*.py")) + [APP / "jobs" / "runner.py"]
FORBIDDEN_IN_DOORS = ("app.worker", "app.core.images")
HTTP_NAMES = ("ApiError", "past_deadline", "HTTPException", "fastapi", "starlette")


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, and every ``module.name`` it imports from one."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_doors_are_found() -> None:
    assert APP / "api" / "routes" / "v2.py" in DOORS and len(DOORS) > 8  # an empty glob would pass the test below vacuously


@pytest.mark.parametrize("path", DOORS, ids=[str(p.relative_to(APP)) for p in DOORS])
def test_a_door_imports_neither_the_worker_nor_the_image_decoder(path: Path) -> None:
    wrong = sorted(n for n in imported(path) if any(_under(n, f) for f in FORBIDDEN_IN_DOORS))
    assert not wrong, f"{path.relative_to(APP)} imports {wrong}: go through app.service (its typed requests and one call)"


def test_the_worker_knows_no_protocol() -> None:
    for path in sorted((APP / "worker").rglob("*.py")):
        wrong = sorted(n for n in imported(path) if n.rsplit(".", 1)[-1] in HTTP_NAMES or _under(n, "fastapi") or _under(n, "starlette"))
        assert not wrong, f"{path.relative_to(APP)} imports {wrong}: the worker returns typed outcomes (app.worker.waiting.Refused)"


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "door.py"
    module.write_text("def f():\n    from app.worker.waiting import Submission\n    import app.core.images\n")
    assert {"app.worker.waiting.Submission", "app.core.images"} <= imported(module)
