"""The import graph of the attribution library and the packages beside it: no cycles, no private name imported from
another folder, and each layer imports only
the layers below it: ``idg_core`` (the attribution maths) < ``idg_models`` (loading, zoo, speed, calibration) <
``idg_evaluation`` (the harness, reports, CLI) < the serving machinery.

Read from the source (AST over ``idg_core/**/*.py``, ``idg_models/**/*.py``, ``idg_evaluation/**/*.py``), not by
importing it. Imports at module level (``if TYPE_CHECKING:`` included: a cycle there is still two modules that need
each other) and imports inside functions are counted apart, so that a cycle hidden behind a lazy import is reported as
such; both must be acyclic. ``from package import name`` counts as an import of ``package.name`` where that is a
module, else of ``package``; importing ``a.b.c`` also imports the packages ``a`` and ``a.b`` (their ``__init__``), and
those count too, except the importer's own enclosing packages (already being imported when it runs).
A fresh interpreter checks the other half: importing the library loads no module of the packages above it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVING = ("idg_serving", "app")
LAYERS = ("idg_core", "idg_models", "idg_evaluation")
"""Lowest first: a package imports only those before it (and third-party code)."""
MAX_LIBRARY_LINES = 5000


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name (a package by its own name)."""
    names = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level or not node.module:
        return []  # relative imports: the project uses none
    return [f"{node.module}.{a.name}" for a in node.names]


class _Imports(ast.NodeVisitor):
    def __init__(self) -> None:
        self.module_level: set[str] = set()
        self.in_functions: set[str] = set()
        self._depth = 0

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        (self.in_functions if self._depth else self.module_level).update(_targets(node))

    visit_ImportFrom = visit_Import


def imports(path: Path) -> tuple[set[str], set[str]]:
    """What ``path`` imports at module level and inside functions (dotted names, as written)."""
    seen = _Imports()
    seen.visit(ast.parse(path.read_text(), str(path)))
    return seen.module_level, seen.in_functions


def _parents(name: str) -> list[str]:
    """The enclosing packages of a dotted name, innermost first: ``a.b.c`` -> ``a.b``, ``a``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def import_graph(modules: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Edges between ``modules``: at module level, and inside functions (those not also at module level)."""

    def resolve(names: set[str], own: str) -> set[str]:
        own_packages = set(_parents(own)) | ({own} if modules[own].name == "__init__.py" else set())
        found = set()
        for name in names:
            # ``from a.b import c`` reads as a.b.c: the module a.b.c if it is one, else a.b (``c`` is a name in it)
            target = name if name in modules else name.rpartition(".")[0]
            # importing a.b.c runs a/__init__ and a/b/__init__ first, unless the importer is inside them
            for module in (target, *_parents(target)):
                if module in modules and module != own and module not in own_packages:
                    found.add(module)
        return found

    top: dict[str, set[str]] = {}
    inner: dict[str, set[str]] = {}
    for name, path in modules.items():
        module_level, in_functions = imports(path)
        top[name] = resolve(module_level, name)
        inner[name] = resolve(in_functions, name) - top[name]
    return top, inner


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and modules importing themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _why(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


LIBRARY = module_names(ROOT, "idg_core")
PACKAGES = {name: path for layer in LAYERS for name, path in module_names(ROOT, layer).items()}
TOP, INNER = import_graph(PACKAGES)


def test_the_graph_is_read() -> None:
    # an empty glob or a resolver that drops every edge would pass the tests below vacuously
    assert len(LIBRARY) > 35 and "idg_core.model_calls" in TOP["idg_evaluation.runner"]
    # a package's __init__ counts: idg_evaluation.runner imports idg_models.* through the package idg_models
    assert {"idg_models", "idg_core.metrics"} <= TOP["idg_evaluation.runner"]
    assert "idg_models.sources" in INNER["idg_models.calibrate"]  # a lazy import, counted apart


def test_the_library_is_the_attribution_maths_only() -> None:
    lines = sum(len(path.read_text().splitlines()) for path in LIBRARY.values())
    assert lines <= MAX_LIBRARY_LINES, f"idg_core has {lines} lines (at most {MAX_LIBRARY_LINES}): models, speed and evaluation live apart"


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = {}
    for name, path in PACKAGES.items():
        layer = LAYERS.index(name.split(".")[0])
        module_level, in_functions = imports(path)
        above = sorted(n for n in module_level | in_functions if n.split(".")[0] in LAYERS[layer + 1:])
        if above:
            wrong[name] = above
    assert not wrong, f"imports of a higher layer ({' < '.join(LAYERS)}): {wrong}"


def test_importing_the_library_loads_no_model_zoo_speed_or_evaluation_module() -> None:
    """``idg_core`` with its explain, faithfulness, metrics and post-steps, in a fresh interpreter: no module of
    ``idg_models`` (zoo, sources, speed, fusion, compile, calibration, CUDA graphs) or ``idg_evaluation`` is loaded."""
    code = ("import json, sys\n"
            "import idg_core, idg_core.explain, idg_core.faithfulness, idg_core.metrics, idg_core.postprocess, idg_core.presets\n"
            "above = ('idg_models', 'idg_evaluation', 'idg_serving', 'app')\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in above)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], out.stdout


def test_no_import_cycle_at_module_level() -> None:
    found = cycles(TOP)
    assert not found, "module-level import cycles: " + " | ".join(_why(c, TOP) for c in found)


def test_no_import_cycle_even_through_imports_inside_functions() -> None:
    both = {m: TOP[m] | INNER[m] for m in TOP}
    found = cycles(both)
    assert not found, ("import cycles through imports inside functions (move the shared piece to the lower module): "
                       + " | ".join(_why(c, both) for c in found))


def test_the_service_folders_import_one_another_without_a_cycle() -> None:
    """The app's folders (app/doors, app/api, app/jobs, app/worker, app/service, app/processes, app/monitoring,
    app/core) split by what each holds; a cycle between their modules, lazy imports included, would tie them back
    into one."""
    app = module_names(ROOT, "app")
    assert {"app.doors.layer", "app.doors.door", "app.processes.launch", "app.monitoring.prometheus", "app.core.config"} <= set(app)
    top, inner = import_graph(app)
    both = {m: top[m] | inner[m] for m in top}
    found = cycles(both)
    assert not found, "import cycles in the app: " + " | ".join(_why(c, both) for c in found)


def test_the_library_imports_nothing_of_the_serving_machinery() -> None:
    wrong = {}
    for name, path in PACKAGES.items():
        module_level, in_functions = imports(path)
        serving = sorted(n for n in module_level | in_functions if n.split(".")[0] in SERVING)
        if serving:
            wrong[name] = serving
    assert not wrong, f"{', '.join(LAYERS)} import the serving package (idg_serving, app): {wrong}"


def test_the_serving_package_builds_on_the_library_only_one_way() -> None:
    serving = module_names(ROOT, "idg_serving")
    assert {"idg_serving.simulated", "idg_serving.warm_up"} <= set(serving)
    for path in serving.values():
        module_level, in_functions = imports(path)
        assert not any(n.split(".")[0] == "app" for n in module_level | in_functions), f"{path} imports the app"


def test_the_checks_find_a_cycle_behind_a_lazy_import_and_an_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "lib"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from lib.sub import low\n")
    (pkg / "sub" / "low.py").write_text("def f():\n    from lib.high import g\n")
    (pkg / "high.py").write_text("from lib.sub.low import f\nimport idg_serving.warm_up\n")
    (pkg / "plain.py").write_text("from lib import high\n")
    top, inner = import_graph(module_names(tmp_path, "lib"))
    # lib.high imports lib.sub.low and so the package lib.sub; lib itself is already being imported around lib.high
    assert top["lib.high"] == {"lib.sub", "lib.sub.low"} and inner["lib.sub.low"] == {"lib.high"} and top["lib.plain"] == {"lib.high"}
    assert top["lib.sub"] == {"lib.sub.low"}
    assert cycles(top) == []
    assert cycles({m: top[m] | inner[m] for m in top}) == [["lib.high", "lib.sub", "lib.sub.low"]]
    assert "idg_serving.warm_up" in imports(pkg / "high.py")[0]


def test_a_cycle_through_a_package_init_is_found(tmp_path: Path) -> None:
    """``lib.user`` imports only ``lib.heavy.light``, but that runs ``lib/heavy/__init__``, which imports ``lib.heavy.big``,
    which imports ``lib.user``: a cycle the modules alone do not show."""
    pkg = tmp_path / "lib"
    (pkg / "heavy").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy" / "__init__.py").write_text("from lib.heavy.big import g\n")
    (pkg / "heavy" / "big.py").write_text("from lib.user import f\n")
    (pkg / "heavy" / "light.py").write_text("")
    (pkg / "user.py").write_text("from lib.heavy.light import h\n")
    top, _ = import_graph(module_names(tmp_path, "lib"))
    assert top["lib.user"] == {"lib.heavy", "lib.heavy.light"}
    assert cycles(top) == [["lib.heavy", "lib.heavy.big", "lib.user"]]


def test_no_private_name_crosses_folders() -> None:
    """A leading underscore means "this folder's own": importing one from another folder couples to what may change."""
    wrong = []
    for name, path in PACKAGES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LAYERS:
                source = node.module if node.module in PACKAGES and PACKAGES[node.module].name != "__init__.py" else node.module + ".x"
                same_folder = source.rpartition(".")[0] == (name if path.name == "__init__.py" else name.rpartition(".")[0])
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private and not same_folder:
                    wrong.append(f"{name} imports {', '.join(private)} from {node.module}")
    assert not wrong, "; ".join(wrong)


def test_no_door_imports_another_doors_private_names() -> None:
    """The service's doors (app/api's routes, the gRPC servicer, the job runner) share the Open Inference Protocol's logic
    through app/api/oip_inference.py, not through each other's private names (the gRPC door had taken ``_config``,
    ``_metadata`` and ``_one_version`` from the HTTP routes)."""
    wrong = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("app."):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    wrong.append(f"{path.relative_to(ROOT)} imports {', '.join(private)} from {node.module}")
    assert not wrong, "; ".join(wrong)
