"""Who is making a request: the access-token cookie, else the ``Authorization: Bearer`` value
(an API key when it has the key's shape, an access token otherwise).

Every request checks that the session is still active (or the API key usable) and that the
user is not disabled, and takes the plan in force now (an expired subscription is free). Not
audited here: the endpoint records the request.
"""

from __future__ import annotations

import attrs

from tradecore.ports.repositories import ApiKeyRepository, SessionRepository, UserRepository
from tradecore.ports.runtime import Clock
from tradecore.services.identity.refusals import NOT_AUTHENTICATED, USER_DISABLED
from tradecore.services.identity.session_tokens import SessionTokens
from tradecore.services.vocabulary import Principal, Rejected, refuses_outages
from tradecore.sessions import TokenType, hash_token, looks_like_api_key, should_touch


class RequestAuthenticator:
    """Turns a request's credential into a ``Principal`` (see the module docstring)."""

    def __init__(
        self,
        users: UserRepository,
        sessions: SessionRepository,
        api_keys: ApiKeyRepository,
        tokens: SessionTokens,
        clock: Clock,
    ) -> None:
        self._users = users
        self._sessions = sessions
        self._api_keys = api_keys
        self._tokens = tokens
        self._clock = clock

    @refuses_outages
    async def authenticate(
        self, cookie_token: str | None, bearer: str | None
    ) -> Principal | Rejected:
        """The principal of a request. ``cookie_token`` is the access_token cookie and is used
        when present; otherwise ``bearer`` (the value after ``Authorization: Bearer``), which
        is an API key when it has the key's shape and an access token otherwise. 401 for any
        missing, invalid, expired, revoked or foreign credential (one body), 403 for a
        disabled user, 503 store down."""
        if isinstance(cookie_token, str) and cookie_token:
            return await self._from_access_token(cookie_token, via_cookie=True)
        if isinstance(bearer, str) and bearer:
            if looks_like_api_key(bearer):
                return await self._from_api_key(bearer)
            return await self._from_access_token(bearer, via_cookie=False)
        return NOT_AUTHENTICATED

    async def _from_access_token(self, token: str, *, via_cookie: bool) -> Principal | Rejected:
        claims = self._tokens.read(token, TokenType.ACCESS)
        if claims is None:
            return NOT_AUTHENTICATED
        session = await self._sessions.get(claims.sid)
        if session is None or not session.is_active or session.user_id != claims.sub:
            return NOT_AUTHENTICATED
        user = await self._users.get(claims.sub)
        if user is None:
            return NOT_AUTHENTICATED
        if user.disabled:
            return USER_DISABLED
        plan = user.effective_plan(self._clock.now())
        return Principal(user, session, None, via_cookie, plan)

    async def _from_api_key(self, key: str) -> Principal | Rejected:
        """The key's owner; ``last_used_at`` is written at most once per touch interval."""
        now = self._clock.now()
        api_key = await self._api_keys.by_hash(hash_token(key))
        if api_key is None or not api_key.is_usable(now):
            return NOT_AUTHENTICATED
        user = await self._users.get(api_key.user_id)
        if user is None:
            return NOT_AUTHENTICATED
        if user.disabled:
            return USER_DISABLED
        if should_touch(api_key.last_used_at, now):
            await self._api_keys.touch(api_key.id, now)
            api_key = attrs.evolve(api_key, last_used_at=now)
        return Principal(user, None, api_key, False, user.effective_plan(now))
