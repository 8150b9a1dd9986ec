"""In-memory repositories: the durable-record ports held in dictionaries.

"Durable" here means: stored before the call returns and visible to every later call in the
process. Semantics (uniqueness, compare-and-set, ordering) match the Postgres adapters.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, TypeVar

import attrs

from tradecore import order_lifecycle
from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, AuditEntry, AuditSummary, StoredAuditEntry
from tradecore.audit_chain import GENESIS, SealedEntry, normalized, seal
from tradecore.errors import DuplicateOrder
from tradecore.identity import AllowedIp, ApiKey, Session, User
from tradecore.order_lifecycle import OrderChange
from tradecore.orders import OrderHistoryRecord, OrderStatus
from tradecore.ports.repositories import WebhookOwner, save_fields
from tradecore.sessions import RefreshRotation

_Record = TypeVar("_Record", User, TradingAccount)


def _compare_and_set(
    stored: _Record | None,
    new: _Record,
    previous: _Record,
    guard: Collection[str],
) -> _Record | None:
    """``stored`` with the fields where ``new`` differs from ``previous`` taken from ``new``;
    None when there is no ``stored`` or a compared field (``save_fields``) no longer holds its
    value in ``previous``."""
    changed, compared = save_fields(new, previous, guard)
    if stored is None or any(getattr(stored, f) != getattr(previous, f) for f in compared):
        return None
    return attrs.evolve(stored, **{f: getattr(new, f) for f in changed}) if changed else stored


class MemoryUserRepository:
    def __init__(self) -> None:
        self._by_id: dict[str, User] = {}
        self._id_by_email: dict[str, str] = {}

    async def add(self, user: User) -> bool:
        key = user.email.casefold()
        if key in self._id_by_email:
            return False
        self._by_id[user.id] = user
        self._id_by_email[key] = user.id
        return True

    async def add_first(self, user: User) -> bool:
        # no await between the check and the insert: atomic on the one event loop
        if self._by_id:
            return False
        return await self.add(user)

    async def any_exist(self) -> bool:
        return bool(self._by_id)

    async def get(self, user_id: str) -> User | None:
        return self._by_id.get(user_id)

    async def by_email(self, email: str) -> User | None:
        user_id = self._id_by_email.get(email.casefold())
        return None if user_id is None else self._by_id[user_id]

    async def save(self, user: User, *, previous: User, guard: Collection[str] = ()) -> User | None:
        old = self._by_id.get(previous.id)
        stored = _compare_and_set(old, user, previous, guard)
        if old is None or stored is None:
            return None
        del self._id_by_email[old.email.casefold()]
        self._by_id[stored.id] = stored
        self._id_by_email[stored.email.casefold()] = stored.id
        return stored


class MemorySessionRepository:
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._rotations: dict[str, RefreshRotation] = {}

    async def add(self, session: Session) -> None:
        self._sessions[session.id] = session

    async def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    async def rotate_refresh(
        self, session_id: str, expected_jti: str, new_jti: str, *, at: datetime
    ) -> bool:
        session = self._sessions.get(session_id)
        if session is None or not session.is_active or session.refresh_jti != expected_jti:
            return False
        self._sessions[session_id] = attrs.evolve(session, refresh_jti=new_jti)
        self._rotations[session_id] = RefreshRotation(retired_jti=expected_jti, rotated_at=at)
        return True

    async def last_rotation(self, session_id: str) -> RefreshRotation | None:
        return self._rotations.get(session_id)

    async def deactivate(self, session_id: str, at: datetime) -> bool:
        session = self._sessions.get(session_id)
        if session is None or not session.is_active:
            return False
        self._sessions[session_id] = attrs.evolve(session, is_active=False, revoked_at=at)
        return True

    async def deactivate_all(self, user_id: str, at: datetime) -> int:
        revoked = 0
        for session in list(self._sessions.values()):
            if session.user_id == user_id and await self.deactivate(session.id, at):
                revoked += 1
        return revoked


class MemoryApiKeyRepository:
    def __init__(self) -> None:
        self._keys: dict[str, ApiKey] = {}

    async def add(self, key: ApiKey) -> None:
        self._keys[key.id] = key

    async def by_hash(self, key_hash: str) -> ApiKey | None:
        return next((k for k in self._keys.values() if k.key_hash == key_hash), None)

    async def list_for_user(self, user_id: str) -> list[ApiKey]:
        keys = [k for k in self._keys.values() if k.user_id == user_id]
        return sorted(keys, key=lambda k: k.created_at)

    async def revoke(self, key_id: str, user_id: str, at: datetime) -> bool:
        key = self._keys.get(key_id)
        if key is None or key.user_id != user_id or key.revoked_at is not None:
            return False
        self._keys[key_id] = attrs.evolve(key, revoked_at=at)
        return True

    async def touch(self, key_id: str, at: datetime) -> None:
        key = self._keys.get(key_id)
        if key is not None:
            self._keys[key_id] = attrs.evolve(key, last_used_at=at)


class MemoryAllowedIpRepository:
    def __init__(self) -> None:
        self._entries: dict[str, AllowedIp] = {}

    async def add(self, entry: AllowedIp) -> bool:
        if any(
            e.user_id == entry.user_id and e.ip_address == entry.ip_address
            for e in self._entries.values()
        ):
            return False
        self._entries[entry.id] = entry
        return True

    async def list_for_user(self, user_id: str) -> list[AllowedIp]:
        entries = [e for e in self._entries.values() if e.user_id == user_id]
        return sorted(entries, key=lambda e: e.created_at)

    async def remove(self, entry_id: str, user_id: str) -> bool:
        entry = self._entries.get(entry_id)
        if entry is None or entry.user_id != user_id:
            return False
        del self._entries[entry_id]
        return True


class MemoryTradingAccountRepository:
    """The accounts; ``webhook_owner`` also reads the allowed IPs given here (the stores of the
    same runtime; ``orders`` is kept for the wiring, the lookup no longer counts orders)."""

    def __init__(
        self,
        users: MemoryUserRepository,
        allowed_ips: MemoryAllowedIpRepository,
        orders: MemoryOrderHistory,
    ) -> None:
        self._users = users
        self._allowed_ips = allowed_ips
        self._orders = orders
        self._accounts: dict[str, TradingAccount] = {}
        self._id_by_token_hash: dict[str, str] = {}

    async def add(self, account: TradingAccount) -> None:
        self._accounts[account.id] = account
        self._id_by_token_hash[account.webhook_token_hash] = account.id

    async def get(self, account_id: str) -> TradingAccount | None:
        account = self._accounts.get(account_id)
        return None if account is None or account.deleted else account

    async def _by_token_hash(self, token_hash: str) -> tuple[TradingAccount, User] | None:
        account_id = self._id_by_token_hash.get(token_hash)
        account = None if account_id is None else await self.get(account_id)
        if account is None:
            return None
        user = await self._users.get(account.user_id)
        return None if user is None else (account, user)

    async def webhook_owner(self, token_hash: str) -> WebhookOwner | None:
        found = await self._by_token_hash(token_hash)
        if found is None:
            return None
        account, user = found
        entries = await self._allowed_ips.list_for_user(user.id)
        return WebhookOwner(
            account=account,
            user=user,
            allowed_ips=tuple(e.ip_address for e in entries),
        )

    async def list_for_user(self, user_id: str) -> list[TradingAccount]:
        accounts = [a for a in self._accounts.values() if a.user_id == user_id and not a.deleted]
        return sorted(accounts, key=lambda a: a.created_at)

    async def save(
        self,
        account: TradingAccount,
        *,
        previous: TradingAccount,
        guard: Collection[str] = (),
    ) -> TradingAccount | None:
        old = self._accounts.get(previous.id)
        stored = _compare_and_set(old, account, previous, guard)
        if old is None or stored is None:
            return None
        self._id_by_token_hash.pop(old.webhook_token_hash, None)
        self._accounts[stored.id] = stored
        self._id_by_token_hash[stored.webhook_token_hash] = stored.id
        return stored


class MemoryOrderHistory:
    def __init__(self) -> None:
        self._rows: dict[str, OrderHistoryRecord] = {}
        self._fingerprints: set[tuple[str, str]] = set()
        self._created: dict[str, list[datetime]] = {}  # per user, sorted, for the daily cap

    async def add(self, record: OrderHistoryRecord) -> None:
        if record.fingerprint is not None:
            key = (record.user_id, record.fingerprint)
            if key in self._fingerprints:
                raise DuplicateOrder(record.fingerprint)
            self._fingerprints.add(key)
        self._rows[record.id] = record
        bisect.insort(self._created.setdefault(record.user_id, []), record.created_at)

    async def get(self, order_id: str) -> OrderHistoryRecord | None:
        return self._rows.get(order_id)

    async def get_many(self, order_ids: Sequence[str]) -> dict[str, OrderHistoryRecord]:
        rows = self._rows
        return {order_id: rows[order_id] for order_id in order_ids if order_id in rows}

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        leaves = order_lifecycle.sources(change)
        row = self._rows.get(order_id)
        if row is None or row.status not in leaves:
            return None
        written: dict[str, Any] = change.fields()
        updated = attrs.evolve(row, **written)
        if updated.fingerprint != row.fingerprint:
            if row.fingerprint is not None:
                self._fingerprints.discard((row.user_id, row.fingerprint))
            if updated.fingerprint is not None:
                self._fingerprints.add((row.user_id, updated.fingerprint))
        self._rows[order_id] = updated
        return updated

    async def list_for_user(
        self,
        user_id: str,
        *,
        trading_account_id: str | None = None,
        before: datetime | None = None,
        limit: int = 50,
    ) -> Sequence[OrderHistoryRecord]:
        rows = [
            r
            for r in self._rows.values()
            if r.user_id == user_id
            and (trading_account_id is None or r.trading_account_id == trading_account_id)
            and (before is None or r.created_at < before)
        ]
        rows.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return rows[:limit]

    async def count_since(self, user_id: str, since: datetime) -> int:
        created = self._created.get(user_id, [])
        return len(created) - bisect.bisect_left(created, since)

    async def stale_queued(self, before: datetime, limit: int) -> list[OrderHistoryRecord]:
        rows = [
            r
            for r in self._rows.values()
            if r.status is OrderStatus.QUEUED and r.created_at < before
        ]
        rows.sort(key=lambda r: (r.created_at, r.id))
        return rows[: max(limit, 0)]


class MemoryAuditLog:
    """The audit log in memory. Entries are immutable once appended, so their seals are
    computed when the chain is first read, not on the request path; the chain read is the
    same as if each entry had been sealed on append."""

    def __init__(self) -> None:
        self._entries: list[StoredAuditEntry] = []
        self._sealed: list[SealedEntry] = []  # the chain of _entries[: len(_sealed)]

    async def append(self, entry: AuditEntry) -> int:
        stored = StoredAuditEntry(id=len(self._entries) + 1, entry=normalized(entry))
        self._entries.append(stored)
        return stored.id

    async def chain(self, *, after_id: int = 0, limit: int = 1000) -> list[SealedEntry]:
        self._seal_pending()
        start = max(0, after_id)
        return self._sealed[start : start + max(0, limit)]

    def _seal_pending(self) -> None:
        previous = self._sealed[-1].seal if self._sealed else GENESIS
        for stored in self._entries[len(self._sealed) :]:
            sealed = SealedEntry(stored.id, stored.entry, previous, seal(previous, stored.entry))
            self._sealed.append(sealed)
            previous = sealed.seal

    async def summary(
        self, user_id: str, *, actions: Collection[AuditAction], since: datetime | None
    ) -> AuditSummary:
        counts: Counter[AuditAction] = Counter()
        accounts: dict[str, None] = {}
        for stored in reversed(self._entries):
            entry = stored.entry
            if entry.user_id != user_id or entry.action not in actions:
                continue
            if since is not None and entry.created_at < since:
                continue
            counts[entry.action] += 1
            account_id = entry.metadata.get("trading_account_id")
            if isinstance(account_id, str):
                accounts.setdefault(account_id)
        return AuditSummary(dict(counts), tuple(accounts))

    async def list_for_user(
        self,
        user_id: str,
        *,
        actions: Collection[AuditAction] | None = None,
        since: datetime | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[StoredAuditEntry], int]:
        matching = [
            s
            for s in reversed(self._entries)
            if s.entry.user_id == user_id
            and (actions is None or s.entry.action in actions)
            and (since is None or s.entry.created_at >= since)
        ]
        return matching[offset : offset + limit], len(matching)

    def all(self) -> list[StoredAuditEntry]:
        """Every entry, oldest first (tests and the demo read it)."""
        return list(self._entries)
