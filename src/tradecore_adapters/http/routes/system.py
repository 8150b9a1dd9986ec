"""Health, the OpenAPI document, and the API reference page with its own assets.

``/docs`` is a static HTML page whose script (served from ``/static/docs/``, no CDN, no inline
script) renders ``/openapi.json``, so it loads under the service's own Content-Security-Policy.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from tradecore_adapters.http import views
from tradecore_adapters.http.problems import fail
from tradecore_adapters.http.state import OPENAPI, SERVICES

ASSET_TYPES = {
    "docs.js": "text/javascript",
    "docs.css": "text/css",
}
ASSET_CACHE = "public, max-age=3600"

routes = web.RouteTableDef()


def _asset(name: str) -> bytes:
    return resources.files("tradecore_adapters.http").joinpath("static", name).read_bytes()


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    """200 while the process serves."""
    return views.json_response({"status": "ok"})


@routes.get("/health/ready")
async def ready(request: web.Request) -> web.Response:
    """200 only when the stores answer; 503 otherwise."""
    try:
        is_ready = await request.app[SERVICES].readiness.ready()
    except Exception:
        is_ready = False
    if not is_ready:
        raise fail(503, "not_ready", "A store does not answer")
    return views.json_response({"status": "ready"})


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[OPENAPI],
        content_type="application/json",
        headers={"Cache-Control": "no-cache"},
    )


@routes.get("/docs")
async def docs(request: web.Request) -> web.Response:
    return web.Response(
        body=_asset("docs.html"),
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-cache"},
    )


@routes.get("/static/docs/{name}")
async def docs_asset(request: web.Request) -> web.Response:
    """Only the listed files: no directory listing, no path from the request reaches the
    file system."""
    name = request.match_info["name"]
    content_type = ASSET_TYPES.get(name)
    if content_type is None:
        raise fail(404, "not_found", "Not found")
    return web.Response(
        body=_asset(name),
        content_type=content_type,
        charset="utf-8",
        headers={"Cache-Control": ASSET_CACHE},
    )
