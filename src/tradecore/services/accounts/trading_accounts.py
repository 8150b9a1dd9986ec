"""Trading-account management: listing, reading, creating, changing and deleting the caller's
accounts (``/trading/accounts``).

A user sees and changes only their own accounts (``OwnedAccounts``). Creating an account and
replacing its broker credentials need a browser session: an API key is refused with 403. The
field rules are ``tradecore.account_rules``; broker credentials go through the
``CredentialVault`` and the new account's webhook token and secret are made by
``Provisioning`` and returned once.

Every change leaves one audit entry (``account_created``, ``account_updated``,
``account_deleted``), refusals included; an unreachable store is 503. A change that loses a
race with another request is applied once more to the newer account (an update, a delete);
a second loss in a row is 409.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tradecore.account_rules import (
    BROKER_UNSUPPORTED,
    AccountRules,
    InvalidField,
    account_name,
    allowed_symbols,
    broker_name,
    request_age,
    symbol_aliases,
    symbol_list,
    use_testnet,
)
from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, RequestContext
from tradecore.errors import BrokerDisconnected
from tradecore.ports.broker import InstrumentDirectory
from tradecore.ports.crypto import DecryptionFailed
from tradecore.ports.repositories import TradingAccountRepository
from tradecore.services.accounts.owned_accounts import LOST_REASONS, OwnedAccounts
from tradecore.services.accounts.provisioning import NewAccount, Provisioning
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.credentials.credential_vault import CredentialVault
from tradecore.services.vocabulary import (
    ACCOUNT_NOT_FOUND,
    BROWSER_SESSION_REQUIRED,
    Principal,
    Rejected,
    bad_request,
    refuses_outages,
)

SEALED_INVALID = Rejected(
    400,
    "encrypted_credentials_invalid",
    "encrypted_credentials could not be decrypted; encrypt them with the key from "
    "GET /auth/public-key",
)
INSTRUMENTS_UNAVAILABLE = Rejected(
    503, "broker_unavailable", "The broker's instrument list could not be loaded; try again"
)
# Fields whose stored values a credential replacement is decided on: new credentials are
# unverified whatever a concurrent verification of the old ones set.
_CREDENTIAL_FIELDS = ("encrypted_credentials", "credentials_verified")


class TradingAccounts:
    """The account use cases (see the module docstring)."""

    def __init__(
        self,
        accounts: TradingAccountRepository,
        provisioning: Provisioning,
        vault: CredentialVault,
        instruments: InstrumentDirectory,
        events: SecurityEvents,
        rules: AccountRules | None = None,
    ) -> None:
        self._accounts = accounts
        self._owned = OwnedAccounts(accounts, events)
        self._provisioning = provisioning
        self._vault = vault
        self._instruments = instruments
        self._rules = rules or AccountRules()

    # --- reading ------------------------------------------------------------------------

    @refuses_outages
    async def list_accounts(self, principal: Principal) -> list[TradingAccount]:
        """The user's live accounts, oldest first."""
        return await self._accounts.list_for_user(principal.user_id)

    @refuses_outages
    async def get(self, principal: Principal, account_id: object) -> TradingAccount | Rejected:
        """The user's live account ``account_id``; 404 for anyone else's, a deleted or an
        unknown one."""
        return await self._owned.own(principal, account_id) or ACCOUNT_NOT_FOUND

    @refuses_outages
    async def instruments(
        self, principal: Principal, account_id: object
    ) -> frozenset[str] | Rejected:
        """The instruments the account's venue lists (its environment's), for the order
        form: 404 for no account of the caller's, 503 when the venue's list cannot be
        loaded."""
        account = await self._owned.own(principal, account_id)
        if account is None:
            return ACCOUNT_NOT_FOUND
        try:
            return await self._instruments.symbols(account.broker_name, testnet=account.testnet)
        except BrokerDisconnected:
            return INSTRUMENTS_UNAVAILABLE

    # --- creating -----------------------------------------------------------------------

    @refuses_outages
    async def create(
        self,
        principal: Principal,
        name: object,
        broker: object,
        credentials: object,
        encrypted_credentials: object,
        context: RequestContext,
        *,
        testnet: object = False,
        symbol_map: object = None,
    ) -> NewAccount | Rejected:
        """A new account at ``broker`` (default paper) with a fresh webhook token and secret,
        returned this once. ``credentials`` (a plain object) or ``encrypted_credentials`` (a
        sealed one), at most one of them, are stored encrypted. ``testnet`` picks the venue's
        test environment; ``symbol_map`` holds the account's symbol aliases (checked against
        the venue's list, so naming one loads it). 400 bad input or a broker nobody lists,
        403 API-key principal, 409 when the user has ``max_accounts``, 503 when the venue's
        list is needed and cannot be loaded."""
        action = AuditAction.ACCOUNT_CREATED
        user_id = principal.user_id
        audit = self._owned.audit
        if not principal.has_browser_session:
            await audit(action, context, user_id, None, "browser session required")
            return BROWSER_SESSION_REQUIRED
        try:
            clean_name = account_name(name)
            broker_asked = broker_name(broker)
            if broker_asked not in self._instruments.venues():
                raise InvalidField(BROKER_UNSUPPORTED)
            on_testnet = use_testnet(testnet)
            aliases: dict[str, str] = {}
            if symbol_map is not None:
                listed = await self._instruments.symbols(broker_asked, testnet=on_testnet)
                aliases = symbol_aliases(symbol_map, listed, self._rules)
            fields = await self._vault.uploaded(credentials, encrypted_credentials)
        except InvalidField as e:
            await audit(action, context, user_id, None, "invalid request")
            return bad_request(str(e))
        except DecryptionFailed:
            await audit(action, context, user_id, None, "encrypted credentials invalid")
            return SEALED_INVALID
        if len(await self._accounts.list_for_user(user_id)) >= self._rules.max_accounts:
            await audit(action, context, user_id, None, "too many accounts")
            return Rejected(
                409, "too_many_accounts", f"At most {self._rules.max_accounts} trading accounts"
            )
        new = self._provisioning.draft_account(principal.user, clean_name, broker_name=broker_asked)
        sealed = self._vault.seal(new.account, fields)
        account = attrs.evolve(
            new.account, encrypted_credentials=sealed, testnet=on_testnet, symbol_map=aliases
        )
        await self._accounts.add(account)
        upload = "none" if fields is None else ("encrypted" if credentials is None else "plain")
        await audit(
            action,
            context,
            user_id,
            account.id,
            metadata={"broker": broker_asked, "testnet": on_testnet, "credentials": upload},
        )
        return attrs.evolve(new, account=account)

    # --- changing -----------------------------------------------------------------------

    @refuses_outages
    async def update(
        self,
        principal: Principal,
        account_id: object,
        changes: Mapping[str, object],
        context: RequestContext,
    ) -> TradingAccount | Rejected:
        """Apply the fields of ``changes`` that are present: ``name``, ``max_request_age``
        (an integer within the rules' bounds), ``allowed_symbols`` (symbols the broker lists,
        by the webhook's symbol rules and resolved as webhook symbols are; empty means all),
        ``symbol_map`` (aliases to the venue's ids), ``testnet``, and new broker credentials
        (``credentials`` or ``encrypted_credentials``, which need a browser session and make
        the account unverified again, as a change of ``testnet`` does). All or nothing: one
        bad field is 400 and changes nothing. Other fields are ignored. Applied over whatever
        another request changed meanwhile (404 when it deleted the account)."""
        action = AuditAction.ACCOUNT_UPDATED
        user_id = principal.user_id
        audit = self._owned.audit
        account = await self._owned.own(principal, account_id)
        if account is None:
            return await self._owned.not_found(action, context, user_id, account_id)
        new_credentials = "credentials" in changes or "encrypted_credentials" in changes
        if (new_credentials or "testnet" in changes) and not principal.has_browser_session:
            await audit(action, context, user_id, account.id, "browser session required")
            return BROWSER_SESSION_REQUIRED
        try:
            fields = await self._changed_fields(account, changes)
        except InvalidField as e:
            await audit(action, context, user_id, account.id, "invalid request")
            return bad_request(str(e))
        except DecryptionFailed:
            await audit(action, context, user_id, account.id, "encrypted credentials invalid")
            return SEALED_INVALID
        if new_credentials:
            credentials = fields.pop("credentials")
            fields["encrypted_credentials"] = self._vault.seal(account, credentials)
        if new_credentials or fields.get("testnet", account.testnet) != account.testnet:
            fields["credentials_verified"] = False
        guard = _CREDENTIAL_FIELDS if "credentials_verified" in fields else ()
        names = sorted({"credentials" if f == "encrypted_credentials" else f for f in fields})
        stored = await self._owned.save_retrying(
            principal, account, lambda fresh: attrs.evolve(fresh, **fields), guard=guard
        )
        if isinstance(stored, TradingAccount):
            await audit(action, context, user_id, account.id, metadata={"fields": names})
        else:
            await audit(action, context, user_id, account.id, LOST_REASONS[stored])
        return stored

    async def _changed_fields(
        self, account: TradingAccount, changes: Mapping[str, object]
    ) -> dict[str, Any]:
        """The new values of the fields ``changes`` names (``credentials`` in clear). Raises
        ``InvalidField`` or ``DecryptionFailed``."""
        fields: dict[str, Any] = {}
        if "name" in changes:
            fields["name"] = account_name(changes["name"])
        if "max_request_age" in changes:
            fields["max_request_age"] = request_age(changes["max_request_age"], self._rules)
        if "testnet" in changes:
            fields["testnet"] = use_testnet(changes["testnet"])
        testnet = fields.get("testnet", account.testnet)
        if "symbol_map" in changes or "allowed_symbols" in changes:
            listed = await self._instruments.symbols(account.broker_name, testnet=testnet)
            if "symbol_map" in changes:
                fields["symbol_map"] = symbol_aliases(changes["symbol_map"], listed, self._rules)
            if "allowed_symbols" in changes:
                items = symbol_list(changes["allowed_symbols"], self._rules)
                aliases = fields.get("symbol_map", account.symbol_map)
                fields["allowed_symbols"] = allowed_symbols(items, listed, aliases)
        if "credentials" in changes or "encrypted_credentials" in changes:
            fields["credentials"] = await self._vault.uploaded(
                changes.get("credentials"), changes.get("encrypted_credentials")
            )
        return fields

    @refuses_outages
    async def delete(
        self, principal: Principal, account_id: object, context: RequestContext
    ) -> Rejected | None:
        """Soft delete: the account disappears from every lookup, so its webhook URL answers
        404 at once; its stored broker credentials are erased (also credentials another
        request stored meanwhile). Order history keeps naming it."""
        action = AuditAction.ACCOUNT_DELETED
        user_id = principal.user_id
        account = await self._owned.own(principal, account_id)
        if account is None:
            return await self._owned.not_found(action, context, user_id, account_id)
        stored = await self._owned.save_retrying(
            principal,
            account,
            lambda fresh: attrs.evolve(fresh, deleted=True, encrypted_credentials=None),
        )
        if isinstance(stored, TradingAccount):
            await self._owned.audit(action, context, user_id, account.id)
            return None
        await self._owned.audit(action, context, user_id, account.id, LOST_REASONS[stored])
        return stored
