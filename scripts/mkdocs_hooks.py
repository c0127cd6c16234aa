"""MkDocs hooks (mkdocs.yml ``hooks:``): the pages' reference tables, made from the code at build time.

A page asks for a table with a marker line, ``<!-- generated:NAME -->`` (``<!-- generated:method idg -->`` for
one method's parameters), and the build puts the table in its place, so the settings reference cannot drift from
``app.core.config`` (a table per section), the metrics from ``app.monitoring.prometheus.Metrics``, the alerts from
``deploy/monitoring/rules/idg.rules.yml``, the routes from the app's OpenAPI schema, or a method's parameters from
its ``Param`` declarations. The site also gets ``openapi.json`` and the result plots under ``results/``.
``tests/test_docs.py`` calls these functions directly."""

from __future__ import annotations

import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- generated:(\w+)(?: (\w+))? -->$", re.MULTILINE)


def _prose(text: object) -> str:
    """A docstring or description as one Markdown line: RST's double backticks and roles as Markdown's code."""
    s = re.sub(r"``([^`]+)``", r"`\1`", str(text))
    s = re.sub(r":(?:class|func|meth|data|attr|mod):`~?([^`]+)`", r"`\1`", s)
    return " ".join(s.split())


def _cell(text: object) -> str:
    """One table cell: :func:`_prose`, pipes escaped."""
    return _prose(text).replace("|", "\\|")


# ---- settings ---------------------------------------------------------------------------------------------------

def env_name(field: str, prefix: str = "IDG_") -> str:
    return prefix + field.upper()


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return f"`{','.join(map(str, value))}`" if value else "empty"
    if isinstance(value, Path):
        return f"`{value}`"
    return f"`{json.dumps(value) if isinstance(value, bool) else value}`"


def _bounds(metadata: list[Any]) -> str:
    parts = []
    for m in metadata:
        for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(m, attr, None) is not None:
                parts.append(f"{op} {getattr(m, attr)}")
    return ", ".join(parts)


def _type(annotation: Any) -> str:
    """A field's type as a reader writes it: ``int | 'auto'``, ``'fp32' | 'tf32' | 'bf16'``, ``list[str]``."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type(a) for a in args if a is not type(None)) + (" or unset" if type(None) in args else "")
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def _nested_metadata(annotation: Any) -> list[Any]:
    """The constraints of an ``Annotated`` inside a union (``Annotated[int, Field(ge=1)] | Literal["auto"]``)."""
    import typing

    if typing.get_origin(annotation) is typing.Annotated:
        return [m for a in typing.get_args(annotation)[1:] for m in getattr(a, "metadata", [a])]
    return [m for a in typing.get_args(annotation) for m in _nested_metadata(a)]


def settings_rows(section: Any) -> list[dict[str, str]]:
    """One row per field of one settings section (``app.core.config``): its environment variable, type, default,
    bounds and description."""
    rows = []
    prefix = section.model_config.get("env_prefix", "")
    for name, f in section.model_fields.items():
        rows.append({"name": name, "env": env_name(name, prefix), "type": _type(f.annotation), "default": _default(
                     f.default if f.default_factory is None else f.default_factory()),  # type: ignore[call-arg]
                     "bounds": _bounds([*f.metadata, *_nested_metadata(f.annotation)]), "description": f.description or ""})
    return rows


def check_sections(settings: Any, sections: tuple[Any, ...]) -> None:
    """Every field of ``settings`` is in exactly one of ``sections`` and has a description, or a ``ValueError``
    naming the fields (the build fails: the reference would miss a setting or say nothing about it)."""
    homes: dict[str, list[str]] = {name: [] for name in settings.model_fields}
    for section in sections:
        for name in section.model_fields:
            homes.setdefault(name, []).append(section.__name__)
    problems = [f"{name} is in no section" for name, found in homes.items() if not found]
    problems += [f"{name} is in {' and '.join(found)}" for name, found in homes.items() if len(found) > 1]
    problems += [f"{name} is in a section but not in {settings.__name__}" for name in homes if name not in settings.model_fields]
    problems += [f"{name} has no description" for name, f in settings.model_fields.items() if not f.description]
    if problems:
        raise ValueError("settings reference: " + "; ".join(problems) + " (app/core/config.py)")


def settings_table(settings: Any = None, sections: tuple[Any, ...] | None = None) -> str:
    """The settings reference: one table per section of ``app.core.config`` (``SECTIONS``), headed by its title and
    what it governs (its docstring)."""
    from app.core.config import SECTIONS, Settings

    settings, sections = settings or Settings, sections or SECTIONS
    check_sections(settings, sections)
    out = []
    for section in sections:
        out += [f"## {section.title}", "", _prose(inspect.cleandoc(section.__doc__ or "")), "",
                "| variable | default | type, range | meaning |", "|---|---|---|---|"]
        for r in settings_rows(section):
            kind = _cell(r["type"]) + (f"; {r['bounds']}" if r["bounds"] else "")
            out.append(f"| <span id=\"{r['env'].lower()}\"></span>`{r['env']}` | {r['default']} | {kind} | {_cell(r['description'])} |")
        out.append("")
    return "\n".join(out).rstrip()


# ---- metrics and alerts -----------------------------------------------------------------------------------------

def metric_rows() -> list[dict[str, str]]:
    """Every metric the service exports: name as scraped, type, labels, help."""
    from prometheus_client.metrics import MetricWrapperBase

    from app.monitoring.prometheus import Metrics

    metrics, rows = Metrics(), []
    for m in vars(metrics).values():
        if isinstance(m, MetricWrapperBase):
            kind = m._type  # noqa: SLF001 (prometheus_client keeps these private)
            name = m._name + ("_total" if kind == "counter" else "")  # noqa: SLF001
            rows.append({"name": name, "type": kind, "labels": ", ".join(m._labelnames),  # noqa: SLF001
                         "help": m._documentation})  # noqa: SLF001
    for family in metrics.registry.collect():  # prometheus_client's own process_* and python_*
        if family.name.startswith(("process_", "python_")):
            labels = sorted({k for s in family.samples for k in s.labels})
            several = ("each live server process's, labelled pid" if family.name.startswith("process_") else
                       "once" if family.name == "python_info" else "not exported")
            rows.append({"name": family.name + ("_total" if family.type == "counter" else ""), "type": family.type,
                         "labels": ", ".join(labels),
                         "help": family.documentation + f" (prometheus_client's; with several server processes: {several})"})
    return sorted(rows, key=lambda r: r["name"])


def metrics_table() -> str:
    lines = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for r in metric_rows():
        suffix = " (`_bucket`, `_sum`, `_count`)" if r["type"] == "histogram" else ""
        lines.append(f"| `{r['name']}`{suffix} | {r['type']} | {_cell(r['labels']) or '-'} | {_cell(r['help'])} |")
    return "\n".join(lines)


RULES = ROOT / "deploy" / "monitoring" / "rules" / "idg.rules.yml"


def _rules() -> Iterator[dict[str, Any]]:
    import yaml  # type: ignore[import-untyped]

    for group in yaml.safe_load(RULES.read_text())["groups"]:
        yield from group["rules"]


def alerts_table() -> str:
    lines = ["| alert | fires when (PromQL) | for | severity | says |", "|---|---|---|---|---|"]
    for r in _rules():
        if "alert" in r:
            expr = " ".join(r["expr"].split())
            lines.append(f"| `{r['alert']}` | `{_cell(expr)}` | {r.get('for', '-')} | {r.get('labels', {}).get('severity', '-')} "
                         f"| {_cell(r.get('annotations', {}).get('summary', ''))} |")
    return "\n".join(lines)


def recordings_table() -> str:
    lines = ["| recorded series | PromQL |", "|---|---|"]
    for r in _rules():
        if "record" in r:
            lines.append(f"| `{r['record']}` | `{_cell(' '.join(r['expr'].split()))}` |")
    return "\n".join(lines)


# ---- the HTTP API -----------------------------------------------------------------------------------------------

@cache
def openapi() -> dict[str, Any]:
    """The app's OpenAPI schema at the default settings (no model is loaded: only the routes are built)."""
    from app.core.config import Settings
    from app.main import create_app

    return create_app(Settings(_env_file=None)).openapi()


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = spec
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def _schema_type(s: dict[str, Any]) -> str:
    """A schema's type in a few words: ``integer >= 1 <= 20``, ```idg`, `ig```, ``list of string``."""
    if "anyOf" in s:  # a form's optional field: its type, or "" (not given) / null
        kinds = [_schema_type(x) for x in s["anyOf"] if x.get("type") != "null" and x.get("const") != ""]
        return " or ".join(k for k in kinds if k)
    if "enum" in s:
        return ", ".join(f"`{v}`" for v in s["enum"])
    if "const" in s:
        return f"`{s['const']}`"
    t = s.get("type", "")
    if t == "array":
        return f"list of {_schema_type(s.get('items', {}))}"
    if "$ref" in s:
        return str(s["$ref"].rsplit("/", 1)[-1])
    bits = [t]
    for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in s:
            bits.append(f"{op} {s[key]:g}" if isinstance(s[key], (int, float)) else f"{op} {s[key]}")
    return " ".join(b for b in bits if b)


def routes_markdown() -> str:
    """Every route of the schema: its summary, description, request fields and answers."""
    spec = openapi()
    out = ["| method | path | what |", "|---|---|---|"]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            out.append(f"| {method.upper()} | [`{path}`](#{_anchor(method, path)}) | {_cell(op.get('summary', ''))} |")
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            out += ["", f"### {method.upper()} `{path}` {{#{_anchor(method, path)}}}", "", _md(op.get("description", "")), ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
                out += [f"| `{p['name']}` | {p['in']} | {_cell(_schema_type(p.get('schema', {})))} | "
                        f"{_cell(p.get('description', p.get('schema', {}).get('description', '')))} |" for p in params]
                out.append("")
            for ctype, body in op.get("requestBody", {}).get("content", {}).items():
                schema = _resolve(body.get("schema", {}), spec)
                props = schema.get("properties", {})
                if not props:
                    continue
                required = set(schema.get("required", []))
                out += [f"Body `{ctype}`:", "", "| field | type | default | meaning |", "|---|---|---|---|"]
                for name, prop in props.items():
                    prop = _resolve(prop, spec) if "$ref" in prop else prop
                    default = "required" if name in required else (f"`{prop['default']}`" if "default" in prop else "")
                    out.append(f"| `{name}` | {_cell(_schema_type(prop))} | {default} | {_cell(prop.get('description', ''))} |")
                out.append("")
            codes = ", ".join(f"{code} ({_cell(r.get('description', ''))})" for code, r in op.get("responses", {}).items())
            if codes:
                out += [f"Answers: {codes}.", ""]
    return "\n".join(out)


def _anchor(method: str, path: str) -> str:
    return method.lower() + "-" + re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _md(text: str) -> str:
    return re.sub(r"``([^`]+)``", r"`\1`", text)


# ---- methods ----------------------------------------------------------------------------------------------------

def method_table(name: str) -> str:
    """One method's parameters (from its ``Param`` declarations) and what each preset sets."""
    from idg_core.methods import METHODS

    m = METHODS[name]
    lines = [f"*{m.summary}*", "", "| parameter | type | default | range | service field | meaning |", "|---|---|---|---|---|---|"]
    for p in m.params:
        rng = "" if p.kind is bool else (", ".join(f"`{c}`" for c in p.choices) if p.choices else _range(p))
        field = ("yes" + (", bounded by `IDG_MAX_STEPS`" if p.step else "")) if p.service else "library only"
        lines.append(f"| `{p.name}` | {p.kind.__name__} | `{p.default!r}` | {rng} | {field} | {_cell(p.help)} |")
    if m.presets:
        lines += ["", "| preset | sets |", "|---|---|"]
        lines += [f"| `{k}` | {', '.join(f'`{a}={b!r}`' for a, b in v.items()) or 'the defaults'} |" for k, v in m.presets.items()]
    return "\n".join(lines)


def _range(p: Any) -> str:
    if p.low is None and p.high is None:
        return ""
    low = "-∞" if p.low is None else p.low
    high = "∞" if p.high is None else p.high
    return f"{'(' if p.low_open else '['}{low}, {high}]"


# ---- the hooks --------------------------------------------------------------------------------------------------

def faithfulness_table() -> str:
    """The faithfulness metrics as their files declare them (:data:`idg_core.metrics.METRICS`)."""
    from idg_core.metrics import METRICS

    lines = ["| metric | better | the service scores it | the evaluation | cost per image | what it measures |",
             "|---|---|---|---|---|---|"]
    for m in METRICS.values():
        run = "by default" if m.default else f"when asked (`{m.run_name}`)"
        lines.append(f"| `{m.name}` | {'higher' if m.higher_is_better else 'lower'} | {'yes' if m.service else 'no'} | {run} | "
                     f"{_cell(m.cost)} | {_cell(m.summary)} |")
    return "\n".join(lines) + "\n"


TABLES: dict[str, Callable[[], str]] = {
    "settings": settings_table, "metrics": metrics_table, "alerts": alerts_table, "recordings": recordings_table,
    "routes": routes_markdown, "faithfulness": faithfulness_table,
}


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced by its table (an unknown marker is an error: mkdocs --strict fails)."""
    def table(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind == "method" and arg:
            return method_table(arg)
        if kind in TABLES and not arg:
            return TABLES[kind]()
        raise ValueError(f"unknown generated table {match.group(0)}")
    return MARKER.sub(table, markdown)


def on_config(config: Any, **_: Any) -> Any:
    """This checkout's code first on the path (mkdocs restores the path after loading a hook), so the tables and
    the reference describe it, not an installed copy."""
    if str(ROOT) not in sys.path[:1]:
        sys.path.insert(0, str(ROOT))
    return config


def on_page_markdown(markdown: str, **_: Any) -> str:
    return render(markdown)


def on_files(files: Any, config: Any, **_: Any) -> Any:
    """Add the committed result plots (``results/**/*.png``) and the OpenAPI schema to the site."""
    from mkdocs.structure.files import File

    for png in sorted((ROOT / "results").rglob("*.png")):
        files.append(File.generated(config, png.relative_to(ROOT).as_posix(), abs_src_path=str(png)))
    files.append(File.generated(config, "openapi.json", content=json.dumps(openapi(), indent=1)))
    return files

