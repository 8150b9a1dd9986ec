"""The middleware chain, outermost first, and the response hook that adds security headers.

1. ``request_ids``: the request's id, an incoming ``X-Request-ID`` that is valid (1 to 128
   letters, digits and ``-_.:``; the edge's) or a new one; bound to every log line of the
   request (``tradecore.log_fields``) and returned in the response's ``X-Request-ID``.
2. ``guard``: the client IP through the trusted proxies, and the last-resort catch that turns
   any exception into a problem 500 without details (logged with the redacted path).
3. ``cors``: preflights and the CORS headers for ``ALLOWED_ORIGINS``, with credentials and a
   limited set of exposed headers.
4. ``browser_only`` (production only): requests need ``Origin`` or ``Referer``, and unsafe
   methods need one of ``ALLOWED_ORIGINS`` (docs/security.md), except on the specification's exempt
   paths and for bearer-only requests, which carry no ambient credential. Reading a dashboard
   page (``GET /ui/...``) needs neither: a typed URL sends no Origin or Referer.
5. ``csrf``: keeps the ``X-CSRF-Token`` header of unsafe methods for the comparison with the
   session's token, which runs when the request is authenticated by its cookie
   (``tradecore_adapters.http.principal``).
6. ``errors``: handler exceptions (``Problem``, aiohttp's HTTP errors, anything else) become
   ``application/problem+json`` responses.

A client that leaves mid-request (aiohttp's ``ClientConnectionResetError`` while reading the
body, "Cannot write to closing transport" while answering) is an ordinary event: one INFO line
without a traceback, and the access log shows 499. A connection error while the client is still
connected (an outgoing call failing) stays an unexpected error.

Security headers and ``X-Request-ID`` are set in ``on_response_prepare``, so every response
carries them: errors, 404s, preflights and aiohttp's own answers included (``X-Request-ID``
only once ``request_ids`` ran: not on a 400 to bytes that are not an HTTP request).
"""

from __future__ import annotations

import logging
import re
import uuid
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler

from tradecore.errors import StoreUnavailable
from tradecore.log_fields import LogFields, start_log_fields
from tradecore.netaddr import client_ip
from tradecore.services.vocabulary import UNAVAILABLE
from tradecore.sessions import CSRF_HEADER, CSRF_PROTECTED_METHODS
from tradecore_adapters.http.config import (
    CLIENT_CLOSED_REQUEST,
    CORS_ALLOWED_HEADERS,
    CORS_ALLOWED_METHODS,
    CORS_EXPOSED_HEADERS,
    CORS_MAX_AGE_S,
    SECURITY_HEADERS,
    SERVER_HEADER,
)
from tradecore_adapters.http.problems import Problem, problem_response, rejected_response
from tradecore_adapters.http.state import CLIENT_IP, CONFIG, CSRF_PRESENTED, redact_path

log = logging.getLogger("tradecore.http")

ACCESS_COOKIE = "access_token"
REFRESH_COOKIE = "refresh_token"

REQUEST_ID_HEADER = "X-Request-ID"
REQUEST_ID = web.RequestKey("request_id", str)
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

_BROWSER_ONLY_EXEMPT_PREFIXES = ("/webhook/", "/public/", "/setup/", "/static/")
# The dashboard's pages: a typed URL or a bookmark is a navigation without Origin or Referer.
# Only reading them is exempt; their unsafe methods still need an allowed Origin.
_PAGE_PREFIX = "/ui/"
_READ_METHODS = frozenset({"GET", "HEAD"})
_BROWSER_ONLY_EXEMPT_PATHS = frozenset(
    {
        "/",
        "/health",
        "/health/ready",
        "/docs",
        "/auth/token",  # the OAuth2 endpoint serves API clients, never sets cookies
        "/robots.txt",
        "/sitemap.xml",
        "/favicon.ico",
    }
)


def holds_nul(request: web.Request) -> bool:
    """Whether the decoded path or query holds a NUL character: no id, symbol or name may,
    and Postgres refuses one in text (a 500 there), so it is refused before any store."""
    if "\x00" in request.path:
        return True
    return any("\x00" in key or "\x00" in value for key, value in request.query.items())


def http_problem(e: web.HTTPException) -> web.Response:
    """aiohttp's own refusals (404 no route, 405 method, 413 size) as problems with a code
    like every other error (``method_not_allowed``), keeping an ``Allow`` header."""
    code = "_".join(e.reason.lower().split()) or "http_error"
    response = problem_response(e.status, e.reason, code=code)
    if "Allow" in e.headers:
        response.headers["Allow"] = e.headers["Allow"]
    return response


def client_left(request: web.Request, error: BaseException) -> bool:
    """Whether ``error`` is the client's connection going away: a connection error while the
    request's transport is closed or closing."""
    if not isinstance(error, ConnectionError):
        return False
    transport = request.transport
    return transport is None or transport.is_closing()


def unexpected(request: web.Request, error: Exception) -> web.Response:
    """The answer to an exception no layer handled: a client that left is logged at INFO
    (its answer is never delivered); anything else at ERROR with its traceback, as a 500."""
    path = redact_path(request.path)
    if client_left(request, error):
        log.info(
            "client disconnected during %s %s (%s)", request.method, path, type(error).__name__
        )
        return web.Response(status=CLIENT_CLOSED_REQUEST)
    log.error("unhandled error on %s %s", request.method, path, exc_info=error)
    return problem_response(500, "An unexpected error occurred")


def request_id_of(request: web.Request) -> str:
    """The request's id: its ``X-Request-ID`` when that is one valid id (a proxy at the edge
    sets it), else a new random one (32 hexadecimal digits). An invalid header is not an
    error: it is replaced, never logged."""
    presented = request.headers.getall(REQUEST_ID_HEADER, [])
    if len(presented) == 1 and _VALID_REQUEST_ID.fullmatch(presented[0]):
        return presented[0]
    return uuid.uuid4().hex


@web.middleware
async def request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    # aiohttp serves each request in a task of its own, so the ids bound here (and the user
    # and order ids bound later on the way) stay with this request's lines, its access-log
    # line included, and start afresh for the next request on the same connection.
    request_id = request_id_of(request)
    request[REQUEST_ID] = request_id
    start_log_fields(LogFields(request_id=request_id))
    return await handler(request)


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[CONFIG]
    request[CLIENT_IP] = client_ip(
        request.remote, request.headers.getall("X-Forwarded-For", []), config.trusted_proxies
    )
    if holds_nul(request):
        return problem_response(
            400, "The request's path or query holds a NUL character", code="invalid_request"
        )
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return http_problem(e)
    except Exception as e:
        return unexpected(request, e)


def _allowed_origin(request: web.Request, origin: str | None) -> bool:
    return origin is not None and origin in request.app[CONFIG].allowed_origins


@web.middleware
async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    origin = request.headers.get("Origin")
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        if not _allowed_origin(request, origin):
            return problem_response(403, "Origin not allowed", code="origin_not_allowed")
        assert origin is not None
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Credentials": "true",
                "Access-Control-Allow-Methods": ", ".join(CORS_ALLOWED_METHODS),
                "Access-Control-Allow-Headers": ", ".join(CORS_ALLOWED_HEADERS),
                "Access-Control-Max-Age": str(CORS_MAX_AGE_S),
                "Vary": "Origin",
            },
        )
    response = await handler(request)
    if _allowed_origin(request, origin) and not response.prepared:
        assert origin is not None
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Allow-Credentials"] = "true"
        response.headers["Access-Control-Expose-Headers"] = ", ".join(CORS_EXPOSED_HEADERS)
    if not response.prepared:
        response.headers.add("Vary", "Origin")
    return response


def browser_only_exempt(path: str) -> bool:
    """The specification's BrowserOnly exemptions (plus ``/auth/token``)."""
    return path in _BROWSER_ONLY_EXEMPT_PATHS or path.startswith(_BROWSER_ONLY_EXEMPT_PREFIXES)


def _bearer_only(request: web.Request) -> bool:
    has_cookie = ACCESS_COOKIE in request.cookies or REFRESH_COOKIE in request.cookies
    return "Authorization" in request.headers and not has_cookie


def _origin_of(request: web.Request) -> str | None:
    origin = request.headers.get("Origin")
    if origin:
        return origin
    referer = request.headers.get("Referer")
    if not referer:
        return None
    parts = urlsplit(referer)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}"


@web.middleware
async def browser_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[CONFIG]
    if not config.production or browser_only_exempt(request.path) or _bearer_only(request):
        return await handler(request)
    if request.method in _READ_METHODS and request.path.startswith(_PAGE_PREFIX):
        return await handler(request)
    if "Origin" not in request.headers and "Referer" not in request.headers:
        return problem_response(403, "Browser request required", code="browser_only")
    if request.method in CSRF_PROTECTED_METHODS and _origin_of(request) not in (
        config.allowed_origins
    ):
        return problem_response(403, "Origin not allowed", code="origin_not_allowed")
    return await handler(request)


@web.middleware
async def csrf(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method in CSRF_PROTECTED_METHODS:
        presented = request.headers.get(CSRF_HEADER)
        if presented is not None:
            request[CSRF_PRESENTED] = presented
    return await handler(request)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Problem as e:
        return rejected_response(e.rejected)
    except StoreUnavailable:
        log.warning(
            "503 on %s %s: a store is unavailable", request.method, redact_path(request.path)
        )
        return rejected_response(UNAVAILABLE)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return http_problem(e)
    except Exception as e:
        return unexpected(request, e)


MIDDLEWARES = (request_ids, guard, cors, browser_only, csrf, errors)


async def security_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the specification's headers on every response, the Server
    header without a version, ``no-store`` unless the handler chose a cache policy, and the
    request's ``X-Request-ID`` once ``request_ids`` gave it one."""
    config = request.app[CONFIG] if isinstance(request, web.Request) else None
    response.headers.update(SECURITY_HEADERS if config is None else config.security_headers)
    request_id = request.get(REQUEST_ID)
    if request_id is not None:
        response.headers[REQUEST_ID_HEADER] = request_id
    response.headers["Server"] = SERVER_HEADER
    response.headers.setdefault("Cache-Control", "no-store")
