"""Who is asking: the request's principal, with the CSRF check of cookie sessions.

Token sources, in the specification's order: the ``access_token`` cookie, then
``Authorization: Bearer`` (an API key or an access token). A cookie-authenticated request with
an unsafe method on a non-exempt path must carry the session's CSRF token in
``X-CSRF-Token``; otherwise it is refused with 403 and audited ``csrf_validation_failed``
(no mail). Bearer requests need no CSRF token: they carry no ambient credential.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web

from tradecore.attacks import csrf_metadata
from tradecore.audit import AuditAction
from tradecore.log_fields import bind_log_fields
from tradecore.services.vocabulary import BROWSER_SESSION_REQUIRED, Principal, Rejected
from tradecore.sessions import csrf_matches, csrf_required
from tradecore_adapters.http.middlewares import ACCESS_COOKIE
from tradecore_adapters.http.problems import Problem
from tradecore_adapters.http.state import CSRF_PRESENTED, SERVICES, request_context

CSRF_FAILED = Rejected(403, "csrf_failed", "CSRF token missing or invalid")


def bearer_token(request: web.Request) -> str | None:
    """The value of ``Authorization: Bearer <token>`` (scheme case-insensitive), or None."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    value = value.strip()
    return value or None


async def authenticate(request: web.Request, *, browser_session: bool = False) -> Principal:
    """The principal of ``request``, or a raised Problem: 401 without valid credentials, 403
    for a disabled user, a CSRF failure, or (``browser_session``) an API key on an endpoint
    that manages credentials."""
    services = request.app[SERVICES]
    cookie = request.cookies.get(ACCESS_COOKIE) or None
    outcome = await services.authentication.authenticate(cookie, bearer_token(request))
    if isinstance(outcome, Rejected):
        raise Problem(outcome)
    principal = outcome
    bind_log_fields(user_id=principal.user_id)  # the request's later log lines name the user
    if principal.via_cookie and csrf_required(request.method, request.path):
        session = principal.session
        presented = request.get(CSRF_PRESENTED)
        if session is None or not csrf_matches(presented, session.csrf_token):
            reason: Literal["missing", "mismatch"] = "missing" if not presented else "mismatch"
            await services.events.record(
                AuditAction.CSRF_VALIDATION_FAILED,
                request_context(request),
                user_id=principal.user_id,
                success=False,
                error_message=f"CSRF token {reason}",
                resource_type="session",
                resource_id=None if session is None else session.id,
                metadata=csrf_metadata(reason),
            )
            raise Problem(CSRF_FAILED)
    if browser_session and not principal.has_browser_session:
        raise Problem(BROWSER_SESSION_REQUIRED)
    return principal


async def audit_refusal(
    request: web.Request,
    action: AuditAction,
    rejected: Rejected,
    *,
    user_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Problem:
    """Record a refusal decided by the HTTP layer itself (a malformed body) and return the
    Problem to raise, so the request still leaves its one audit entry."""
    await request.app[SERVICES].events.record(
        action,
        request_context(request),
        user_id=user_id,
        success=False,
        error_message=rejected.detail[:200],
        metadata=metadata,
    )
    return Problem(rejected)
