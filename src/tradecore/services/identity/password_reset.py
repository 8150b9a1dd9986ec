"""Account and credential management: register, forgotten and reset passwords, terms, API
keys and allowed IPs.

Refusals are ``Rejected`` values (503 when a store is down). Managing credentials (API keys,
allowed IPs) needs a browser session: an API-key principal is refused with 403 (contract.md).
Each operation leaves one audit entry; none holds a password, a key or a reset token.

Registration reveals a taken e-mail (409): without e-mail verification a fake success is
exposed by the next login anyway, and the endpoint sits behind the bot challenge and the
edge's login rate limit. The forgotten-password request reveals nothing: it is accepted for
any well-formed address and mails only when the account exists, in the background.
"""

from __future__ import annotations

import asyncio
import html
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from tradecore.audit import AuditAction, RequestContext
from tradecore.errors import StoreUnavailable
from tradecore.identity import AllowedIp, ApiKey, Plan, User
from tradecore.netaddr import parse_allowed_entry
from tradecore.ports.identity import CaptchaVerifier, Mailer, MailMessage, PasswordHasher
from tradecore.ports.protection import AlertThrottle
from tradecore.ports.repositories import (
    AllowedIpRepository,
    ApiKeyRepository,
    SessionRepository,
    UserRepository,
)
from tradecore.ports.resets import PasswordResetTokens
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.auth import AuthSettings, BotChallenge
from tradecore.services.security_events import SecurityEvents
from tradecore.services.vocabulary import UNAVAILABLE, Principal, Rejected, bad_request
from tradecore.sessions import hash_token, new_api_key, normalize_email, validate_password

log = logging.getLogger(__name__)

RESET_TOKEN_BYTES = 32
MAX_RESET_TOKEN_CHARS = 256
MAX_NAME_CHARS = 100
MAX_TERMS_VERSION_CHARS = 32

BROWSER_SESSION_REQUIRED = Rejected(
    403, "browser_session_required", "Credentials are managed from a browser session"
)
NOT_FOUND = Rejected(404, "not_found", "Not found")
INVALID_RESET_TOKEN = Rejected(
    400, "invalid_reset_token", "The reset link is invalid or has expired; request a new one"
)
CONFLICT = Rejected(
    409, "conflict", "The account was changed by another request at the same time; try again"
)
RESET_CONFLICT = Rejected(
    409,
    "conflict",
    "The password was changed by another request at the same time; request a new reset link",
)
# A lost compare-and-set on the user (UserRepository.save) is re-read and tried once more.
SAVE_ATTEMPTS = 2


def _positive(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value <= type(value)(0):
        raise ValueError(f"{attribute.name} must be positive")


@attrs.frozen
class AccountSettings:
    """``reset_link_base`` is PUBLIC_BASE_URL: the mailed link is
    ``{base}/reset-password#token={token}`` (a fragment, so the token reaches no server log or
    Referer). ``reset_mail_interval``: at most one reset mail per user per interval, so the
    form cannot flood someone's mailbox. ``terms_version`` is TERMS_VERSION."""

    terms_version: str = "1"
    reset_ttl: timedelta = attrs.field(default=timedelta(minutes=30), validator=_positive)
    reset_link_base: str = "http://127.0.0.1:8080"
    reset_mail_interval: timedelta = attrs.field(default=timedelta(minutes=1), validator=_positive)
    mail_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    max_api_keys: int = attrs.field(default=20, validator=_positive)
    max_allowed_ips: int = attrs.field(default=100, validator=_positive)


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


class AccountSecurity:
    """The account and credential use cases (see the module docstring)."""

    def __init__(
        self,
        users: UserRepository,
        sessions: SessionRepository,
        api_keys: ApiKeyRepository,
        allowed_ips: AllowedIpRepository,
        resets: PasswordResetTokens,
        hasher: PasswordHasher,
        captcha: CaptchaVerifier,
        mailer: Mailer,
        events: SecurityEvents,
        clock: Clock,
        random: RandomSource,
        auth_settings: AuthSettings,
        settings: AccountSettings | None = None,
        *,
        reset_throttle: AlertThrottle | None = None,
    ) -> None:
        self._users = users
        self._sessions = sessions
        self._api_keys = api_keys
        self._allowed_ips = allowed_ips
        self._resets = resets
        self._hasher = hasher
        self._challenge = BotChallenge(
            captcha,
            enabled=auth_settings.captcha_enabled,
            bypass_user_agents=auth_settings.captcha_bypass_user_agents,
        )
        self._mailer = mailer
        self._events = events
        self._clock = clock
        self._random = random
        self._settings = settings or AccountSettings()
        self._reset_throttle = reset_throttle
        self._pending: set[asyncio.Task[None]] = set()

    # --- register -----------------------------------------------------------------------

    async def register(
        self, email: object, password: object, turnstile_token: object, context: RequestContext
    ) -> User | Rejected:
        """``POST /auth/register``: bot challenge, then a new user on the free plan who has
        not accepted the terms yet. 400 bad input, 403 challenge refused, 409 e-mail taken."""
        try:
            return await self._register(email, password, turnstile_token, context)
        except StoreUnavailable:
            return UNAVAILABLE

    async def _register(
        self, email: object, password: object, turnstile_token: object, context: RequestContext
    ) -> User | Rejected:
        metadata = {"captcha_bypassed": True} if self._challenge.bypassed(context) else None
        refused = await self._challenge.check(turnstile_token, context)
        if refused is not None:
            await self._audit(AuditAction.REGISTER, context, None, refused.code, metadata=metadata)
            return refused
        normalized = normalize_email(email)
        problem = "email is not a valid e-mail address" if normalized is None else None
        problem = problem or validate_password(password)
        if problem is not None or normalized is None or not isinstance(password, str):
            await self._audit(AuditAction.REGISTER, context, None, "invalid request")
            return bad_request(problem or "invalid request")
        user = User(
            id=self._random.new_id(),
            email=normalized,
            password_hash=await self._hasher.hash(password),
            plan=Plan.FREE,
            created_at=self._clock.now(),
        )
        if not await self._users.add(user):
            await self._audit(AuditAction.REGISTER, context, None, "email taken")
            return Rejected(409, "email_taken", "An account with this e-mail address exists")
        await self._audit(AuditAction.REGISTER, context, user.id, resource=("user", user.id))
        return user

    # --- forgotten and reset passwords --------------------------------------------------

    async def forgot_password(self, email: object, context: RequestContext) -> Rejected | None:
        """``POST /auth/forgot-password``: None (202) for every well-formed address; when it
        belongs to an active account, a single-use reset token valid for ``reset_ttl`` is
        stored (as its digest) and mailed in the background. 400 only for a malformed
        address, which reveals nothing about accounts."""
        try:
            return await self._forgot_password(email, context)
        except StoreUnavailable:
            return UNAVAILABLE

    async def _forgot_password(self, email: object, context: RequestContext) -> Rejected | None:
        normalized = normalize_email(email)
        if normalized is None:
            await self._audit(AuditAction.PASSWORD_RESET_REQUESTED, context, None, "invalid")
            return bad_request("email is not a valid e-mail address")
        user = await self._users.by_email(normalized)
        if user is None or user.disabled:
            reason = "unknown e-mail" if user is None else "user disabled"
            user_id = None if user is None else user.id
            await self._audit(AuditAction.PASSWORD_RESET_REQUESTED, context, user_id, reason)
            return None
        if not await self._claim_reset_mail(user.id):
            await self._audit(
                AuditAction.PASSWORD_RESET_REQUESTED, context, user.id, "mail throttled"
            )
            return None
        now = self._clock.now()
        token = self._random.token_urlsafe(RESET_TOKEN_BYTES)
        await self._resets.add(hash_token(token), user.id, now + self._settings.reset_ttl)
        link = f"{self._settings.reset_link_base.rstrip('/')}/reset-password#token={token}"
        message = reset_mail(user.email, link, self._settings.reset_ttl)
        task = asyncio.create_task(self._send_reset(user.id, message))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        await self._audit(AuditAction.PASSWORD_RESET_REQUESTED, context, user.id)
        return None

    def _reset_slot(self, user_id: str) -> str:
        return f"password-reset:{user_id}"

    async def _claim_reset_mail(self, user_id: str) -> bool:
        if self._reset_throttle is None:
            return True
        period = int(self._settings.reset_mail_interval.total_seconds())
        return await self._reset_throttle.try_claim(self._reset_slot(user_id), max(1, period))

    async def _send_reset(self, user_id: str, message: MailMessage) -> None:
        try:
            await asyncio.wait_for(self._mailer.send(message), self._settings.mail_timeout_s)
        except Exception:
            log.exception("password reset mail for user %s not sent", user_id)
            if self._reset_throttle is not None:
                try:
                    await self._reset_throttle.release(self._reset_slot(user_id))
                except Exception:
                    log.exception("reset mail slot of user %s not released", user_id)

    async def drain(self) -> None:
        """Wait for the reset mails in flight (shutdown and tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def reset_password(
        self, token: object, new_password: object, context: RequestContext
    ) -> Rejected | None:
        """``POST /auth/reset-password``: None (204) after the password is replaced, every
        outstanding reset token of the user dropped and every session revoked. 400 for a weak
        password (the token is kept) and, with one body, for an unknown, used or expired
        token. The new password wins over a change made meanwhile (a login's rehash, another
        reset); 409 only when it loses that race twice."""
        try:
            return await self._reset_password(token, new_password, context)
        except StoreUnavailable:
            return UNAVAILABLE

    async def _reset_password(
        self, token: object, new_password: object, context: RequestContext
    ) -> Rejected | None:
        if not isinstance(token, str) or not token or len(token) > MAX_RESET_TOKEN_CHARS:
            await self._audit(AuditAction.PASSWORD_RESET, context, None, "invalid token")
            return INVALID_RESET_TOKEN
        problem = validate_password(new_password)
        if problem is not None or not isinstance(new_password, str):
            await self._audit(AuditAction.PASSWORD_RESET, context, None, "invalid password")
            return bad_request(problem or "invalid password")
        now = self._clock.now()
        user_id = await self._resets.consume(hash_token(token), now)
        user = None if user_id is None else await self._users.get(user_id)
        if user is None or user.disabled:
            await self._audit(AuditAction.PASSWORD_RESET, context, user_id, "invalid token")
            return INVALID_RESET_TOKEN
        password_hash = await self._hasher.hash(new_password)
        for attempt in range(SAVE_ATTEMPTS):
            if attempt:
                user = await self._users.get(user.id)
                if user is None or user.disabled:
                    await self._audit(AuditAction.PASSWORD_RESET, context, user_id, "invalid token")
                    return INVALID_RESET_TOKEN
            changed = attrs.evolve(user, password_hash=password_hash)
            if await self._users.save(changed, previous=user) is not None:
                break
        else:
            await self._audit(AuditAction.PASSWORD_RESET, context, user.id, "changed concurrently")
            return RESET_CONFLICT
        await self._resets.discard_for_user(user.id)
        revoked = await self._sessions.deactivate_all(user.id, self._clock.now())
        await self._audit(
            AuditAction.PASSWORD_RESET,
            context,
            user.id,
            resource=("user", user.id),
            metadata={"sessions_revoked": revoked},
        )
        return None

    # --- terms --------------------------------------------------------------------------

    async def accept_terms(
        self, principal: Principal, version: object, context: RequestContext
    ) -> User | Rejected:
        """``POST /auth/accept-terms``: record that the user accepted ``version``, which must
        be the current TERMS_VERSION (400 otherwise). The updated user; a concurrent change
        of the same field is read again and the version set once more."""
        try:
            if not isinstance(version, str) or version != self._settings.terms_version:
                await self._audit(
                    AuditAction.TERMS_ACCEPTED, context, principal.user_id, "unknown version"
                )
                return bad_request(
                    f"version must be the current terms version {self._settings.terms_version!r}"
                )
            for _ in range(SAVE_ATTEMPTS):
                user = await self._users.get(principal.user_id)
                if user is None:
                    return NOT_FOUND
                accepted = attrs.evolve(user, accepted_terms_version=version)
                stored = await self._users.save(accepted, previous=user)
                if stored is not None:
                    await self._audit(
                        AuditAction.TERMS_ACCEPTED,
                        context,
                        stored.id,
                        resource=("user", stored.id),
                        metadata={"version": version},
                    )
                    return stored
            await self._audit(
                AuditAction.TERMS_ACCEPTED, context, principal.user_id, "changed concurrently"
            )
            return CONFLICT
        except StoreUnavailable:
            return UNAVAILABLE

    # --- API keys -----------------------------------------------------------------------

    async def create_api_key(
        self, principal: Principal, name: object, expires_at: object, context: RequestContext
    ) -> tuple[ApiKey, str] | Rejected:
        """``POST /settings/api-keys``: a new key and its plaintext, which is shown this once
        and stored only as its SHA-256 digest. ``expires_at`` is None (no expiry) or a time in
        the future (without a zone: UTC). 400 bad input, 403 API-key principal, 409 when the
        user already has ``max_api_keys`` usable keys."""
        try:
            return await self._create_api_key(principal, name, expires_at, context)
        except StoreUnavailable:
            return UNAVAILABLE

    async def _create_api_key(
        self, principal: Principal, name: object, expires_at: object, context: RequestContext
    ) -> tuple[ApiKey, str] | Rejected:
        action = AuditAction.API_KEY_CREATED
        if not principal.has_browser_session:
            await self._audit(action, context, principal.user_id, "browser session required")
            return BROWSER_SESSION_REQUIRED
        now = self._clock.now()
        clean_name = _clean_name(name)
        if clean_name is None:
            await self._audit(action, context, principal.user_id, "invalid name")
            return bad_request(f"name must be 1 to {MAX_NAME_CHARS} printable characters")
        if expires_at is not None and not isinstance(expires_at, datetime):
            await self._audit(action, context, principal.user_id, "invalid expiry")
            return bad_request("expires_at must be a time or null")
        expiry = _aware(expires_at)
        if expiry is not None and expiry <= now:
            await self._audit(action, context, principal.user_id, "invalid expiry")
            return bad_request("expires_at must be in the future")
        usable = [
            k for k in await self._api_keys.list_for_user(principal.user_id) if k.is_usable(now)
        ]
        if len(usable) >= self._settings.max_api_keys:
            await self._audit(action, context, principal.user_id, "too many keys")
            return Rejected(
                409, "too_many_api_keys", f"At most {self._settings.max_api_keys} active API keys"
            )
        plaintext, prefix, digest = new_api_key(self._random)
        key = ApiKey(
            id=self._random.new_id(),
            user_id=principal.user_id,
            name=clean_name,
            key_hash=digest,
            prefix=prefix,
            created_at=now,
            expires_at=expiry,
        )
        await self._api_keys.add(key)
        await self._audit(
            action,
            context,
            principal.user_id,
            resource=("api_key", key.id),
            metadata={
                "name": clean_name,
                "expires_at": None if expiry is None else expiry.isoformat(),
            },
        )
        return key, plaintext

    async def list_api_keys(self, principal: Principal) -> list[ApiKey] | Rejected:
        """``GET /settings/api-keys``: the user's keys, revoked and expired ones included,
        oldest first (digests only). 403 for an API-key principal."""
        if not principal.has_browser_session:
            return BROWSER_SESSION_REQUIRED
        try:
            return await self._api_keys.list_for_user(principal.user_id)
        except StoreUnavailable:
            return UNAVAILABLE

    async def revoke_api_key(
        self, principal: Principal, key_id: object, context: RequestContext
    ) -> Rejected | None:
        """``DELETE /settings/api-keys/{id}``: the key stops working at once. 404 when the
        user has no such unrevoked key, 403 for an API-key principal."""
        action = AuditAction.API_KEY_REVOKED
        try:
            if not principal.has_browser_session:
                await self._audit(action, context, principal.user_id, "browser session required")
                return BROWSER_SESSION_REQUIRED
            if not isinstance(key_id, str) or not key_id:
                await self._audit(action, context, principal.user_id, "not found")
                return NOT_FOUND
            if not await self._api_keys.revoke(key_id, principal.user_id, self._clock.now()):
                await self._audit(
                    action, context, principal.user_id, "not found", resource=("api_key", key_id)
                )
                return NOT_FOUND
            await self._audit(action, context, principal.user_id, resource=("api_key", key_id))
            return None
        except StoreUnavailable:
            return UNAVAILABLE

    # --- allowed IPs --------------------------------------------------------------------

    async def add_allowed_ip(
        self, principal: Principal, text: object, context: RequestContext
    ) -> AllowedIp | Rejected:
        """``POST /settings/allowed-ips``: an address or CIDR block, stored normalized. 400 for
        anything else (host bits set included), 409 when already listed or the list is full,
        403 for an API-key principal."""
        action = AuditAction.ALLOWED_IP_ADDED
        try:
            if not principal.has_browser_session:
                await self._audit(action, context, principal.user_id, "browser session required")
                return BROWSER_SESSION_REQUIRED
            entry = parse_allowed_entry(text)
            if entry is None:
                await self._audit(action, context, principal.user_id, "invalid address")
                return bad_request("ip_address must be an IP address or a CIDR block")
            listed = await self._allowed_ips.list_for_user(principal.user_id)
            if len(listed) >= self._settings.max_allowed_ips:
                await self._audit(action, context, principal.user_id, "list full")
                return Rejected(
                    409,
                    "too_many_allowed_ips",
                    f"At most {self._settings.max_allowed_ips} allowed IP entries",
                )
            allowed = AllowedIp(
                id=self._random.new_id(),
                user_id=principal.user_id,
                ip_address=entry,
                created_at=self._clock.now(),
            )
            if not await self._allowed_ips.add(allowed):
                await self._audit(
                    action, context, principal.user_id, "duplicate", metadata={"ip": entry}
                )
                return Rejected(409, "duplicate_allowed_ip", "This address is already listed")
            await self._audit(
                action,
                context,
                principal.user_id,
                resource=("allowed_ip", allowed.id),
                metadata={"ip": entry},
            )
            return allowed
        except StoreUnavailable:
            return UNAVAILABLE

    async def list_allowed_ips(self, principal: Principal) -> list[AllowedIp] | Rejected:
        """``GET /settings/allowed-ips``: oldest first. 403 for an API-key principal."""
        if not principal.has_browser_session:
            return BROWSER_SESSION_REQUIRED
        try:
            return await self._allowed_ips.list_for_user(principal.user_id)
        except StoreUnavailable:
            return UNAVAILABLE

    async def remove_allowed_ip(
        self, principal: Principal, entry_id: object, context: RequestContext
    ) -> Rejected | None:
        """``DELETE /settings/allowed-ips/{id}``. 404 when the user has no such entry, 403 for
        an API-key principal. Removing the last entry lifts the restriction."""
        action = AuditAction.ALLOWED_IP_REMOVED
        try:
            if not principal.has_browser_session:
                await self._audit(action, context, principal.user_id, "browser session required")
                return BROWSER_SESSION_REQUIRED
            if not isinstance(entry_id, str) or not entry_id:
                await self._audit(action, context, principal.user_id, "not found")
                return NOT_FOUND
            if not await self._allowed_ips.remove(entry_id, principal.user_id):
                await self._audit(
                    action,
                    context,
                    principal.user_id,
                    "not found",
                    resource=("allowed_ip", entry_id),
                )
                return NOT_FOUND
            await self._audit(action, context, principal.user_id, resource=("allowed_ip", entry_id))
            return None
        except StoreUnavailable:
            return UNAVAILABLE

    # --- audit --------------------------------------------------------------------------

    async def _audit(
        self,
        action: AuditAction,
        context: RequestContext,
        user_id: str | None,
        error: str | None = None,
        *,
        resource: tuple[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """One entry; ``error`` None means success."""
        await self._events.record(
            action,
            context,
            user_id=user_id,
            success=error is None,
            error_message=error,
            resource_type=None if resource is None else resource[0],
            resource_id=None if resource is None else resource[1],
            metadata=metadata,
        )


def _clean_name(name: object) -> str | None:
    if not isinstance(name, str):
        return None
    clean = name.strip()
    if not 1 <= len(clean) <= MAX_NAME_CHARS or not clean.isprintable():
        return None
    return clean


def _aware(value: datetime | None) -> datetime | None:
    """A zone-less time is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
