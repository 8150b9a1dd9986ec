"""``/auth/*``: login, register, the OAuth2 token endpoint, password reset, silent refresh,
logout, the public key, the current user and terms acceptance.

Cookies: ``access_token`` (path ``/``) and ``refresh_token`` (path ``/auth``, the only paths
that read it), both HttpOnly, Secure, SameSite=Strict, with ``COOKIE_DOMAIN`` and the token
lifetimes as Max-Age. The CSRF token travels in response bodies only (login and silent
refresh), never in a cookie.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from aiohttp import web

from tradecore.audit import AuditAction
from tradecore.identity import User
from tradecore.ports.crypto import TransportKeyUnavailable
from tradecore.services.identity.login import LoginResult
from tradecore.services.identity.session_tokens import IssuedTokens
from tradecore.services.vocabulary import UNAVAILABLE, Principal, Rejected
from tradecore_adapters.http import views
from tradecore_adapters.http.bodies import form_fields, json_object
from tradecore_adapters.http.middlewares import ACCESS_COOKIE, REFRESH_COOKIE
from tradecore_adapters.http.principal import audit_refusal, authenticate
from tradecore_adapters.http.problems import Problem, rejected_response
from tradecore_adapters.http.state import CONFIG, SERVICES, request_context

log = logging.getLogger(__name__)

REFRESH_COOKIE_PATH = "/auth"
REGISTER_ACCEPTED = "Check your mail to continue"

routes = web.RouteTableDef()


async def _json(request: web.Request, action: AuditAction) -> dict[str, Any]:
    """The JSON body; a malformed one is refused and audited under ``action``."""
    try:
        return await json_object(request)
    except Problem as e:
        raise await audit_refusal(request, action, e.rejected) from None


def _seconds_until(when: datetime, now: datetime) -> int:
    return max(0, int((when - now).total_seconds()))


def set_session_cookies(request: web.Request, response: web.Response, tokens: IssuedTokens) -> None:
    config = request.app[CONFIG]
    now = request.app[SERVICES].clock.now()
    common: dict[str, Any] = {
        "domain": config.cookie_domain,
        "secure": True,
        "httponly": True,
        "samesite": "Strict",
    }
    response.set_cookie(
        ACCESS_COOKIE,
        tokens.access_token,
        max_age=_seconds_until(tokens.access_expires_at, now),
        path="/",
        **common,
    )
    response.set_cookie(
        REFRESH_COOKIE,
        tokens.refresh_token,
        max_age=_seconds_until(tokens.refresh_expires_at, now),
        path=REFRESH_COOKIE_PATH,
        **common,
    )


def clear_session_cookies(request: web.Request, response: web.Response) -> None:
    domain = request.app[CONFIG].cookie_domain
    for name, path in ((ACCESS_COOKIE, "/"), (REFRESH_COOKIE, REFRESH_COOKIE_PATH)):
        response.set_cookie(
            name,
            "",
            max_age=0,
            expires="Thu, 01 Jan 1970 00:00:00 GMT",
            domain=domain,
            path=path,
            secure=True,
            httponly=True,
            samesite="Strict",
        )


def _user_body(request: web.Request, user: User) -> dict[str, Any]:
    services, config = request.app[SERVICES], request.app[CONFIG]
    plan = user.effective_plan(services.clock.now())
    return views.user(user, plan=plan, terms_version=config.terms_version)


@routes.post("/auth/login")
async def login(request: web.Request) -> web.Response:
    body = await _json(request, AuditAction.LOGIN)
    outcome = await request.app[SERVICES].password_login.login(
        body.get("email"),
        body.get("password"),
        body.get("turnstile_token"),
        request_context(request),
    )
    if isinstance(outcome, Rejected):
        return rejected_response(outcome)
    result: LoginResult = outcome
    response = views.json_response(
        {"user": _user_body(request, result.user), "csrf_token": result.csrf_token}
    )
    set_session_cookies(request, response, result.tokens)
    return response


@routes.post("/auth/register")
async def register(request: web.Request) -> web.Response:
    body = await _json(request, AuditAction.REGISTER)
    outcome = await request.app[SERVICES].registration.register(
        body.get("email"),
        body.get("password"),
        body.get("turnstile_token"),
        request_context(request),
    )
    if isinstance(outcome, Rejected):
        return rejected_response(outcome)
    # The same answer for a new and a taken address: the mail tells the owner which it was.
    return views.json_response({"detail": REGISTER_ACCEPTED}, status=202)


def _token_body(request: web.Request, tokens: IssuedTokens) -> web.Response:
    now = request.app[SERVICES].clock.now()
    return views.json_response(
        {
            "access_token": tokens.access_token,
            "token_type": "bearer",
            "expires_in": _seconds_until(tokens.access_expires_at, now),
            "refresh_token": tokens.refresh_token,
        }
    )


@routes.post("/auth/token")
async def token(request: web.Request) -> web.Response:
    """OAuth2 (RFC 6749): ``grant_type=password`` with ``username`` and ``password``, or
    ``grant_type=refresh_token`` with ``refresh_token``. Errors are problem responses."""
    try:
        fields = await form_fields(request)
    except Problem as e:
        raise await audit_refusal(request, AuditAction.LOGIN, e.rejected) from None
    services, context = request.app[SERVICES], request_context(request)
    grant = fields.get("grant_type")
    outcome: IssuedTokens | Rejected
    if grant == "password":
        outcome = await services.password_login.password_grant(
            fields.get("username"), fields.get("password"), context
        )
    elif grant == "refresh_token":
        refresh_token = fields.get("refresh_token") or None
        outcome = await services.session_lifetime.refresh(refresh_token, context)
    else:
        raise await audit_refusal(
            request,
            AuditAction.LOGIN,
            Rejected(400, "unsupported_grant_type", "grant_type must be password or refresh_token"),
        )
    if isinstance(outcome, Rejected):
        return rejected_response(outcome)
    return _token_body(request, outcome)


@routes.post("/auth/forgot-password")
async def forgot_password(request: web.Request) -> web.Response:
    body = await _json(request, AuditAction.PASSWORD_RESET_REQUESTED)
    refused = await request.app[SERVICES].password_reset.forgot_password(
        body.get("email"), request_context(request)
    )
    if refused is not None:
        return rejected_response(refused)
    return views.json_response(
        {"detail": "If the address belongs to an account, a reset link is on its way."},
        status=202,
    )


@routes.post("/auth/reset-password")
async def reset_password(request: web.Request) -> web.Response:
    body = await _json(request, AuditAction.PASSWORD_RESET)
    refused = await request.app[SERVICES].password_reset.reset_password(
        body.get("token"), body.get("password"), request_context(request)
    )
    if refused is not None:
        return rejected_response(refused)
    return web.Response(status=204)


@routes.post("/auth/silent-refresh")
async def silent_refresh(request: web.Request) -> web.Response:
    """A new access token and a rotated refresh token (both cookies), and the session's CSRF
    token again so a new browser tab can pick it up."""
    services = request.app[SERVICES]
    outcome = await services.session_lifetime.refresh(
        request.cookies.get(REFRESH_COOKIE) or None, request_context(request)
    )
    if isinstance(outcome, Rejected):
        response = rejected_response(outcome)
        if outcome.status == 401:
            clear_session_cookies(request, response)
        return response
    principal = await services.authentication.authenticate(outcome.access_token, None)
    csrf_token = (
        principal.session.csrf_token
        if isinstance(principal, Principal) and principal.session is not None
        else None
    )
    response = views.json_response(
        {
            "csrf_token": csrf_token,
            "access_expires_at": views.timestamp(outcome.access_expires_at),
            "refresh_expires_at": views.timestamp(outcome.refresh_expires_at),
        }
    )
    set_session_cookies(request, response, outcome)
    return response


@routes.post("/auth/logout")
async def logout(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    await request.app[SERVICES].session_lifetime.logout(principal, request_context(request))
    response = web.Response(status=204)
    clear_session_cookies(request, response)
    return response


@routes.get("/auth/public-key")
async def public_key(request: web.Request) -> web.Response:
    """The RSA public key (JWK, ``alg`` RSA-OAEP-256) the dashboard encrypts broker
    credentials with; the same in every process of the deployment."""
    try:
        jwk = await request.app[SERVICES].transport_key.public_jwk()
    except TransportKeyUnavailable as e:
        log.error("GET /auth/public-key: %s", e)  # a configuration fault the operator must fix
        raise Problem(UNAVAILABLE) from None
    return views.json_response(dict(jwk), headers={"Cache-Control": "public, max-age=300"})


@routes.get("/auth/me")
async def me(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    return views.json_response({"user": _user_body(request, principal.user)})


@routes.post("/auth/accept-terms")
async def accept_terms(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    try:
        body = await json_object(request)
    except Problem as e:
        raise await audit_refusal(
            request, AuditAction.TERMS_ACCEPTED, e.rejected, user_id=principal.user_id
        ) from None
    outcome = await request.app[SERVICES].registration.accept_terms(
        principal, body.get("version"), request_context(request)
    )
    if isinstance(outcome, Rejected):
        return rejected_response(outcome)
    return web.Response(status=204)
