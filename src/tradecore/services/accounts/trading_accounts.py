"""Trading-account management: the use cases behind ``/trading/accounts``.

A user sees and changes only their own accounts; anyone else's is 404, exactly like an id
that does not exist. Issuing webhook credentials (create, regenerate the secret, rotate the
URL) and replacing broker credentials need a browser session (contract.md): an API key is
refused with 403.

Broker credentials arrive as a JSON object of strings, either plain (development) or sealed
with the service's public key (``TransportKey``); they are re-encrypted with the
``CredentialCipher``, bound to the account id, before anything is stored, and they never
appear in an answer, an audit entry, a log line or a repr. The webhook token and secret are
made by ``Provisioning`` and returned once.

Every change leaves one audit entry (``account_created``, ``account_updated``,
``account_deleted``, ``webhook_secret_regenerated``, ``webhook_token_rotated``), refusals
included. Refusals are ``Rejected`` values; an unreachable store is 503.

Changes are compare-and-set saves of the fields they change (``TradingAccountRepository.save``),
so concurrent requests on the same account never write back each other's old values. A change
that loses such a race is re-read and applied once more where the request still means the same
on the newer account (an update, a delete, marking verified); a new webhook secret or token is
never written over one another request issued meanwhile (409). A second loss in a row is 409.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn

import attrs

from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, RequestContext
from tradecore.broker import InstrumentDirectory
from tradecore.errors import BrokerDisconnected, StoreUnavailable
from tradecore.ports.crypto import (
    CredentialCipher,
    CredentialVerifier,
    DecryptionFailed,
    TransportKey,
)
from tradecore.ports.repositories import TradingAccountRepository
from tradecore.services.account_security import BROWSER_SESSION_REQUIRED
from tradecore.services.provisioning import NewAccount, Provisioning
from tradecore.services.security_events import SecurityEvents
from tradecore.services.vocabulary import UNAVAILABLE, Principal, Rejected, bad_request
from tradecore.webhook_payload import SYMBOL_PATTERN, canonical_symbol

log = logging.getLogger(__name__)

MAX_NAME_CHARS = 100
MAX_BROKER_CHARS = 32
MAX_ID_CHARS = 64
MAX_CREDENTIAL_FIELDS = 20
MAX_CREDENTIAL_VALUE_CHARS = 4096
MAX_CREDENTIALS_BYTES = 16 * 1024
CREDENTIAL_FIELD = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")

NOT_FOUND = Rejected(404, "not_found", "Trading account not found")
SEALED_INVALID = Rejected(
    400,
    "encrypted_credentials_invalid",
    "encrypted_credentials could not be decrypted; encrypt them with the key from "
    "GET /auth/public-key",
)
CREDENTIALS_UNREADABLE = Rejected(
    400,
    "credentials_unreadable",
    "The stored credentials cannot be read; upload them again",
)
CREDENTIALS_CHANGED = Rejected(
    409, "credentials_changed", "The credentials changed while they were checked; verify again"
)
BROKER_UNAVAILABLE = Rejected(503, "broker_unavailable", "The broker could not be reached")
CONFLICT = Rejected(
    409, "conflict", "The account was changed by another request at the same time; try again"
)
_LOST = {
    NOT_FOUND: "not found",
    CREDENTIALS_CHANGED: "credentials changed",
    CONFLICT: "changed concurrently",
}
"""The audit reason of each refusal of ``_save_retrying``."""
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
# A lost compare-and-set is re-read and tried once more.
SAVE_ATTEMPTS = 2
# Fields whose stored values a credential replacement is decided on: new credentials are
# unverified whatever a concurrent verification of the old ones set.
_CREDENTIAL_FIELDS = ("encrypted_credentials", "credentials_verified")


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive")


@attrs.frozen
class AccountRules:
    """Bounds of what a user may set: ``max_request_age`` (seconds, the webhook timestamp
    window and replay-key lifetime), the allowed-symbol list, and accounts per user."""

    min_request_age: int = attrs.field(default=5, validator=_positive)
    max_request_age: int = attrs.field(default=3600, validator=_positive)
    max_allowed_symbols: int = attrs.field(default=500, validator=_positive)
    max_accounts: int = attrs.field(default=50, validator=_positive)


class _Invalid(ValueError):
    """A field is malformed; the message names the rule, never the value."""


def _invalid(reason: str) -> NoReturn:
    raise _Invalid(reason)


def _name(value: object) -> str:
    if isinstance(value, str):
        name = value.strip()
        if 1 <= len(name) <= MAX_NAME_CHARS and name.isprintable():
            return name
    _invalid(f"name must be 1 to {MAX_NAME_CHARS} printable characters")


def _credential_fields(value: object) -> dict[str, str]:
    """A credentials object: at most 20 fields named like ``api_key``, string values."""
    if not isinstance(value, dict):
        _invalid("credentials must be a JSON object of strings")
    if len(value) > MAX_CREDENTIAL_FIELDS:
        _invalid(f"credentials hold at most {MAX_CREDENTIAL_FIELDS} fields")
    fields: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or CREDENTIAL_FIELD.fullmatch(key) is None:
            _invalid("credential field names are 1 to 64 of A-Z, a-z, 0-9, _ . - (letter first)")
        if not isinstance(item, str) or len(item) > MAX_CREDENTIAL_VALUE_CHARS:
            _invalid(f"credential values are strings of at most {MAX_CREDENTIAL_VALUE_CHARS}")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            _invalid("credential values must be valid Unicode text")
        fields[key] = item
    return fields


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        _invalid("credentials repeat a field")
    return document


def _reject_constant(_: str) -> NoReturn:
    _invalid("credentials must be a JSON object of strings")


def _unsealed_fields(plaintext: bytes) -> dict[str, str]:
    """The credentials object inside a sealed upload (UTF-8 JSON, strictly parsed)."""
    if len(plaintext) > MAX_CREDENTIALS_BYTES:
        _invalid(f"credentials are at most {MAX_CREDENTIALS_BYTES} bytes of JSON")
    try:
        document = json.loads(
            plaintext.decode("utf-8"), object_pairs_hook=_unique, parse_constant=_reject_constant
        )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        _invalid("encrypted_credentials must hold a UTF-8 JSON object of strings")
    return _credential_fields(document)


def _encode(fields: Mapping[str, str]) -> bytes:
    return json.dumps(
        dict(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


class TradingAccounts:
    """The trading-account use cases (see the module docstring)."""

    def __init__(
        self,
        accounts: TradingAccountRepository,
        provisioning: Provisioning,
        cipher: CredentialCipher,
        transport: TransportKey,
        verifier: CredentialVerifier,
        instruments: InstrumentDirectory,
        events: SecurityEvents,
        rules: AccountRules | None = None,
    ) -> None:
        self._accounts = accounts
        self._provisioning = provisioning
        self._cipher = cipher
        self._transport = transport
        self._verifier = verifier
        self._instruments = instruments
        self._events = events
        self._rules = rules or AccountRules()

    # --- reading ------------------------------------------------------------------------

    async def list_accounts(self, principal: Principal) -> list[TradingAccount] | Rejected:
        """The user's live accounts, oldest first."""
        try:
            return await self._accounts.list_for_user(principal.user_id)
        except StoreUnavailable:
            return UNAVAILABLE

    async def get(self, principal: Principal, account_id: object) -> TradingAccount | Rejected:
        """The user's live account ``account_id``; 404 for anyone else's, a deleted or an
        unknown one."""
        try:
            return await self._own(principal, account_id) or NOT_FOUND
        except StoreUnavailable:
            return UNAVAILABLE

    async def broker_credentials(self, account: TradingAccount) -> dict[str, str]:
        """The account's broker credentials in clear, for its broker connection (empty when
        none are stored). Raises ``DecryptionFailed`` when they do not open with the cipher."""
        if account.encrypted_credentials is None:
            return {}
        plaintext = self._cipher.decrypt(account.encrypted_credentials, account.id.encode())
        try:
            return _credential_fields(json.loads(plaintext.decode("utf-8")))
        except (ValueError, UnicodeDecodeError):
            raise DecryptionFailed("stored credentials are not a credentials object") from None

    # --- creating -----------------------------------------------------------------------

    async def create(
        self,
        principal: Principal,
        name: object,
        broker: object,
        credentials: object,
        encrypted_credentials: object,
        context: RequestContext,
    ) -> NewAccount | Rejected:
        """A new account at ``broker`` (default paper) with a fresh webhook token and secret,
        returned this once. ``credentials`` (a plain object) or ``encrypted_credentials`` (a
        sealed one), at most one of them, are stored encrypted. 400 bad input or a broker
        nobody lists, 403 API-key principal, 409 when the user has ``max_accounts``."""
        try:
            return await self._create(
                principal, name, broker, credentials, encrypted_credentials, context
            )
        except StoreUnavailable:
            return UNAVAILABLE

    async def _create(
        self,
        principal: Principal,
        name: object,
        broker: object,
        credentials: object,
        encrypted_credentials: object,
        context: RequestContext,
    ) -> NewAccount | Rejected:
        action = AuditAction.ACCOUNT_CREATED
        user_id = principal.user_id
        if not principal.has_browser_session:
            await self._audit(action, context, user_id, None, "browser session required")
            return BROWSER_SESSION_REQUIRED
        broker_name = "paper" if broker is None else broker
        try:
            clean_name = _name(name)
            if (
                not isinstance(broker_name, str)
                or not 1 <= len(broker_name) <= MAX_BROKER_CHARS
                or not await self._instruments.symbols(broker_name)
            ):
                _invalid("broker is not supported")
            fields = await self._credentials(credentials, encrypted_credentials)
        except _Invalid as e:
            await self._audit(action, context, user_id, None, "invalid request")
            return bad_request(str(e))
        except DecryptionFailed:
            await self._audit(action, context, user_id, None, "encrypted credentials invalid")
            return SEALED_INVALID
        if len(await self._accounts.list_for_user(user_id)) >= self._rules.max_accounts:
            await self._audit(action, context, user_id, None, "too many accounts")
            return Rejected(
                409, "too_many_accounts", f"At most {self._rules.max_accounts} trading accounts"
            )
        new = self._provisioning.draft_account(principal.user, clean_name, broker_name=broker_name)
        account = attrs.evolve(new.account, encrypted_credentials=self._seal(new.account, fields))
        await self._accounts.add(account)
        upload = "none" if fields is None else ("encrypted" if credentials is None else "plain")
        await self._audit(
            action,
            context,
            user_id,
            account.id,
            metadata={"broker": broker_name, "credentials": upload},
        )
        return attrs.evolve(new, account=account)

    async def _credentials(self, plain: object, sealed: object) -> dict[str, str] | None:
        """The uploaded credentials, None when there are none (absent, null or empty)."""
        if plain is not None and sealed is not None:
            _invalid("send credentials or encrypted_credentials, not both")
        if sealed is not None:
            if not isinstance(sealed, str):
                _invalid("encrypted_credentials must be a string")
            fields = _unsealed_fields(await self._transport.unseal(sealed))
        elif plain is not None:
            fields = _credential_fields(plain)
        else:
            return None
        return fields or None

    def _seal(self, account: TradingAccount, fields: Mapping[str, str] | None) -> bytes | None:
        if fields is None:
            return None
        return self._cipher.encrypt(_encode(fields), account.id.encode())

    # --- changing -----------------------------------------------------------------------

    async def update(
        self,
        principal: Principal,
        account_id: object,
        changes: Mapping[str, object],
        context: RequestContext,
    ) -> TradingAccount | Rejected:
        """Apply the fields of ``changes`` that are present: ``name``, ``max_request_age``
        (an integer within the rules' bounds), ``allowed_symbols`` (symbols the broker lists,
        by the webhook's symbol rules; empty means all), and new broker credentials
        (``credentials`` or ``encrypted_credentials``, which need a browser session and make
        the account unverified again). All or nothing: one bad field is 400 and changes
        nothing. Other fields are ignored. Applied over whatever another request changed
        meanwhile (404 when it deleted the account)."""
        try:
            return await self._update(principal, account_id, changes, context)
        except StoreUnavailable:
            return UNAVAILABLE

    async def _update(
        self,
        principal: Principal,
        account_id: object,
        changes: Mapping[str, object],
        context: RequestContext,
    ) -> TradingAccount | Rejected:
        action = AuditAction.ACCOUNT_UPDATED
        user_id = principal.user_id
        account = await self._own(principal, account_id)
        if account is None:
            await self._audit(
                action, context, user_id, None, "not found", metadata=_requested(account_id)
            )
            return NOT_FOUND
        new_credentials = "credentials" in changes or "encrypted_credentials" in changes
        if new_credentials and not principal.has_browser_session:
            await self._audit(action, context, user_id, account.id, "browser session required")
            return BROWSER_SESSION_REQUIRED
        try:
            fields = await self._changed_fields(account, changes)
        except _Invalid as e:
            await self._audit(action, context, user_id, account.id, "invalid request")
            return bad_request(str(e))
        except DecryptionFailed:
            await self._audit(action, context, user_id, account.id, "encrypted credentials invalid")
            return SEALED_INVALID
        if new_credentials:
            credentials = fields.pop("credentials")
            fields["encrypted_credentials"] = self._seal(account, credentials)
            fields["credentials_verified"] = False
        guard = _CREDENTIAL_FIELDS if new_credentials else ()
        names = sorted({"credentials" if f == "encrypted_credentials" else f for f in fields})
        stored = await self._save_retrying(
            principal, account, lambda fresh: attrs.evolve(fresh, **fields), guard=guard
        )
        if isinstance(stored, TradingAccount):
            await self._audit(action, context, user_id, account.id, metadata={"fields": names})
        else:
            await self._audit(action, context, user_id, account.id, _LOST[stored])
        return stored

    async def _changed_fields(
        self, account: TradingAccount, changes: Mapping[str, object]
    ) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if "name" in changes:
            fields["name"] = _name(changes["name"])
        if "max_request_age" in changes:
            age = changes["max_request_age"]
            low, high = self._rules.min_request_age, self._rules.max_request_age
            if isinstance(age, bool) or not isinstance(age, int) or not low <= age <= high:
                _invalid(f"max_request_age must be an integer from {low} to {high} seconds")
            fields["max_request_age"] = age
        if "allowed_symbols" in changes:
            fields["allowed_symbols"] = await self._symbols(account, changes["allowed_symbols"])
        if "credentials" in changes or "encrypted_credentials" in changes:
            fields["credentials"] = await self._credentials(
                changes.get("credentials"), changes.get("encrypted_credentials")
            )
        return fields

    async def _symbols(self, account: TradingAccount, value: object) -> frozenset[str]:
        limit = self._rules.max_allowed_symbols
        if not isinstance(value, list) or len(value) > limit:
            _invalid(f"allowed_symbols must be a list of at most {limit} symbols")
        listed = await self._instruments.symbols(account.broker_name)
        wanted: set[str] = set()
        for item in value:
            symbol = canonical_symbol(item) if isinstance(item, str) else ""
            if not symbol.isascii() or SYMBOL_PATTERN.fullmatch(symbol) is None:
                _invalid("allowed_symbols holds something that is not a symbol")
            if symbol not in listed:
                _invalid("allowed_symbols holds a symbol the broker does not list")
            wanted.add(symbol)
        return frozenset(wanted)

    async def delete(
        self, principal: Principal, account_id: object, context: RequestContext
    ) -> Rejected | None:
        """Soft delete: the account disappears from every lookup, so its webhook URL answers
        404 at once; its stored broker credentials are erased (also credentials another
        request stored meanwhile). Order history keeps naming it."""
        action = AuditAction.ACCOUNT_DELETED
        user_id = principal.user_id
        try:
            account = await self._own(principal, account_id)
            if account is None:
                await self._audit(
                    action, context, user_id, None, "not found", metadata=_requested(account_id)
                )
                return NOT_FOUND
            stored = await self._save_retrying(
                principal,
                account,
                lambda fresh: attrs.evolve(fresh, deleted=True, encrypted_credentials=None),
            )
            if isinstance(stored, TradingAccount):
                await self._audit(action, context, user_id, account.id)
                return None
            await self._audit(action, context, user_id, account.id, _LOST[stored])
            return stored
        except StoreUnavailable:
            return UNAVAILABLE

    async def regenerate_secret(
        self, principal: Principal, account_id: object, context: RequestContext
    ) -> str | Rejected:
        """A new webhook secret, returned this once; the old one stops working at once. 409
        (nothing changed) when another request replaced the secret meanwhile: the secret it
        returned stays the valid one."""
        action = AuditAction.WEBHOOK_SECRET_REGENERATED
        try:
            account = await self._issuing(principal, account_id, action, context)
            if isinstance(account, Rejected):
                return account
            secret = await self._provisioning.regenerate_secret(account)
            if secret is None:
                return await self._issue_lost(principal, account, action, context, SECRET_CHANGED)
            await self._audit(action, context, principal.user_id, account.id)
            return secret
        except StoreUnavailable:
            return UNAVAILABLE

    async def rotate_token(
        self, principal: Principal, account_id: object, context: RequestContext
    ) -> str | Rejected:
        """A new webhook URL token, returned this once; the old URL answers 404 at once. 409
        (nothing changed) when another request rotated it meanwhile."""
        action = AuditAction.WEBHOOK_TOKEN_ROTATED
        try:
            account = await self._issuing(principal, account_id, action, context)
            if isinstance(account, Rejected):
                return account
            token = await self._provisioning.rotate_token(account)
            if token is None:
                return await self._issue_lost(principal, account, action, context, TOKEN_CHANGED)
            await self._audit(action, context, principal.user_id, account.id)
            return token
        except StoreUnavailable:
            return UNAVAILABLE

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
        if await self._own(principal, account.id) is None:
            await self._audit(action, context, principal.user_id, account.id, "not found")
            return NOT_FOUND
        await self._audit(action, context, principal.user_id, account.id, "changed concurrently")
        return changed

    async def _issuing(
        self,
        principal: Principal,
        account_id: object,
        action: AuditAction,
        context: RequestContext,
    ) -> TradingAccount | Rejected:
        if not principal.has_browser_session:
            await self._audit(action, context, principal.user_id, None, "browser session required")
            return BROWSER_SESSION_REQUIRED
        account = await self._own(principal, account_id)
        if account is None:
            await self._audit(
                action,
                context,
                principal.user_id,
                None,
                "not found",
                metadata=_requested(account_id),
            )
            return NOT_FOUND
        return account

    # --- verifying ----------------------------------------------------------------------

    async def verify_credentials(
        self, principal: Principal, account_id: object, context: RequestContext
    ) -> TradingAccount | Rejected:
        """Ask the broker whether it accepts the stored credentials; on success the account
        is marked verified (and returned). 400 with the broker's reason when it refuses,
        409 when the credentials were replaced meanwhile, 503 when the broker is down."""
        action = AuditAction.ACCOUNT_UPDATED
        user_id = principal.user_id
        try:
            account = await self._own(principal, account_id)
            if account is None:
                await self._audit(
                    action, context, user_id, None, "not found", metadata=_requested(account_id)
                )
                return NOT_FOUND
            try:
                credentials = await self.broker_credentials(account)
            except DecryptionFailed:
                log.error("stored credentials of account %s do not decrypt", account.id)
                await self._audit(action, context, user_id, account.id, "credentials unreadable")
                return CREDENTIALS_UNREADABLE
            try:
                reason = await self._verifier.verify(account, credentials)
            except BrokerDisconnected:
                await self._audit(action, context, user_id, account.id, "broker unavailable")
                return BROKER_UNAVAILABLE
            if reason is not None:
                await self._audit(action, context, user_id, account.id, "credentials rejected")
                return Rejected(400, "credentials_rejected", reason)
            return await self._mark_verified(principal, account, context)
        except StoreUnavailable:
            return UNAVAILABLE

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

        stored = await self._save_retrying(
            principal, account, verify, guard=("encrypted_credentials",)
        )
        if isinstance(stored, TradingAccount):
            await self._audit(
                action, context, user_id, account.id, metadata={"fields": ["credentials_verified"]}
            )
        else:
            await self._audit(action, context, user_id, account.id, _LOST[stored])
        return stored

    async def _save_retrying(
        self,
        principal: Principal,
        account: TradingAccount,
        change: Callable[[TradingAccount], TradingAccount | Rejected],
        *,
        guard: Collection[str] = (),
    ) -> TradingAccount | Rejected:
        """Save ``change(account)`` as a compare-and-set over ``account``; after a lost race,
        read the caller's account again and apply ``change`` to that, up to SAVE_ATTEMPTS
        saves in all. The stored account; ``change``'s refusal as is; NOT_FOUND when the
        account is gone; CONFLICT when every attempt lost its race."""
        for attempt in range(SAVE_ATTEMPTS):
            if attempt:
                fresh = await self._own(principal, account.id)
                if fresh is None:
                    return NOT_FOUND
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

    # --- helpers ------------------------------------------------------------------------

    async def _own(self, principal: Principal, account_id: object) -> TradingAccount | None:
        if not isinstance(account_id, str) or not 1 <= len(account_id) <= MAX_ID_CHARS:
            return None
        account = await self._accounts.get(account_id)
        if account is None or account.user_id != principal.user_id:
            return None
        return account

    async def _audit(
        self,
        action: AuditAction,
        context: RequestContext,
        user_id: str,
        account_id: str | None,
        error: str | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """One entry; ``error`` None means success. Never a credential, token or secret."""
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


def _requested(account_id: object) -> dict[str, str]:
    """The requested id of a refused lookup, when short enough to be worth recording (it may
    name another user's account, so it is not recorded as this user's ``trading_account_id``)."""
    if isinstance(account_id, str) and 1 <= len(account_id) <= MAX_ID_CHARS:
        return {"requested_id": account_id}
    return {}
