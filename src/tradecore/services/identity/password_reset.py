"""Forgotten and reset passwords: ``POST /auth/forgot-password`` and
``POST /auth/reset-password``.

The forgotten-password request reveals nothing: it is accepted for any well-formed address
and mails only when the account exists, in the background, at most once per user per
``ResetSettings.mail_interval`` (so the form cannot flood someone's mailbox). The mailed
link carries a single-use token, stored only as its digest. A reset replaces the password,
drops every outstanding reset token of the user and ends every session.

Each call leaves one audit entry (``IdentityAudit``); none holds a password or a reset token. An
unreachable store is 503.
"""

from __future__ import annotations

import asyncio
import html
import logging
from datetime import timedelta

import attrs

from tradecore.attacks import throttled_metadata
from tradecore.audit import AuditAction, RequestContext
from tradecore.ports.identity import Mailer, MailMessage, PasswordHasher
from tradecore.ports.protection import AlertThrottle, RateLimiter
from tradecore.ports.repositories import SessionRepository, UserRepository
from tradecore.ports.resets import PasswordResetTokens
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.identity.settings import AuthSettings
from tradecore.services.identity.throttling import AttemptThrottle, Throttled, ip_window
from tradecore.services.vocabulary import Rejected, bad_request, refuses_outages
from tradecore.sessions import hash_token, normalize_email, validate_password

log = logging.getLogger(__name__)

RESET_TOKEN_BYTES = 32
MAX_RESET_TOKEN_CHARS = 256
INVALID_RESET_TOKEN = Rejected(
    400, "invalid_reset_token", "The reset link is invalid or has expired; request a new one"
)
RESET_CONFLICT = Rejected(
    409,
    "conflict",
    "The password was changed by another request at the same time; request a new reset link",
)
SAVE_ATTEMPTS = 2
"""A lost compare-and-set on the user (``UserRepository.save``) is read again and tried once
more."""


@attrs.frozen
class ResetSettings:
    """``link_base`` is PUBLIC_BASE_URL: the mailed link is
    ``{link_base}/reset-password#token={token}`` (a fragment, so the token reaches no server
    log or Referer). A token is good for ``ttl``; at most one reset mail per user per
    ``mail_interval``; a mail not handed over within ``mail_timeout_s`` is given up."""

    link_base: str = "http://127.0.0.1:8080"
    ttl: timedelta = attrs.field(
        default=timedelta(minutes=30), validator=attrs.validators.gt(timedelta(0))
    )
    mail_interval: timedelta = attrs.field(
        default=timedelta(minutes=1), validator=attrs.validators.gt(timedelta(0))
    )
    mail_timeout_s: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))


def reset_mail(to: str, link: str, valid_for: timedelta) -> MailMessage:
    """The password-reset mail. ``link`` carries the token; nothing else in it is secret."""
    minutes = int(valid_for.total_seconds() // 60)
    text = (
        "Someone (hopefully you) asked to reset the password of this account.\n\n"
        f"Open this link within {minutes} minutes to choose a new password:\n{link}\n\n"
        "The link works once. Resetting the password ends every signed-in session.\n"
        "If you did not ask for this, ignore this mail: your password has not changed.\n"
    )
    body = (
        "<!DOCTYPE html><html><body>"
        "<p>Someone (hopefully you) asked to reset the password of this account.</p>"
        f'<p><a href="{html.escape(link)}">Choose a new password</a> '
        f"(valid for {minutes} minutes, once).</p>"
        "<p>Resetting the password ends every signed-in session. If you did not ask for this, "
        "ignore this mail: your password has not changed.</p>"
        "</body></html>"
    )
    return MailMessage(to=to, subject="Reset your password", text=text, html=body)


class PasswordReset:
    """The reset mail and the reset itself (see the module docstring). Without a
    ``throttle`` every request for an active account is mailed; without a ``limiter`` no
    request is throttled per client address (``auth.forgot_password_attempts_per_ip`` per
    ``auth.throttle_window_s``)."""

    def __init__(
        self,
        users: UserRepository,
        sessions: SessionRepository,
        resets: PasswordResetTokens,
        hasher: PasswordHasher,
        mailer: Mailer,
        audit: IdentityAudit,
        clock: Clock,
        random: RandomSource,
        settings: ResetSettings | None = None,
        *,
        throttle: AlertThrottle | None = None,
        limiter: RateLimiter | None = None,
        auth: AuthSettings | None = None,
    ) -> None:
        self._auth = auth or AuthSettings()
        self._attempts = AttemptThrottle(limiter, self._auth.throttle_window_s)
        self._users = users
        self._sessions = sessions
        self._resets = resets
        self._hasher = hasher
        self._mailer = mailer
        self._audit = audit
        self._clock = clock
        self._random = random
        self._settings = settings or ResetSettings()
        self._throttle = throttle
        self._pending: set[asyncio.Task[None]] = set()

    # --- the reset mail -----------------------------------------------------------------

    @refuses_outages
    async def forgot_password(self, email: object, context: RequestContext) -> Rejected | None:
        """``POST /auth/forgot-password``: None (202) for every well-formed address; when it
        belongs to an active account, a single-use reset token valid for ``ttl`` is stored
        (as its digest) and mailed in the background. 400 only for a malformed address,
        which reveals nothing about accounts. 429 (before the address is looked up) after
        too many requests from the client address."""
        action = AuditAction.PASSWORD_RESET_REQUESTED
        normalized = normalize_email(email)
        if normalized is None:
            await self._audit.record(action, context, None, "invalid")
            return bad_request("email is not a valid e-mail address")
        limit = self._auth.forgot_password_attempts_per_ip
        taken = await self._attempts.take([ip_window("forgot", context.ip_address, limit)])
        if isinstance(taken, Throttled):
            details = throttled_metadata("reset_flood", taken.rule)
            await self._audit.record(action, context, None, "rate limited", metadata=details)
            return taken.rejection()
        user = await self._users.by_email(normalized)
        if user is None or user.disabled:
            reason = "unknown e-mail" if user is None else "user disabled"
            user_id = None if user is None else user.id
            await self._audit.record(action, context, user_id, reason)
            return None
        if not await self._claim_mail_slot(user.id):
            await self._audit.record(action, context, user.id, "mail throttled")
            return None
        now = self._clock.now()
        token = self._random.token_urlsafe(RESET_TOKEN_BYTES)
        await self._resets.add(hash_token(token), user.id, now + self._settings.ttl)
        link = f"{self._settings.link_base.rstrip('/')}/reset-password#token={token}"
        message = reset_mail(user.email, link, self._settings.ttl)
        task = asyncio.create_task(self._send(user.id, message))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        await self._audit.record(action, context, user.id)
        return None

    def _mail_slot(self, user_id: str) -> str:
        return f"password-reset:{user_id}"

    async def _claim_mail_slot(self, user_id: str) -> bool:
        if self._throttle is None:
            return True
        period = int(self._settings.mail_interval.total_seconds())
        return await self._throttle.try_claim(self._mail_slot(user_id), max(1, period))

    async def _send(self, user_id: str, message: MailMessage) -> None:
        """Hand ``message`` to the mailer; on any failure log it and give the user's mail
        slot back, so the next request may mail again."""
        try:
            await asyncio.wait_for(self._mailer.send(message), self._settings.mail_timeout_s)
        except Exception:
            log.exception("password reset mail for user %s not sent", user_id)
            if self._throttle is not None:
                try:
                    await self._throttle.release(self._mail_slot(user_id))
                except Exception:
                    log.exception("reset mail slot of user %s not released", user_id)

    async def drain(self) -> None:
        """Wait for the reset mails in flight (shutdown and tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    # --- the reset ----------------------------------------------------------------------

    @refuses_outages
    async def reset_password(
        self, token: object, new_password: object, context: RequestContext
    ) -> Rejected | None:
        """``POST /auth/reset-password``: None (204) after the password is replaced, every
        outstanding reset token of the user dropped and every session revoked. 400 for a weak
        password (the token is kept) and, with one body, for an unknown, used or expired
        token. The new password wins over a change made meanwhile (a login's rehash, another
        reset); 409 only when it loses that race twice."""
        action = AuditAction.PASSWORD_RESET
        if not isinstance(token, str) or not token or len(token) > MAX_RESET_TOKEN_CHARS:
            await self._audit.record(action, context, None, "invalid token")
            return INVALID_RESET_TOKEN
        problem = validate_password(new_password)
        if problem is not None or not isinstance(new_password, str):
            await self._audit.record(action, context, None, "invalid password")
            return bad_request(problem or "invalid password")
        now = self._clock.now()
        user_id = await self._resets.consume(hash_token(token), now)
        user = None if user_id is None else await self._users.get(user_id)
        if user is None or user.disabled:
            await self._audit.record(action, context, user_id, "invalid token")
            return INVALID_RESET_TOKEN
        password_hash = await self._hasher.hash(new_password)
        for attempt in range(SAVE_ATTEMPTS):
            if attempt:
                user = await self._users.get(user.id)
                if user is None or user.disabled:
                    await self._audit.record(action, context, user_id, "invalid token")
                    return INVALID_RESET_TOKEN
            changed = attrs.evolve(user, password_hash=password_hash)
            if await self._users.save(changed, previous=user) is not None:
                break
        else:
            await self._audit.record(action, context, user.id, "changed concurrently")
            return RESET_CONFLICT
        await self._resets.discard_for_user(user.id)
        revoked = await self._sessions.deactivate_all(user.id, self._clock.now())
        await self._audit.record(
            action,
            context,
            user.id,
            resource=("user", user.id),
            metadata={"sessions_revoked": revoked},
        )
        return None
