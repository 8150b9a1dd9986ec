"""Signing up: ``POST /auth/register`` and ``POST /auth/accept-terms``.

Registration reveals a taken e-mail (409): without e-mail verification a fake success is
exposed by the next login anyway, and the endpoint sits behind the bot challenge and the
edge's login rate limit. A new user is on the free plan and has not accepted the terms yet.
Each call leaves one audit entry (``IdentityAudit``); none holds a password. An unreachable store
is 503.
"""

from __future__ import annotations

import attrs

from tradecore.audit import AuditAction, RequestContext
from tradecore.identity import Plan, User
from tradecore.ports.identity import PasswordHasher
from tradecore.ports.repositories import UserRepository
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.identity.bot_challenge import BotChallenge
from tradecore.services.vocabulary import (
    CONFLICT,
    NOT_FOUND,
    Principal,
    Rejected,
    bad_request,
    refuses_outages,
)
from tradecore.sessions import normalize_email, validate_password

EMAIL_TAKEN = Rejected(409, "email_taken", "An account with this e-mail address exists")
SAVE_ATTEMPTS = 2
"""A lost compare-and-set on the user (``UserRepository.save``) is read again and tried once
more."""


class Registration:
    """New users and their acceptance of the terms (see the module docstring).
    ``terms_version`` is the version in force (TERMS_VERSION)."""

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
    ) -> None:
        self._users = users
        self._hasher = hasher
        self._challenge = challenge
        self._audit = audit
        self._clock = clock
        self._random = random
        self._terms_version = terms_version

    @refuses_outages
    async def register(
        self, email: object, password: object, turnstile_token: object, context: RequestContext
    ) -> User | Rejected:
        """``POST /auth/register``: bot challenge, then a new user on the free plan who has
        not accepted the terms yet. 400 bad input, 403 challenge refused, 409 e-mail taken."""
        record = self._audit.record
        metadata = {"captcha_bypassed": True} if self._challenge.bypassed(context) else None
        refused = await self._challenge.check(turnstile_token, context)
        if refused is not None:
            await record(AuditAction.REGISTER, context, None, refused.code, metadata=metadata)
            return refused
        normalized = normalize_email(email)
        problem = "email is not a valid e-mail address" if normalized is None else None
        problem = problem or validate_password(password)
        if problem is not None or normalized is None or not isinstance(password, str):
            await record(AuditAction.REGISTER, context, None, "invalid request")
            return bad_request(problem or "invalid request")
        user = User(
            id=self._random.new_id(),
            email=normalized,
            password_hash=await self._hasher.hash(password),
            plan=Plan.FREE,
            created_at=self._clock.now(),
        )
        if not await self._users.add(user):
            await record(AuditAction.REGISTER, context, None, "email taken")
            return EMAIL_TAKEN
        await record(AuditAction.REGISTER, context, user.id, resource=("user", user.id))
        return user

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
