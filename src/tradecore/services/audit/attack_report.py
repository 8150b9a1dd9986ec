"""The user's security events (``GET /settings/security-attacks``).

A report covers the attack classes of the specification's table (``ATTACK_POLICIES``) written
against one user in the last ``days`` days, and nothing else: never another user's entries,
never a non-attack action. It has

* ``counts``: events by attack type, exact over the whole window (every type present, zeros
  included);
* ``items``: one page of events, newest first;
* ``affected_accounts``: the trading accounts the window's events name, most recently named
  first. Only the user's own live accounts are named; an id the user does not own (or an
  account since deleted) is listed with ``name`` None. ``events`` counts each account's
  events exactly when the window holds at most ``ACCOUNT_COUNT_LIMIT`` events, else None.

Metadata is shown as stored, minus any key that names a credential (defence in depth: the
writers never put one there, see ``tradecore.audit``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from tradecore.attacks import ATTACK_POLICIES
from tradecore.audit import AuditAction, StoredAuditEntry
from tradecore.ports.repositories import AuditLog, TradingAccountRepository
from tradecore.ports.runtime import Clock
from tradecore.services.vocabulary import Principal, Rejected, bad_request, refuses_outages

DEFAULT_PAGE = 1
MAX_PAGE = 10_000
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
DEFAULT_DAYS = 30
MAX_DAYS = 365
ACCOUNT_COUNT_LIMIT = 1000

ATTACK_ACTIONS: frozenset[AuditAction] = frozenset(ATTACK_POLICIES)

_MAX_DIGITS = 6
_CREDENTIAL_WORDS = ("secret", "token", "password", "api_key", "apikey", "authorization", "cookie")


@attrs.frozen
class ReportQuery:
    """A validated request: page >= 1, page_size 1..100, days 1..365."""

    page: int = DEFAULT_PAGE
    page_size: int = DEFAULT_PAGE_SIZE
    days: int = DEFAULT_DAYS

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.page_size


def _bounded_int(name: str, raw: object, default: int, highest: int) -> int | Rejected:
    refused = bad_request(f"{name} must be an integer from 1 to {highest}")
    if raw is None:
        return default
    if isinstance(raw, bool):
        return refused
    if isinstance(raw, str):
        if not raw or len(raw) > _MAX_DIGITS or not raw.isascii() or not raw.isdigit():
            return refused
        raw = int(raw)
    if not isinstance(raw, int) or not 1 <= raw <= highest:
        return refused
    return raw


def parse_report_query(page: object, page_size: object, days: object) -> ReportQuery | Rejected:
    """The query from raw values (None for absent, an int, or a string of ASCII digits); a 400
    naming the first parameter out of range, or not a plain integer, otherwise."""
    checked_page = _bounded_int("page", page, DEFAULT_PAGE, MAX_PAGE)
    if isinstance(checked_page, Rejected):
        return checked_page
    checked_size = _bounded_int("page_size", page_size, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    if isinstance(checked_size, Rejected):
        return checked_size
    checked_days = _bounded_int("days", days, DEFAULT_DAYS, MAX_DAYS)
    if isinstance(checked_days, Rejected):
        return checked_days
    return ReportQuery(checked_page, checked_size, checked_days)


def _names_a_credential(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in _CREDENTIAL_WORDS)


def shown_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` without keys that name a credential, at any depth."""

    def clean(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): clean(v) for k, v in value.items() if not _names_a_credential(str(k))}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    cleaned: dict[str, Any] = clean(metadata)
    return cleaned


def _account_of(stored: StoredAuditEntry) -> str | None:
    account_id = stored.entry.metadata.get("trading_account_id")
    return account_id if isinstance(account_id, str) else None


@attrs.frozen
class SecurityEvent:
    """One attack event as the user sees it."""

    id: int
    action: AuditAction
    ip_address: str
    user_agent: str
    request_path: str
    created_at: datetime
    trading_account_id: str | None
    metadata: Mapping[str, Any]

    @classmethod
    def from_stored(cls, stored: StoredAuditEntry) -> SecurityEvent:
        entry = stored.entry
        return cls(
            id=stored.id,
            action=entry.action,
            ip_address=entry.context.ip_address,
            user_agent=entry.context.user_agent,
            request_path=entry.context.request_path,
            created_at=entry.created_at,
            trading_account_id=_account_of(stored),
            metadata=shown_metadata(entry.metadata),
        )


@attrs.frozen
class AffectedAccount:
    """A trading account the window's events name; ``name`` None when it is not one of the
    user's live accounts; ``events`` None when the window is too large to count per account."""

    trading_account_id: str
    name: str | None
    events: int | None


@attrs.frozen
class SecurityReportPage:
    counts: Mapping[AuditAction, int]
    items: tuple[SecurityEvent, ...]
    affected_accounts: tuple[AffectedAccount, ...]
    page: int
    page_size: int
    days: int
    total: int


class SecurityReport:
    """Reads one user's attack events (read-only; any principal of the user may ask)."""

    def __init__(self, audit: AuditLog, accounts: TradingAccountRepository, clock: Clock) -> None:
        self._audit = audit
        self._accounts = accounts
        self._clock = clock

    @refuses_outages
    async def page(
        self, principal: Principal, page: object, page_size: object, days: object
    ) -> SecurityReportPage | Rejected:
        """One page of the principal's own report; 400 on a bad query, 503 when a store is
        down."""
        query = parse_report_query(page, page_size, days)
        if isinstance(query, Rejected):
            return query
        user_id = principal.user_id
        since = self._clock.now() - timedelta(days=query.days)
        entries, total = await self._audit.list_for_user(
            user_id,
            actions=ATTACK_ACTIONS,
            since=since,
            limit=query.page_size,
            offset=query.offset,
        )
        summary = await self._audit.summary(user_id, actions=ATTACK_ACTIONS, since=since)
        per_account = await self._per_account(user_id, since, sum(summary.counts.values()))
        names = {a.id: a.name for a in await self._accounts.list_for_user(user_id)}
        return SecurityReportPage(
            counts={action: summary.counts.get(action, 0) for action in ATTACK_POLICIES},
            items=tuple(SecurityEvent.from_stored(s) for s in entries),
            affected_accounts=tuple(
                AffectedAccount(
                    account_id,
                    names.get(account_id),
                    None if per_account is None else per_account[account_id],
                )
                for account_id in summary.trading_account_ids
            ),
            page=query.page,
            page_size=query.page_size,
            days=query.days,
            total=total,
        )

    async def _per_account(
        self, user_id: str, since: datetime, window_total: int
    ) -> Counter[str] | None:
        if window_total > ACCOUNT_COUNT_LIMIT:
            return None
        window, _ = await self._audit.list_for_user(
            user_id, actions=ATTACK_ACTIONS, since=since, limit=ACCOUNT_COUNT_LIMIT
        )
        return Counter(a for s in window if (a := _account_of(s)) is not None)
