"""The caller's own trading accounts, as every account use case reads, saves and audits them.

A user sees only their own live accounts: anyone else's is ``ACCOUNT_NOT_FOUND``, exactly like
an id that does not exist. Changes are compare-and-set saves of the fields they change
(``TradingAccountRepository.save``), so concurrent requests never write back each other's
old values; a save that loses such a race is read again and tried once more.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from tradecore.account_rules import requested_id
from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, RequestContext
from tradecore.ports.repositories import TradingAccountRepository
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.vocabulary import ACCOUNT_NOT_FOUND, CONFLICT, Principal, Rejected

SAVE_ATTEMPTS = 2
"""A lost compare-and-set is read again and tried once more."""
LOST_REASONS = {ACCOUNT_NOT_FOUND: "not found", CONFLICT: "changed concurrently"}
"""The audit reason of each refusal of ``OwnedAccounts.save_retrying`` itself."""


class OwnedAccounts:
    """Lookups limited to the caller's accounts, retried saves, and the audit entry of an
    account use case. Every method may raise StoreUnavailable."""

    def __init__(self, accounts: TradingAccountRepository, events: SecurityEvents) -> None:
        self._accounts = accounts
        self._events = events

    async def own(self, principal: Principal, account_id: object) -> TradingAccount | None:
        """The caller's live account ``account_id``; None for anyone else's, a deleted one,
        an unknown id and anything that cannot be an id."""
        wanted = requested_id(account_id)
        if wanted is None:
            return None
        account = await self._accounts.get(wanted)
        if account is None or account.user_id != principal.user_id:
            return None
        return account

    async def save_retrying(
        self,
        principal: Principal,
        account: TradingAccount,
        change: Callable[[TradingAccount], TradingAccount | Rejected],
        *,
        guard: Collection[str] = (),
    ) -> TradingAccount | Rejected:
        """Save ``change(account)`` as a compare-and-set over ``account`` (also comparing the
        fields named in ``guard``); after a lost race, read the caller's account again and
        apply ``change`` to that, up to SAVE_ATTEMPTS saves in all. The stored account;
        ``change``'s refusal as is; ACCOUNT_NOT_FOUND when the account is gone; CONFLICT when every
        attempt lost its race."""
        for attempt in range(SAVE_ATTEMPTS):
            if attempt:
                fresh = await self.own(principal, account.id)
                if fresh is None:
                    return ACCOUNT_NOT_FOUND
                account = fresh
            updated = change(account)
            if isinstance(updated, Rejected):
                return updated
            if attempt and updated == account:
                return account  # just read, and already as wanted: nothing to write
            # the first save compares ``guard`` and ``deleted`` even with nothing to write
            stored = await self._accounts.save(updated, previous=account, guard=guard)
            if stored is not None:
                return stored
        return CONFLICT

    async def audit(
        self,
        action: AuditAction,
        context: RequestContext,
        user_id: str,
        account_id: str | None,
        error: str | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """One entry on the account ``account_id``; ``error`` None means success. The caller
        never passes a credential, token or secret."""
        details: dict[str, Any] = {} if account_id is None else {"trading_account_id": account_id}
        await self._events.record(
            action,
            context,
            user_id=user_id,
            success=error is None,
            error_message=error,
            resource_type="trading_account",
            resource_id=account_id,
            metadata={**details, **(metadata or {})},
        )

    async def not_found(
        self, action: AuditAction, context: RequestContext, user_id: str, account_id: object
    ) -> Rejected:
        """ACCOUNT_NOT_FOUND for a lookup of ``account_id`` that found none of the caller's,
        audited. The requested id is recorded when it can be an id at all (it may name another
        user's account, so it is not recorded as this user's ``trading_account_id``)."""
        wanted = requested_id(account_id)
        requested = {} if wanted is None else {"requested_id": wanted}
        await self.audit(action, context, user_id, None, "not found", metadata=requested)
        return ACCOUNT_NOT_FOUND
