"""The words every service group shares: a refusal, the authenticated caller, and the rule
that a store outage is answered with 503.

Services import this module downward; no service group imports another's refusals.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import attrs

from tradecore.errors import StoreUnavailable
from tradecore.identity import ApiKey, Plan, Session, User

P = ParamSpec("P")
T = TypeVar("T")


@attrs.frozen
class Rejected:
    """A refusal. ``code`` is a stable machine-readable word; ``detail`` is safe to show (it
    never reveals which hidden check failed beyond what the status already says)."""

    status: int
    code: str
    detail: str
    retry_after_s: float | None = None


UNAVAILABLE = Rejected(503, "unavailable", "Service temporarily unavailable")
"""A store did not answer: nothing was changed that the caller can see, so a retry is safe."""

NOT_FOUND = Rejected(404, "not_found", "Not found")
"""No such thing of the caller's: a missing one and another user's get the same answer."""

ACCOUNT_NOT_FOUND = Rejected(404, "not_found", "Trading account not found")
"""``NOT_FOUND`` for a trading account named by its id (order and account requests alike)."""

CONFLICT = Rejected(
    409, "conflict", "The account was changed by another request at the same time; try again"
)
"""A compare-and-set save lost to another request on every attempt; nothing was changed."""

BROWSER_SESSION_REQUIRED = Rejected(
    403, "browser_session_required", "Credentials are managed from a browser session"
)
"""Credentials (API keys, allowed IPs, webhook and broker credentials) are managed from a
browser session: a request made with an API key is refused."""


ADMIN_REQUIRED = Rejected(403, "admin_required", "This endpoint is for administrators only")
"""The operator endpoints (``/setup/*`` once set up, ``/deployment/*``) refuse an
authenticated caller who is not an administrator."""


def bad_request(detail: str) -> Rejected:
    """400 with a reason that is safe to show."""
    return Rejected(400, "invalid_request", detail)


def refuses_outages(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T | Rejected]]:
    """Answer ``StoreUnavailable`` raised by ``method`` with ``UNAVAILABLE`` (503).

    The one place where a store outage becomes a refusal. Use it on a use case whose every
    store call may fail alike; a use case that must undo something when a store fails (the
    order intake releasing its replay key) handles ``StoreUnavailable`` itself."""

    @functools.wraps(method)
    async def answering_outages(*args: P.args, **kwargs: P.kwargs) -> T | Rejected:
        try:
            return await method(*args, **kwargs)
        except StoreUnavailable:
            return UNAVAILABLE

    return answering_outages


@attrs.frozen(repr=False)
class Principal:
    """Who is making a request. ``session`` is None for an API key (``api_key`` set), and
    ``via_cookie`` is true only for the access-token cookie (CSRF and BrowserOnly apply).
    ``plan`` is the plan in force at the time of the request (expired subscriptions drop to
    free)."""

    user: User
    session: Session | None
    api_key: ApiKey | None
    via_cookie: bool
    plan: Plan

    @property
    def user_id(self) -> str:
        return self.user.id

    @property
    def has_browser_session(self) -> bool:
        """True for a session token (cookie or bearer), false for an API key."""
        return self.session is not None

    def __repr__(self) -> str:
        session_id = None if self.session is None else self.session.id
        key_id = None if self.api_key is None else self.api_key.id
        return (
            f"Principal(user_id={self.user.id!r}, session_id={session_id!r}, "
            f"api_key_id={key_id!r}, via_cookie={self.via_cookie}, plan={self.plan.value!r})"
        )
