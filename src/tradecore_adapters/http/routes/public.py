"""``/public/*``: what anyone may read without a session: the current terms of service and
the public key the dashboard encrypts broker credentials with (also served at its older path
``/auth/public-key``). Both are exempt from CSRF and BrowserOnly, as the specification lists.
"""

from __future__ import annotations

from aiohttp import web

from tradecore_adapters.http import views
from tradecore_adapters.http.routes import auth
from tradecore_adapters.http.state import CONFIG

TERMS_TEXT = (
    "tradecore sends the orders your alerts and this dashboard ask for to the broker of each "
    "trading account, with that account's credentials. Orders are refused until you accept "
    "the current version."
)
"""The terms as the dashboard's terms page states them."""

routes = web.RouteTableDef()


@routes.get("/public/terms")
async def terms(request: web.Request) -> web.Response:
    """``{"version", "text"}``: the terms in force (TERMS_VERSION). A user accepts them with
    ``POST /auth/accept-terms {version}``."""
    version = request.app[CONFIG].terms_version
    return views.json_response(
        {"version": version, "text": TERMS_TEXT}, headers={"Cache-Control": "no-cache"}
    )


@routes.get("/public/public-key")
async def public_key(request: web.Request) -> web.StreamResponse:
    """The same JWK as ``GET /auth/public-key``."""
    return await auth.public_key(request)
