"""The API documentation is complete and works offline: every field of every schema has a
description, every image route documents its error statuses, and /docs and /redoc load only
files this server serves (checked in the HTML, and in a real Chromium that is refused the internet)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from app.core.config import Settings
from app.main import create_app
from tests.service.conftest import AppFactory, live_server, serve, tiny_classifier

IMAGE_ROUTES = ("/predict", "/attribute", "/attribute/stream", "/attribute/batch")
IMAGE_ERRORS = ("400", "413", "415", "422", "503", "504")
URL_ATTR = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|spec-url\s*=\s*["']([^"']+)["']|url:\s*'([^']+)'""")


@pytest.fixture
async def openapi(tiny_app: AppFactory) -> dict[str, Any]:
    async with serve(tiny_app()) as client:
        r = await client.get("/openapi.json")
        assert r.status_code == 200
        return r.json()


def undescribed(doc: dict[str, Any]) -> list[str]:
    """Every property without a description: in components.schemas and in the routes' inline request bodies."""
    missing = [f"{name}.{prop}" for name, schema in doc["components"]["schemas"].items()
               for prop, spec in schema.get("properties", {}).items() if not spec.get("description")]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for ctype, content in op.get("requestBody", {}).get("content", {}).items():
                schema = content.get("schema", {})
                missing += [f"{method.upper()} {path} ({ctype}) {prop}" for prop, spec in schema.get("properties", {}).items()
                            if not spec.get("description")]
    return missing


def test_the_walk_finds_a_field_without_description() -> None:
    doc = {"components": {"schemas": {"A": {"properties": {"x": {"type": "int", "description": "x"}, "y": {"type": "int"}}}}},
           "paths": {"/p": {"post": {"requestBody": {"content": {"multipart/form-data": {"schema": {"properties": {"f": {}}}}}}}}}}
    assert undescribed(doc) == ["A.y", "POST /p (multipart/form-data) f"]


async def test_every_field_has_a_description(openapi: dict[str, Any]) -> None:
    assert len(openapi["components"]["schemas"]) >= 10
    assert undescribed(openapi) == []


async def test_image_routes_document_their_bodies_and_errors(openapi: dict[str, Any]) -> None:
    for path in IMAGE_ROUTES:
        op = openapi["paths"][path]["post"]
        assert "multipart/form-data" in op["requestBody"]["content"], path
        missing = [c for c in IMAGE_ERRORS if c not in op["responses"]]
        assert missing == [], f"{path} does not document {missing}"
        for code in IMAGE_ERRORS:
            response = op["responses"][code]
            assert response["description"] and response["description"] != "Additional Response", (path, code)
            assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}, (path, code)
    batch = openapi["paths"]["/attribute/batch"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert batch["required"] == ["files"] and batch["properties"]["files"]["type"] == "array"
    assert "text/event-stream" in openapi["paths"]["/attribute/stream"]["post"]["responses"]["200"]["content"]
    assert list(openapi["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]


def local_urls(html: str) -> list[str]:
    urls = [next(g for g in m.groups() if g) for m in URL_ATTR.finditer(html)]
    external = [u for u in urls if re.match(r"^(?:[a-z][a-z0-9+.-]*:)?//", u, re.IGNORECASE)]
    assert external == [], f"the page loads from other hosts: {external}"
    return urls


def test_local_urls_refuses_a_cdn() -> None:
    with pytest.raises(AssertionError, match="cdn.jsdelivr.net"):
        local_urls('<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>')
    with pytest.raises(AssertionError, match="fonts"):
        local_urls('<link href="//fonts.googleapis.com/css?family=Roboto" rel="stylesheet">')


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_reference_only_this_server(tiny_app: AppFactory, page: str) -> None:
    async with serve(tiny_app(api_key="k")) as client:  # the docs and their files need no key (api_keys=["k"] had set nothing)
        r = await client.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in r.headers["content-security-policy"]  # what the bundles fetch themselves stays local too
        urls = local_urls(r.text)
        assert "/openapi.json" in urls and any(u.endswith(".js") for u in urls)
        for url in urls:
            asset = await client.get(url)
            assert asset.status_code == 200 and len(asset.content) > 0, url
        if page == "/docs":
            script = (await client.get("/docs-assets/swagger-ui-bundle.js")).text
            assert "SwaggerUIBundle" in script and "swagger-ui" in (await client.get("/docs-assets/swagger-ui.css")).text


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def docs_url() -> Iterator[str]:
    yield from live_server(create_app(Settings(models=["tiny"], warmup=False), models={"tiny": tiny_classifier()}))


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")
def test_docs_render_in_a_browser_without_internet(docs_url: str) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    refused: list[str] = []

    def only_this_server(route: Any) -> None:
        if route.request.url.startswith(docs_url):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.route("**/*", only_this_server)
            page.goto(f"{docs_url}/docs")
            page.wait_for_selector(".opblock-summary-path", timeout=30_000)  # Swagger UI rendered the operations
            paths = page.locator(".opblock-summary-path").all_inner_texts()
            assert any("/attribute/batch" in p for p in paths) and any("/predict" in p for p in paths), paths
            page.goto(f"{docs_url}/redoc")
            # ReDoc rendered the routes (a text selector, not wait_for_function: the page's CSP forbids eval)
            page.get_by_text("/attribute/batch").first.wait_for(timeout=30_000)
            assert page.locator("h1").first.inner_text().startswith("IDG service")
        finally:
            browser.close()
    assert refused == []
