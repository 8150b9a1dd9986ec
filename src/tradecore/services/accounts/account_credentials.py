"""An account's credentials: issuing a new webhook secret or URL token, and checking the
stored broker credentials with the broker.

Issuing needs a browser session (an API key is refused with 403); the new secret or token is
returned once and stored only as its digest (``Provisioning``). A new secret or token is
never written over one another request issued meanwhile (409, nothing changed). The check
marks the account verified only when the credentials it checked are still the stored ones.

Every call leaves one audit entry (``webhook_secret_regenerated``, ``webhook_token_rotated``,
``account_updated``), refusals included; an unreachable store is 503.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs

from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, RequestContext
from tradecore.errors import BrokerDisconnected
from tradecore.ports.crypto import CredentialVerifier, DecryptionFailed
from tradecore.ports.repositories import TradingAccountRepository
from tradecore.services.accounts.owned_accounts import LOST_REASONS, OwnedAccounts
from tradecore.services.accounts.provisioning import Provisioning
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.credentials.credential_vault import CredentialVault
from tradecore.services.vocabulary import (
    ACCOUNT_NOT_FOUND,
    BROWSER_SESSION_REQUIRED,
    Principal,
    Rejected,
    refuses_outages,
)

log = logging.getLogger(__name__)

CREDENTIALS_UNREADABLE = Rejected(
    400,
    "credentials_unreadable",
    "The stored credentials cannot be read; upload them again",
)
CREDENTIALS_CHANGED = Rejected(
    409, "credentials_changed", "The credentials changed while they were checked; verify again"
)
BROKER_UNAVAILABLE = Rejected(503, "broker_unavailable", "The broker could not be reached")
SECRET_CHANGED = Rejected(
    409,
    "webhook_secret_changed",
    "Another request replaced the webhook secret at the same time; this one changed nothing. "
    "Use the secret that request returned, or regenerate again",
)
TOKEN_CHANGED = Rejected(
    409,
    "webhook_token_changed",
    "Another request rotated the webhook URL at the same time; this one changed nothing. "
    "Use the URL that request returned, or rotate again",
)


class AccountCredentials:
    """The credential use cases of an account (see the module docstring)."""

    def __init__(
        self,
        accounts: TradingAccountRepository,
        provisioning: Provisioning,
        vault: CredentialVault,
        verifier: CredentialVerifier,
        events: SecurityEvents,
    ) -> None:
        self._owned = OwnedAccounts(accounts, events)
        self._provisioning = provisioning
        self._vault = vault
        self._verifier = verifier

    # --- the webhook secret and URL token -----------------------------------------------

    @refuses_outages
    async def regenerate_secret(
        self, principal: Principal, account_id: object, context: RequestContext
    ) -> str | Rejected:
        """A new webhook secret, returned this once; the old one stops working at once. 409
        (nothing changed) when another request replaced the secret meanwhile: the secret it
        returned stays the valid one."""
        return await self._issue(
            principal,
            account_id,
            context,
            AuditAction.WEBHOOK_SECRET_REGENERATED,
            self._provisioning.regenerate_secret,
            SECRET_CHANGED,
        )

    @refuses_outages
    async def rotate_token(
        self, principal: Principal, account_id: object, context: RequestContext
    ) -> str | Rejected:
        """A new webhook URL token, returned this once; the old URL answers 404 at once. 409
        (nothing changed) when another request rotated it meanwhile."""
        return await self._issue(
            principal,
            account_id,
            context,
            AuditAction.WEBHOOK_TOKEN_ROTATED,
            self._provisioning.rotate_token,
            TOKEN_CHANGED,
        )

    async def _issue(
        self,
        principal: Principal,
        account_id: object,
        context: RequestContext,
        action: AuditAction,
        issue: Callable[[TradingAccount], Awaitable[str | None]],
        changed: Rejected,
    ) -> str | Rejected:
        """What ``issue`` returns for the caller's account (it stores the new value, or
        returns None when it lost to another request), audited as ``action``. 403 without a
        browser session, 404 for no account of the caller's, ``changed`` when another request
        issued one meanwhile."""
        user_id = principal.user_id
        if not principal.has_browser_session:
            await self._owned.audit(action, context, user_id, None, "browser session required")
            return BROWSER_SESSION_REQUIRED
        account = await self._owned.own(principal, account_id)
        if account is None:
            return await self._owned.not_found(action, context, user_id, account_id)
        issued = await issue(account)
        if issued is None:
            return await self._issue_lost(principal, account, action, context, changed)
        await self._owned.audit(action, context, user_id, account.id)
        return issued

    async def _issue_lost(
        self,
        principal: Principal,
        account: TradingAccount,
        action: AuditAction,
        context: RequestContext,
        changed: Rejected,
    ) -> Rejected:
        """The answer (audited) when a new secret or token was not stored: 404 when the account
        was deleted meanwhile, else ``changed`` (another request issued one)."""
        audit = self._owned.audit
        if await self._owned.own(principal, account.id) is None:
            await audit(action, context, principal.user_id, account.id, "not found")
            return ACCOUNT_NOT_FOUND
        await audit(action, context, principal.user_id, account.id, "changed concurrently")
        return changed

    # --- the broker credentials -----------------------------------------------------------

    @refuses_outages
    async def verify_credentials(
        self, principal: Principal, account_id: object, context: RequestContext
    ) -> TradingAccount | Rejected:
        """Ask the broker whether it accepts the stored credentials; on success the account
        is marked verified (and returned). 400 with the broker's reason when it refuses,
        409 when the credentials were replaced meanwhile, 503 when the broker is down."""
        action = AuditAction.ACCOUNT_UPDATED
        user_id = principal.user_id
        audit = self._owned.audit
        account = await self._owned.own(principal, account_id)
        if account is None:
            return await self._owned.not_found(action, context, user_id, account_id)
        try:
            credentials = await self._vault.open(account)
        except DecryptionFailed:
            log.error("stored credentials of account %s do not decrypt", account.id)
            await audit(action, context, user_id, account.id, "credentials unreadable")
            return CREDENTIALS_UNREADABLE
        try:
            reason = await self._verifier.verify(account, credentials)
        except BrokerDisconnected:
            await audit(action, context, user_id, account.id, "broker unavailable")
            return BROKER_UNAVAILABLE
        if reason is not None:
            await audit(action, context, user_id, account.id, "credentials rejected")
            return Rejected(400, "credentials_rejected", reason)
        return await self._mark_verified(principal, account, context)

    async def _mark_verified(
        self, principal: Principal, account: TradingAccount, context: RequestContext
    ) -> TradingAccount | Rejected:
        """Mark verified the credentials ``account`` held when the broker accepted them, unless
        they were replaced (409) or the account deleted (404) meanwhile."""
        action = AuditAction.ACCOUNT_UPDATED
        user_id = principal.user_id
        checked = account.encrypted_credentials

        def verify(fresh: TradingAccount) -> TradingAccount | Rejected:
            if fresh.encrypted_credentials != checked:
                return CREDENTIALS_CHANGED
            return attrs.evolve(fresh, credentials_verified=True)

        stored = await self._owned.save_retrying(
            principal, account, verify, guard=("encrypted_credentials",)
        )
        if isinstance(stored, TradingAccount):
            fields = {"fields": ["credentials_verified"]}
            await self._owned.audit(action, context, user_id, account.id, metadata=fields)
            return stored
        lost = "credentials changed" if stored == CREDENTIALS_CHANGED else LOST_REASONS[stored]
        await self._owned.audit(action, context, user_id, account.id, lost)
        return stored
