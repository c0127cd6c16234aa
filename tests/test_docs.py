"""The documentation agrees with the code: the reference tables the site is built with (scripts/mkdocs_hooks.py)
list every setting, metric, alert and method, the pages name only settings that exist, and the smoke test's
example extractor (scripts/doc_examples.py) finds the marked examples. ``mkdocs build --strict`` itself runs in
``make test`` (broken links, anchors and pages outside the nav fail it)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml  # type: ignore[import-untyped]
from pydantic import Field

from app.core.config import SECTIONS, ServerSettings, Settings
from idg_core.methods import METHODS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# read by idg-client, the page test, the benchmarks and tests (benchmarks/samples.py), not by the server
NOT_SETTINGS = {"IDG_URL", "IDG_SCREENSHOT", "IDG_IMAGENET_SAMPLES"}


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    return _script("mkdocs_hooks")


@pytest.fixture(scope="module")
def doc_examples() -> ModuleType:
    return _script("doc_examples")


def _tables_by_heading(page: str) -> dict[str, str]:
    """The rendered settings page's text under each ``## `` heading."""
    return {chunk.split("\n", 1)[0]: chunk for chunk in page.split("\n## ")[1:]}


def test_the_settings_reference_lists_every_setting_under_its_section_with_its_default_and_meaning(hooks: ModuleType) -> None:
    page = hooks.render((ROOT / "docs" / "settings.md").read_text())
    tables = _tables_by_heading(page)
    assert list(tables) == [section.title for section in SECTIONS]
    for section in SECTIONS:
        listed = re.findall(r"^\| <span id=\"[a-z0-9_]+\"></span>`(IDG_[A-Z0-9_]+)`", tables[section.title], re.MULTILINE)
        assert listed == ["IDG_" + name.upper() for name in section.model_fields], section.title
        assert section.__doc__ and hooks._prose(section.__doc__) in tables[section.title]  # what it governs
        for name, field in section.model_fields.items():
            row = next(line for line in tables[section.title].splitlines() if line.startswith(f'| <span id="idg_{name}">'))
            assert field.description and hooks._cell(field.description) in row, (name, row)
            if isinstance(field.default, (int, float, str)) and not isinstance(field.default, bool):
                assert f"`{field.default}`" in row, (name, row)
    assert sum(len(section.model_fields) for section in SECTIONS) == len(Settings.model_fields)


def test_a_setting_outside_every_section_or_without_a_description_fails_the_build(hooks: ModuleType) -> None:
    class Stray(Settings):
        stray: int = Field(1, description="added to the settings class, not to a section")

    class Undescribed(ServerSettings):
        quiet: int = 1

    class Both(Settings, Undescribed):
        pass

    with pytest.raises(ValueError, match="stray is in no section"):
        hooks.settings_table(Stray, SECTIONS)
    with pytest.raises(ValueError, match="quiet has no description"):
        hooks.settings_table(Both, (*SECTIONS[1:], Undescribed))
    with pytest.raises(ValueError, match="host is in ServerSettings and Undescribed"):
        hooks.settings_table(Both, (*SECTIONS, Undescribed))
    with pytest.raises(ValueError, match="quiet is in a section but not in Settings"):
        hooks.settings_table(Settings, (*SECTIONS[1:], Undescribed))
    assert hooks.settings_table(Settings, SECTIONS) == hooks.settings_table()


def test_the_pages_name_only_settings_that_exist() -> None:
    known = {"IDG_" + name.upper() for name in Settings.model_fields} | NOT_SETTINGS
    for page in PAGES:
        named = set(re.findall(r"\bIDG_[A-Z0-9_]*[A-Z0-9]\b", page.read_text()))
        assert named <= known, f"{page.relative_to(ROOT)} names {sorted(named - known)}, which no setting reads"


def test_the_deployments_set_only_settings_that_exist() -> None:
    """The variables the shipped deployments set keep naming settings (a renamed field would be ignored silently there:
    ``extra="ignore"``). ``IDG_WEIGHTS_DIR`` is docker-compose's own: the host folder mounted at /weights."""
    known = {"IDG_" + name.upper() for name in Settings.model_fields} | {"IDG_WEIGHTS_DIR"}
    files = [ROOT / "Dockerfile", ROOT / "docker-compose.yml", *sorted((ROOT / "deploy").rglob("*.yaml")),
             ROOT / "deploy" / "monitoring" / "prometheus.yml"]
    for path in files:
        named = set(re.findall(r"\bIDG_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
        assert named <= known, f"{path.relative_to(ROOT)} sets {sorted(named - known)}, which no setting reads"
    assert any("IDG_MODELS" in path.read_text() for path in files)  # the files were read


def test_the_metrics_reference_lists_every_metric_the_service_exports(hooks: ModuleType) -> None:
    from prometheus_client import generate_latest

    from app.monitoring.prometheus import Metrics

    helps = re.findall(r"^# HELP (\S+)", generate_latest(Metrics().registry).decode(), re.MULTILINE)
    exported = {name for name in helps if not name.endswith("_created")}  # prometheus_client's creation times
    table = hooks.metrics_table()
    assert exported and all(f"`{name}`" in table for name in exported), exported


def test_the_alerts_reference_lists_every_alert_of_the_rules(hooks: ModuleType) -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "monitoring" / "rules" / "idg.rules.yml").read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    table = hooks.alerts_table()
    assert alerts and all(f"`{a}`" in table for a in alerts)


def test_every_method_has_a_page_with_its_parameters(hooks: ModuleType) -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for name, method in METHODS.items():
        page = ROOT / "docs" / "methods" / f"{name}.md"
        assert f"<!-- generated:method {name} -->" in page.read_text(), page
        assert f"methods/{name}.md" in nav
        table = hooks.method_table(name)
        assert all(f"`{p.name}`" in table for p in method.params)


def test_an_unknown_table_marker_fails_the_build(hooks: ModuleType) -> None:
    with pytest.raises(ValueError, match="unknown generated table"):
        hooks.render("text\n<!-- generated:nothing -->\n")
    assert hooks.render("no marker here") == "no marker here"


def test_the_readme_is_short_and_its_first_screen_says_how_to_start() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    first = "\n".join(lines[:40])
    for needed in ("make run", "make test", "PORT=", "IDG_URL", "--url", ".venv/bin/", "curl ", "in use", "photo.jpg", "samples/",
                   "torch==2.13.0", "[timm]", "[hf]", "[grpc]", "[ray]"):
        assert needed in first, needed
    scripts = re.findall(r"^([\w-]+) = ", (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0], re.M)
    assert len(scripts) >= 5 and all(f"`{name}`" in first for name in scripts), scripts  # every installed command


def test_every_example_runs_from_the_checkout_with_no_path_outside_it(doc_examples: ModuleType) -> None:
    """A fresh clone has nothing beside it: no page names ../shared, and every photo an example names is in samples/
    (the README's curl had uploaded ../shared/...: curl -s exited 26 with no output in a fresh clone)."""
    pages = doc_examples.pages(ROOT)
    assert not [str(p) for p in pages if "../shared" in p.read_text()]
    named = {m for e in doc_examples.examples(ROOT) for m in re.findall(r"(?<![\w/.])samples/[\w.*-]+", e.code)}
    assert "samples/coffee.jpg" in named
    assert all(list(ROOT.glob(n)) for n in named), sorted(n for n in named if not list(ROOT.glob(n)))
    licences = (ROOT / "samples" / "README.md").read_text()
    assert all(f"`{p.name}`" in licences for p in (ROOT / "samples").glob("*.jpg"))  # each photo's source and licence


def test_the_smoke_test_finds_the_marked_examples(doc_examples: ModuleType) -> None:
    found = doc_examples.examples(ROOT)
    assert {e.language for e in found} == {"bash", "python"}
    assert any(e.path == "README.md" and "curl" in e.code for e in found)
    assert all("```" not in e.code and e.code.strip() for e in found)


def test_a_mark_without_a_block_is_an_error_and_paths_are_made_local(doc_examples: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\n<!-- smoke -->\n```bash\ncurl -s localhost:8000/models\n```\n")
    (tmp_path / "docs" / "a.md").write_text("<!-- smoke -->\nnot a block\n")
    with pytest.raises(ValueError, match=r"docs/a.md:1"):
        doc_examples.examples(tmp_path)
    (tmp_path / "docs" / "a.md").write_text("```bash\nnot marked\n```\n")
    (only,) = doc_examples.examples(tmp_path)
    assert (only.path, only.line, only.language) == ("README.md", 5, "bash")
    code = "curl -F file=@samples/x.jpg localhost:8000/a; .venv/bin/idg-client app/static/samples/y"
    local = doc_examples.localise(code, 4321, Path("/r"))
    assert local == "curl -F file=@/r/samples/x.jpg 127.0.0.1:4321/a; /r/.venv/bin/idg-client app/static/samples/y"


def test_the_scrape_job_the_rules_select_is_the_one_shipped_and_documented() -> None:
    """The target alerts select ``up{job="idg"}``: the shipped Prometheus names its job so, and the monitoring page says
    what to change where a deployment names it otherwise (a job by another name got no alert, silently)."""
    rules = (ROOT / "deploy" / "monitoring" / "rules" / "idg.rules.yml").read_text()
    jobs = set(re.findall(r'job="([^"]+)"', rules))
    shipped = yaml.safe_load((ROOT / "deploy" / "monitoring" / "prometheus.yml").read_text())
    assert jobs == {c["job_name"] for c in shipped["scrape_configs"]} == {"idg"}, jobs
    selecting = [a["alert"] for g in yaml.safe_load(rules)["groups"] for a in g["rules"] if 'job="idg"' in a.get("expr", "")]
    page = (ROOT / "docs" / "monitoring.md").read_text()
    said = next(p for p in page.split("\n\n") if "job's name is `idg`" in p)
    assert selecting and all(f"`{name}`" in said for name in selecting), (selecting, said)
