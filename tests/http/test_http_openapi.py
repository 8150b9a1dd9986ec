"""The OpenAPI document and the reference page: every route documented and every documented
operation routed, references resolve, ``/docs`` loads under the CSP from the app's own
assets."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any

from http_support import Env

from tradecore_adapters.http.app import openapi_document

UNDOCUMENTED = {("GET", "/static/docs/{}")}


def _template(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_document_is_openapi_3_1_and_every_reference_resolves() -> None:
    doc = json.loads(openapi_document())
    assert doc["openapi"].startswith("3.1")
    for ref in _refs(doc):
        node: Any = doc
        for part in ref.removeprefix("#/").split("/"):
            assert part in node, ref
            node = node[part]
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            assert operation["responses"], (method, path)
            assert "default" in operation["responses"], (method, path)


def test_decimals_are_documented_as_strings() -> None:
    doc = json.loads(openapi_document())
    decimal = doc["components"]["schemas"]["Decimal"]
    assert decimal["type"] == "string"
    result = doc["components"]["schemas"]["OrderResult"]["properties"]
    assert result["quantity"] == {"$ref": "#/components/schemas/Decimal"}


def test_every_route_is_documented_and_every_operation_routed(env: Env) -> None:
    """Every JSON route; the dashboard's HTML pages and fragments (routes named ``ui.*``,
    docs/dashboard.md) are not part of the API."""
    doc = json.loads(openapi_document())
    documented = {
        (method.upper(), _template(path)) for path, item in doc["paths"].items() for method in item
    }
    routed = {
        (route.method, _template(route.resource.canonical))
        for route in env.client.app.router.routes()  # type: ignore[union-attr]
        if route.method != "HEAD"
        and route.resource is not None
        and not (route.name or "").startswith("ui.")
    }
    assert routed - UNDOCUMENTED == documented


async def test_openapi_json_is_served(env: Env) -> None:
    response = await env.client.get("/openapi.json")
    assert response.status == 200
    assert json.loads(await response.read()) == json.loads(openapi_document())


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.inline_script = False
        self.handlers: list[str] = []
        self.styles: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.handlers += [name for name in attributes if name.startswith("on")]
        if "style" in attributes:
            self.styles.append(tag)
        if tag == "script":
            self.scripts.append(attributes)
            self._in_script = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline_script = True


async def test_docs_page_runs_under_the_csp_with_its_own_assets(env: Env) -> None:
    page = await env.client.get("/docs")
    assert page.status == 200
    assert page.headers["Content-Type"].startswith("text/html")
    tags = _Tags()
    tags.feed(await page.text())
    assert not tags.inline_script and not tags.handlers and not tags.styles
    sources = [s["src"] for s in tags.scripts]
    assert sources == ["/static/docs/docs.js"]
    script = await env.client.get("/static/docs/docs.js")
    assert script.status == 200
    assert script.headers["Content-Type"].startswith("text/javascript")
    code = await script.text()
    assert "/openapi.json" in code
    assert "innerHTML" not in code and "eval(" not in code
    css = await env.client.get("/static/docs/docs.css")
    assert css.headers["Content-Type"].startswith("text/css")
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp


async def test_static_route_serves_only_listed_files(env: Env) -> None:
    for name in ("docs.html", "..%2Fopenapi.json", "app.py", "%2e%2e%2fapp.py"):
        response = await env.client.get(f"/static/docs/{name}")
        assert response.status == 404, name
