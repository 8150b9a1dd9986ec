"""A session after login: the silent refresh with token rotation, logout, and the
administrative revocation of every session of a user.

Refresh tokens rotate on every use, and an already-rotated one coming back revokes its session
(the token was copied). One exception: the token the session's latest rotation retired,
presented again within ``grace`` (``REFRESH_REUSE_GRACE``, two browser tabs refreshing at
once), gets the very tokens that rotation issued (their ids are derived from the retired one
and they are signed with the rotation's time), and the session lives on. The rotated refresh
token keeps the presented one's expiry, so a session lives at most ``refresh_ttl`` from login.
Each refresh, logout and revocation leaves one audit entry.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tradecore.audit import AuditAction, RequestContext
from tradecore.identity import User
from tradecore.ports.repositories import SessionRepository, UserRepository
from tradecore.ports.runtime import Clock
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.identity.refusals import INVALID_REFRESH, USER_DISABLED
from tradecore.services.identity.session_tokens import IssuedTokens, SessionTokens
from tradecore.services.vocabulary import Principal, Rejected, refuses_outages
from tradecore.sessions import (
    REFRESH_REUSE_GRACE,
    RefreshDecision,
    RefreshOutcome,
    TokenClaims,
    TokenType,
    decide_refresh,
    hash_token,
)


class SessionLifetime:
    """Refreshes, ends and revokes sessions (see the module docstring)."""

    def __init__(
        self,
        users: UserRepository,
        sessions: SessionRepository,
        tokens: SessionTokens,
        audit: IdentityAudit,
        clock: Clock,
        *,
        grace: timedelta = REFRESH_REUSE_GRACE,
    ) -> None:
        self._users = users
        self._sessions = sessions
        self._tokens = tokens
        self._audit = audit
        self._clock = clock
        self._grace = grace

    @refuses_outages
    async def refresh(
        self, refresh_token: str | None, context: RequestContext
    ) -> IssuedTokens | Rejected:
        """``POST /auth/silent-refresh`` (and ``/auth/token`` with ``grant_type=refresh_token``):
        a new access token and a rotated refresh token that expires when the presented one
        did; the token the latest rotation retired, within ``grace``, gets that rotation's
        tokens again. 401 for a missing, invalid or expired token or an inactive session; an
        already-rotated token outside the grace revokes its session (401, audited
        ``refresh_token_reuse``); 403 for a disabled user; 503 store down."""
        claims = self._tokens.read(refresh_token, TokenType.REFRESH)
        if claims is None:
            await self._audit.record(AuditAction.TOKEN_REFRESH, context, None, "invalid token")
            return INVALID_REFRESH
        decision = await self._decide(claims)
        if decision.outcome is RefreshOutcome.REJECT:
            return await self._refused(claims, context, decision.reason, INVALID_REFRESH)
        if decision.outcome is RefreshOutcome.REUSE_DETECTED:
            return await self._reuse_detected(claims, context)
        user = await self._users.get(claims.sub)
        if user is None:
            return await self._refused(claims, context, "unknown user", INVALID_REFRESH)
        if user.disabled:
            return await self._refused(claims, context, "user disabled", USER_DISABLED)
        if decision.outcome is RefreshOutcome.ROTATE:
            return await self._rotate(user, claims, context)
        return await self._reissue(user, claims, context)

    async def _decide(self, claims: TokenClaims) -> RefreshDecision:
        """``decide_refresh`` on the token's session as stored now; the session's latest
        rotation is read only when the token is not the current one."""
        session = await self._sessions.get(claims.sid)
        if session is not None and session.user_id != claims.sub:
            session = None
        presented = hash_token(claims.jti)
        decision = decide_refresh(session, presented)
        if decision.outcome is not RefreshOutcome.REUSE_DETECTED:
            return decision
        rotation = await self._sessions.last_rotation(claims.sid)
        return decide_refresh(
            session, presented, rotation=rotation, now=self._clock.now(), grace=self._grace
        )

    async def _rotate(
        self, user: User, claims: TokenClaims, context: RequestContext
    ) -> IssuedTokens | Rejected:
        """The presented token is the current one: rotate it (compare-and-set). A lost race
        with another request rotating the same token is decided again: within the grace it
        gets that request's tokens."""
        # Whole seconds: the successor's iat, stored so that a reissue signs the same tokens.
        now = self._clock.now().replace(microsecond=0)
        tokens = self._successor_tokens(user, claims, now)
        if tokens is None:
            return await self._refused(claims, context, "session expired", INVALID_REFRESH)
        rotated = await self._sessions.rotate_refresh(
            claims.sid,
            hash_token(claims.jti),
            hash_token(self._tokens.successor_jti(claims.jti)),
            at=now,
        )
        if not rotated:
            # Another request rotated this token first: it was presented twice.
            decision = await self._decide(claims)
            if decision.outcome is RefreshOutcome.REISSUE:
                return await self._reissue(user, claims, context)
            if decision.outcome is RefreshOutcome.REJECT:
                return await self._refused(claims, context, decision.reason, INVALID_REFRESH)
            return await self._reuse_detected(claims, context)
        await self._audit.record(
            AuditAction.TOKEN_REFRESH, context, user.id, resource=("session", claims.sid)
        )
        return tokens

    async def _reissue(
        self, user: User, claims: TokenClaims, context: RequestContext
    ) -> IssuedTokens | Rejected:
        """The tokens the session's latest rotation issued for the presented (retired) token,
        signed again with that rotation's time; reuse when that rotation is not what the
        session holds (its successor was rotated meanwhile)."""
        rotation = await self._sessions.last_rotation(claims.sid)
        session = await self._sessions.get(claims.sid)
        successor = hash_token(self._tokens.successor_jti(claims.jti))
        if rotation is None or session is None or session.refresh_jti != successor:
            return await self._reuse_detected(claims, context)
        tokens = self._successor_tokens(user, claims, rotation.rotated_at)
        if tokens is None:
            return await self._refused(claims, context, "session expired", INVALID_REFRESH)
        await self._audit.record(
            AuditAction.TOKEN_REFRESH,
            context,
            user.id,
            resource=("session", claims.sid),
            metadata={"reissued": True},
        )
        return tokens

    def _successor_tokens(
        self, user: User, claims: TokenClaims, issued_at: datetime
    ) -> IssuedTokens | None:
        """The tokens that replace the presented refresh token when rotated at ``issued_at``
        (the same for the same arguments); None when the presented one has expired by then
        (only inside a codec's leeway). The new refresh token keeps the old one's expiry: a
        session never outlives refresh_ttl from login."""
        remaining = timedelta(seconds=claims.exp - int(issued_at.timestamp()))
        if remaining <= timedelta(0):
            return None
        successor = self._tokens.successor_jti(claims.jti)
        return self._tokens.sign(
            user.id,
            claims.sid,
            successor,
            issued_at,
            remaining,
            access_jti=self._tokens.access_jti_for(successor),
        )

    async def _refused(
        self, claims: TokenClaims, context: RequestContext, reason: str, refusal: Rejected
    ) -> Rejected:
        """``refusal``, after auditing the failed refresh of the token's session."""
        await self._audit.record(
            AuditAction.TOKEN_REFRESH, context, claims.sub, reason, resource=("session", claims.sid)
        )
        return refusal

    async def _reuse_detected(self, claims: TokenClaims, context: RequestContext) -> Rejected:
        await self._sessions.deactivate(claims.sid, self._clock.now())
        await self._audit.record(
            AuditAction.REFRESH_TOKEN_REUSE,
            context,
            claims.sub,
            "refresh token reused; session revoked",
            resource=("session", claims.sid),
        )
        return INVALID_REFRESH

    async def logout(self, principal: Principal, context: RequestContext) -> None:
        """``POST /auth/logout``: the principal's session becomes inactive at once (its access
        and refresh tokens stop working). An API-key principal has no session to end; that is
        audited as a failed logout. May raise StoreUnavailable."""
        if principal.session is None:
            await self._audit.record(
                AuditAction.LOGOUT, context, principal.user_id, "no browser session"
            )
            return
        await self._sessions.deactivate(principal.session.id, self._clock.now())
        await self._audit.record(
            AuditAction.LOGOUT,
            context,
            principal.user_id,
            resource=("session", principal.session.id),
        )

    async def revoke_all_sessions(self, user_id: str, context: RequestContext) -> int:
        """The administrative action: every active session of the user ends at once; the
        number revoked. May raise StoreUnavailable."""
        revoked = await self._sessions.deactivate_all(user_id, self._clock.now())
        await self._audit.record(
            AuditAction.SESSION_REVOKED,
            context,
            user_id,
            metadata={"sessions_revoked": revoked},
        )
        return revoked
