"""Signing up: ``POST /auth/register`` and ``POST /auth/accept-terms``.

Registration reveals no account: a new address and a taken one get the same answer (202, "check
your mail") after the same password work (the password is hashed either way, before the store
says whether the address is free). The mail tells the difference, to the owner of the address
only: a new user is welcomed and asked to log in; the owner of an existing account is told
that someone tried to register with the address (if it was them: log in, or reset the
password), at most once per ``NOTICE_INTERVAL``. Mails are sent in the background, best
effort. Nobody is signed in by registering: the next step is a login. A new user is on the
free plan and has not accepted the terms yet. Each call leaves one audit entry
(``IdentityAudit``); none holds a password. An unreachable store is 503. Attempts that pass
the bot challenge are throttled per client address (429 with Retry-After, before any password
work).
"""

from __future__ import annotations

import asyncio
import html
import logging
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

import attrs

from tradecore.attacks import throttled_metadata
from tradecore.audit import AuditAction, RequestContext
from tradecore.identity import Plan, User
from tradecore.ports.identity import Mailer, MailMessage, PasswordHasher
from tradecore.ports.protection import AlertThrottle, RateLimiter
from tradecore.ports.repositories import UserRepository
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.identity.bot_challenge import BotChallenge
from tradecore.services.identity.settings import AuthSettings
from tradecore.services.identity.throttling import AttemptThrottle, Throttled, ip_window
from tradecore.services.vocabulary import (
    CONFLICT,
    NOT_FOUND,
    Principal,
    Rejected,
    bad_request,
    refuses_outages,
)
from tradecore.sessions import normalize_email, validate_password

log = logging.getLogger(__name__)

NOTICE_INTERVAL = timedelta(minutes=30)
"""At most one "someone tried to register with your address" mail per account this often."""
MAIL_TIMEOUT_S = 10.0
SAVE_ATTEMPTS = 2
"""A lost compare-and-set on the user (``UserRepository.save``) is read again and tried once
more."""


def welcome_mail(to: str, link_base: str) -> MailMessage:
    """The mail to a new user: the account exists, log in to continue."""
    login = f"{link_base.rstrip('/')}/ui/login"
    reset = f"{link_base.rstrip('/')}/ui/forgot-password"
    text = (
        "Your tradecore account for this address is ready.\n\n"
        f"Log in to continue:\n{login}\n\n"
        "If you did not create it, someone else used your address: take the account over by "
        f"resetting its password at {reset}, or ignore this mail.\n"
    )
    body = (
        "<!DOCTYPE html><html><body>"
        "<p>Your tradecore account for this address is ready.</p>"
        f'<p><a href="{html.escape(login)}">Log in to continue</a>.</p>'
        "<p>If you did not create it, someone else used your address: take the account over "
        f'by <a href="{html.escape(reset)}">resetting its password</a>, or ignore this mail.</p>'
        "</body></html>"
    )
    return MailMessage(to=to, subject="Your account is ready", text=text, html=body)


def taken_address_mail(to: str, link_base: str) -> MailMessage:
    """The mail to the owner of an existing account when someone registers with its address."""
    login = f"{link_base.rstrip('/')}/ui/login"
    reset = f"{link_base.rstrip('/')}/ui/forgot-password"
    text = (
        "Someone tried to create a new tradecore account with this e-mail address. You already "
        "have an account, so nothing was created and nothing changed.\n\n"
        f"If it was you, log in:\n{login}\n\n"
        f"Forgot your password? Reset it:\n{reset}\n\n"
        "If it was not you, ignore this mail: your account and password are unchanged.\n"
    )
    body = (
        "<!DOCTYPE html><html><body>"
        "<p>Someone tried to create a new tradecore account with this e-mail address. You "
        "already have an account, so nothing was created and nothing changed.</p>"
        f'<p>If it was you, <a href="{html.escape(login)}">log in</a>. Forgot your password? '
        f'<a href="{html.escape(reset)}">Reset it</a>.</p>'
        "<p>If it was not you, ignore this mail: your account and password are unchanged.</p>"
        "</body></html>"
    )
    return MailMessage(
        to=to, subject="Someone tried to register with your address", text=text, html=body
    )


class Registration:
    """New users and their acceptance of the terms (see the module docstring).
    ``terms_version`` is the version in force (TERMS_VERSION); ``link_base`` is
    PUBLIC_BASE_URL, for the links in the mails. Without a ``mailer`` no mail is sent; without
    a ``throttle`` every attempt on a taken address is mailed; without a ``limiter`` no
    attempt is throttled (``settings.register_attempts_per_ip`` per ``throttle_window_s``)."""

    def __init__(
        self,
        users: UserRepository,
        hasher: PasswordHasher,
        challenge: BotChallenge,
        audit: IdentityAudit,
        clock: Clock,
        random: RandomSource,
        *,
        terms_version: str,
        mailer: Mailer | None = None,
        throttle: AlertThrottle | None = None,
        link_base: str = "http://127.0.0.1:8080",
        limiter: RateLimiter | None = None,
        settings: AuthSettings | None = None,
    ) -> None:
        self._settings = settings or AuthSettings()
        self._attempts = AttemptThrottle(limiter, self._settings.throttle_window_s)
        self._users = users
        self._hasher = hasher
        self._challenge = challenge
        self._audit = audit
        self._clock = clock
        self._random = random
        self._terms_version = terms_version
        self._mailer = mailer
        self._throttle = throttle
        self._link_base = link_base
        self._pending: set[asyncio.Task[None]] = set()

    @refuses_outages
    async def register(
        self, email: object, password: object, turnstile_token: object, context: RequestContext
    ) -> Rejected | None:
        """``POST /auth/register``: bot challenge, then None (202) whether the address was
        free (a new user on the free plan, without the terms, is stored and welcomed by mail)
        or taken (its owner is told by mail); the password is hashed either way. 400 bad
        input, 403 challenge refused, 429 too many attempts from the client address."""
        record = self._audit.record
        metadata = {"captcha_bypassed": True} if self._challenge.bypassed(context) else None
        refused = await self._challenge.check(turnstile_token, context)
        if refused is not None:
            await record(AuditAction.REGISTER, context, None, refused.code, metadata=metadata)
            return refused
        limit = self._settings.register_attempts_per_ip
        taken = await self._attempts.take([ip_window("register", context.ip_address, limit)])
        if isinstance(taken, Throttled):
            details = {**(metadata or {}), **throttled_metadata("registration_flood", taken.rule)}
            await record(AuditAction.REGISTER, context, None, "rate limited", metadata=details)
            return taken.rejection()
        normalized = normalize_email(email)
        problem = "email is not a valid e-mail address" if normalized is None else None
        problem = problem or validate_password(password)
        if problem is not None or normalized is None or not isinstance(password, str):
            await record(AuditAction.REGISTER, context, None, "invalid request")
            return bad_request(problem or "invalid request")
        # Hashed before the store answers, so a taken address costs the same work.
        user = User(
            id=self._random.new_id(),
            email=normalized,
            password_hash=await self._hasher.hash(password),
            plan=Plan.FREE,
            created_at=self._clock.now(),
        )
        if not await self._users.add(user):
            await record(AuditAction.REGISTER, context, None, "email taken")
            self._in_background(self._notify_owner(normalized))
            return None
        await record(AuditAction.REGISTER, context, user.id, resource=("user", user.id))
        self._in_background(self._send(welcome_mail(user.email, self._link_base)))
        return None

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _notify_owner(self, email: str) -> None:
        """Tell the active owner of ``email`` that someone tried to register with it, at most
        once per NOTICE_INTERVAL; failures are logged."""
        if self._mailer is None:
            return
        try:
            owner = await self._users.by_email(email)
            if owner is None or owner.disabled:
                return
            if self._throttle is not None:
                slot, period = f"register-notice:{owner.id}", int(NOTICE_INTERVAL.total_seconds())
                if not await self._throttle.try_claim(slot, period):
                    return
            await self._send(taken_address_mail(owner.email, self._link_base))
        except Exception:
            log.exception("registration notice not sent")

    async def _send(self, message: MailMessage) -> None:
        if self._mailer is None:
            return
        try:
            await asyncio.wait_for(self._mailer.send(message), MAIL_TIMEOUT_S)
        except Exception:
            log.exception("registration mail not sent")

    async def drain(self) -> None:
        """Wait for the mails in flight (shutdown and tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    @refuses_outages
    async def accept_terms(
        self, principal: Principal, version: object, context: RequestContext
    ) -> User | Rejected:
        """``POST /auth/accept-terms``: record that the user accepted ``version``, which must
        be the current TERMS_VERSION (400 otherwise). The updated user; a concurrent change
        of the user is read again and the version set once more (409 when that loses too)."""
        action = AuditAction.TERMS_ACCEPTED
        if not isinstance(version, str) or version != self._terms_version:
            await self._audit.record(action, context, principal.user_id, "unknown version")
            return bad_request(f"version must be the current terms version {self._terms_version!r}")
        for _ in range(SAVE_ATTEMPTS):
            user = await self._users.get(principal.user_id)
            if user is None:
                return NOT_FOUND
            accepted = attrs.evolve(user, accepted_terms_version=version)
            stored = await self._users.save(accepted, previous=user)
            if stored is not None:
                await self._audit.record(
                    action,
                    context,
                    stored.id,
                    resource=("user", stored.id),
                    metadata={"version": version},
                )
                return stored
        await self._audit.record(action, context, principal.user_id, "changed concurrently")
        return CONFLICT
