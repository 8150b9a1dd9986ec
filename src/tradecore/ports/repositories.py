"""Durable records: users, sessions, keys, allowed IPs, trading accounts, orders, audit.

Every method may raise ``DatabaseUnavailable``. Ids are assigned by the caller (RandomSource)
except audit entry ids, which the store assigns in increasing order.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

import attrs

from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, AuditEntry, AuditSummary, StoredAuditEntry
from tradecore.audit_chain import SealedEntry
from tradecore.identity import AllowedIp, ApiKey, Session, User
from tradecore.order_lifecycle import OrderChange
from tradecore.orders import OrderHistoryRecord
from tradecore.sessions import RefreshRotation


def save_fields(
    new: User | TradingAccount,
    previous: User | TradingAccount,
    guard: Collection[str] = (),
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The compare-and-set of ``UserRepository.save`` and ``TradingAccountRepository.save``:
    the fields where ``new`` differs from ``previous`` (written), and the fields the save
    compares with ``previous`` (those, ``guard``, and for an account ``deleted``, so no write
    lands on a deleted account), both in declaration order. Raises TypeError for a ``guard``
    name that is not a field and ValueError when ``previous`` is another record."""
    always = ("deleted",) if isinstance(new, TradingAccount) else ()
    names = tuple(f.name for f in attrs.fields(type(new)))
    unknown = sorted(set(guard) - set(names))
    if unknown:
        raise TypeError(f"{type(new).__name__} has no field {', '.join(unknown)}")
    if new.id != previous.id:
        raise ValueError("save: previous is another record")
    changed = tuple(f for f in names if getattr(new, f) != getattr(previous, f))
    checked = set(changed).union(guard, always)
    return changed, tuple(f for f in names if f in checked)


@runtime_checkable
class UserRepository(Protocol):
    async def add(self, user: User) -> bool:
        """Store a new user; False (nothing stored) when the e-mail is taken (case-insensitive)."""
        ...

    async def add_first(self, user: User) -> bool:
        """Store ``user`` only while no user at all is stored, the check and the insert in
        one atomic step: of concurrent ``add_first`` calls at most one stores, and an ``add``
        racing with it lands either before (this call stores nothing) or after it. True when
        stored; False (nothing stored) when any user exists."""
        ...

    async def any_exist(self) -> bool:
        """True once at least one user is stored (disabled ones included)."""
        ...

    async def get(self, user_id: str) -> User | None: ...

    async def by_email(self, email: str) -> User | None:
        """Look up by e-mail, case-insensitively."""
        ...

    async def save(self, user: User, *, previous: User, guard: Collection[str] = ()) -> User | None:
        """Compare-and-set the fields where ``user`` differs from ``previous`` (the stored
        user the caller read and derived ``user`` from): those fields are written, and only
        if each still holds its value in ``previous``, as must every field named in ``guard``
        (fields the change was decided on). Fields that neither differ nor are named are
        neither written nor compared, so a concurrent change to them survives. Returns the
        stored user after the write, or None (nothing written) when a compared field no
        longer holds its ``previous`` value or the user does not exist. When nothing differs
        nothing is written and the answer says whether the compared fields still hold.
        ``previous.id`` must be ``user.id``; unknown names in ``guard`` raise TypeError."""
        ...


@runtime_checkable
class SessionRepository(Protocol):
    async def add(self, session: Session) -> None: ...

    async def get(self, session_id: str) -> Session | None: ...

    async def rotate_refresh(
        self, session_id: str, expected_jti: str, new_jti: str, *, at: datetime
    ) -> bool:
        """Compare-and-set the session's refresh token id; False when it was not
        ``expected_jti`` or the session is inactive (nothing changed). A rotation that lands
        also records itself as the session's ``last_rotation`` (``expected_jti`` retired
        ``at``), in the same atomic step."""
        ...

    async def last_rotation(self, session_id: str) -> RefreshRotation | None:
        """The session's latest rotation (what it retired, when); None before the first one
        or for an unknown session."""
        ...

    async def deactivate(self, session_id: str, at: datetime) -> bool:
        """Set is_active false; True when it was active."""
        ...

    async def deactivate_all(self, user_id: str, at: datetime) -> int:
        """Revoke every active session of the user; the number revoked."""
        ...


@runtime_checkable
class ApiKeyRepository(Protocol):
    async def add(self, key: ApiKey) -> None: ...

    async def by_hash(self, key_hash: str) -> ApiKey | None: ...

    async def list_for_user(self, user_id: str) -> list[ApiKey]: ...

    async def revoke(self, key_id: str, user_id: str, at: datetime) -> bool:
        """Revoke the user's key at once; False when the user has no such live key."""
        ...

    async def touch(self, key_id: str, at: datetime) -> None:
        """Set last_used_at."""
        ...


@runtime_checkable
class AllowedIpRepository(Protocol):
    async def add(self, entry: AllowedIp) -> bool:
        """False (nothing stored) when the user already lists that address."""
        ...

    async def list_for_user(self, user_id: str) -> list[AllowedIp]: ...

    async def remove(self, entry_id: str, user_id: str) -> bool: ...


@attrs.frozen
class WebhookOwner:
    """What the webhook checks read about the owner of a webhook token, read in one lookup.

    ``allowed_ips``: the user's allowed addresses and CIDR blocks (``AllowedIp.ip_address``),
    oldest first; empty means every address is allowed. (The daily cap's count is the
    key-value store's, ``DailyOrderCounter``, so the lookup carries none and may be cached.)
    """

    account: TradingAccount
    user: User
    allowed_ips: tuple[str, ...]


@runtime_checkable
class TradingAccountRepository(Protocol):
    async def add(self, account: TradingAccount) -> None: ...

    async def get(self, account_id: str) -> TradingAccount | None:
        """The account, deleted ones excluded."""
        ...

    async def webhook_owner(self, token_hash: str) -> WebhookOwner | None:
        """Layer 1 and the owner's data the next checks need, in one lookup: the live account
        with that token digest, its owner and the owner's allowed IPs (as
        ``AllowedIpRepository.list_for_user`` lists them). None when no live account has that
        digest."""
        ...

    async def list_for_user(self, user_id: str) -> list[TradingAccount]: ...

    async def save(
        self,
        account: TradingAccount,
        *,
        previous: TradingAccount,
        guard: Collection[str] = (),
    ) -> TradingAccount | None:
        """Compare-and-set the fields where ``account`` differs from ``previous``, exactly as
        ``UserRepository.save`` does; ``deleted`` is always compared as well, so a write
        decided on a live account never lands on one deleted meanwhile. Returns the stored
        account after the write (deleted ones included), or None (nothing written) when a
        compared field no longer holds its ``previous`` value or the account does not
        exist."""
        ...


@runtime_checkable
class OrderHistory(Protocol):
    async def add(self, record: OrderHistoryRecord) -> None:
        """Store a new row durably before returning. Raises DuplicateOrder when the user
        already has a row with the same non-null ``fingerprint``."""
        ...

    async def get(self, order_id: str) -> OrderHistoryRecord | None: ...

    async def get_many(self, order_ids: Sequence[str]) -> dict[str, OrderHistoryRecord]:
        """The rows of ``order_ids`` by id, each as ``get`` returns it, read together (one
        query to the store, not one per id): an id without a row is absent from the answer,
        an id named twice is read once. No ids: {} without a query."""
        ...

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        """Compare-and-set ``change`` (``tradecore.order_lifecycle``) onto the row, in one
        atomic step: its fields are written only if the row's status is one the lifecycle
        table lets the change leave (``order_lifecycle.sources(change)``). Returns the updated
        row, or None (nothing written) when the row is missing or its status is elsewhere: a
        lost race, an expected outcome, never an error. Raises IllegalTransition, before the
        store is touched, for a change the table allows from no status. ``Withdrawn`` frees
        the row's fingerprint for a new row."""
        ...

    async def list_for_user(
        self,
        user_id: str,
        *,
        trading_account_id: str | None = None,
        before: datetime | None = None,
        limit: int = 50,
    ) -> Sequence[OrderHistoryRecord]:
        """Newest first; ``before`` is an exclusive created_at cursor."""
        ...

    async def count_since(self, user_id: str, since: datetime) -> int:
        """Orders (real and simulated) the user created at or after ``since``: the daily cap."""
        ...

    async def stale_queued(self, before: datetime, limit: int) -> list[OrderHistoryRecord]:
        """(Worker hosts' recovery) rows still ``queued`` that were created before ``before``,
        oldest first (by created_at, then id); at most ``limit``. Reads an index of the
        queued rows only, so it stays cheap however long the history grows."""
        ...


@runtime_checkable
class AuditLog(Protocol):
    async def append(self, entry: AuditEntry) -> int:
        """Store the entry durably and seal it onto the chain (``tradecore.audit_chain``):
        its previous seal is the seal of the entry appended just before it, across every
        process. Returns its id; ids increase in chain order."""
        ...

    async def chain(self, *, after_id: int = 0, limit: int = 1000) -> list[SealedEntry]:
        """Sealed entries with an id above ``after_id``, oldest first, as stored."""
        ...

    async def summary(
        self, user_id: str, *, actions: Collection[AuditAction], since: datetime | None
    ) -> AuditSummary:
        """Counts by action and the accounts named, over the user's matching entries."""
        ...

    async def list_for_user(
        self,
        user_id: str,
        *,
        actions: Collection[AuditAction] | None = None,
        since: datetime | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[StoredAuditEntry], int]:
        """The user's entries, newest first, and the total matching count."""
        ...
