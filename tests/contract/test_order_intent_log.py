"""An order request's intent and its success audit entry, written together
(``OrderIntentLog``): the memory adapter and the Postgres one, where both are ONE statement
and one commit for all the intents and entries of a batch.

What a trader and an auditor depend on: an accepted order's history row never lacks its
audit entry, a replayed alert writes neither, and the audit chain stays whole whatever
a batch holds (a duplicate, another process's appends in between).
"""

from __future__ import annotations

import asyncio

import pytest
from test_repositories import (
    Stores,
    entry,
    memory_stores,
    order,
    postgres_stores,
    two_users_with_accounts,
)

from tradecore.audit import AuditAction, AuditEntry
from tradecore.audit_chain import first_break
from tradecore.errors import DuplicateOrder
from tradecore.orders import OrderHistoryRecord
from tradecore.ports.repositories import OrderIntentLog
from tradecore_adapters.memory.repositories import MemoryOrderIntentLog
from tradecore_adapters.postgres import Pool, PostgresAuditLog, PostgresIntentLog
from tradecore_adapters.postgres.rows import fetch_one


def intents_of(stores: Stores) -> OrderIntentLog:
    if isinstance(stores.audit, PostgresAuditLog):
        return PostgresIntentLog(stores.audit)
    return MemoryOrderIntentLog(stores.orders, stores.audit)


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest) -> Stores:
    if request.param == "memory":
        return memory_stores()
    return postgres_stores(request.getfixturevalue("pg_pool"))


def success(record: OrderHistoryRecord, seconds: float) -> AuditEntry:
    return entry(
        record.user_id,
        AuditAction.WEBHOOK_ORDER,
        seconds,
        resource_type="order",
        resource_id=record.id,
    )


def _when(entry: AuditEntry) -> object:
    return entry.created_at


async def entries_of(stores: Stores, user_id: str) -> list[AuditEntry]:
    found, _ = await stores.audit.list_for_user(user_id, limit=1000)
    return [stored.entry for stored in reversed(found)]


def test_adapters_implement_the_port() -> None:
    pool: object = object()
    assert isinstance(intents_of(memory_stores()), OrderIntentLog)
    assert isinstance(intents_of(postgres_stores(pool)), OrderIntentLog)  # type: ignore[arg-type]


async def test_the_intent_and_its_entry_are_both_written(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    record = order("o-1", fingerprint="fp-1")

    await intents_of(stores).add(record, success(record, 1))

    assert await stores.orders.get("o-1") == record
    assert await entries_of(stores, "user-1") == [success(record, 1)]
    assert first_break(await stores.audit.chain()) is None


async def test_a_taken_fingerprint_writes_neither(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    first = order("o-1", fingerprint="fp")
    replay = order("o-2", fingerprint="fp")
    intents = intents_of(stores)
    await intents.add(first, success(first, 1))

    with pytest.raises(DuplicateOrder):
        await intents.add(replay, success(replay, 2))

    assert await stores.orders.get("o-2") is None
    assert await entries_of(stores, "user-1") == [success(first, 1)]


async def test_concurrent_intents_and_other_entries_form_one_chain(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    intents = intents_of(stores)
    records = [order(f"o-{n}", f"user-{n % 2 + 1}", fingerprint=f"fp-{n}") for n in range(12)]
    others = [entry("user-1", AuditAction.LOGIN, 100 + n) for n in range(6)]

    await asyncio.gather(
        *(intents.add(r, success(r, n)) for n, r in enumerate(records)),
        *(stores.audit.append(e) for e in others),
    )

    sealed = await stores.audit.chain()
    assert first_break(sealed) is None
    written = sorted((s.entry for s in sealed), key=_when)
    assert written == sorted([*(success(r, n) for n, r in enumerate(records)), *others], key=_when)
    for record in records:
        assert await stores.orders.get(record.id) == record


async def test_a_duplicate_in_a_batch_refuses_only_itself(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    intents = intents_of(stores)
    taken = order("o-taken", fingerprint="fp-taken")
    await intents.add(taken, success(taken, 0))
    records = [order(f"o-{n}", fingerprint=f"fp-{n}") for n in range(5)]
    replay = order("o-replay", fingerprint="fp-taken")
    batch = [*records[:2], replay, *records[2:]]

    outcomes = await asyncio.gather(
        *(intents.add(r, success(r, n + 1)) for n, r in enumerate(batch)),
        return_exceptions=True,
    )

    assert [isinstance(o, DuplicateOrder) for o in outcomes] == [False] * 2 + [True] + [False] * 3
    assert await stores.orders.get("o-replay") is None
    kept = [success(taken, 0), *(success(r, n + 1) for n, r in enumerate(batch) if r != replay)]
    assert sorted(await entries_of(stores, "user-1"), key=_when) == kept
    assert first_break(await stores.audit.chain()) is None


# --- Postgres: one transaction, and what happens when it cannot be ------------------------


async def _written_by(pool: Pool, table: str, column: str, key: str) -> str | None:
    """The id of the transaction that wrote the row's current version, None without a row."""
    row = await fetch_one(
        pool, f"SELECT xmin::text AS xid FROM {table} WHERE {column} = %s", (key,)
    )
    return None if row is None else str(row["xid"])


@pytest.mark.postgres
async def test_postgres_commits_the_intent_with_its_entry(pg_pool: Pool) -> None:
    stores = postgres_stores(pg_pool)
    await two_users_with_accounts(stores)
    record = order("o-1", fingerprint="fp-1")

    await intents_of(stores).add(record, success(record, 1))

    written = await _written_by(pg_pool, "order_history", "id", "o-1")
    assert written is not None
    assert written == await _written_by(pg_pool, "audit_logs", "resource_id", "o-1")
    assert written == await _written_by(pg_pool, "order_keys", "id", "o-1")


@pytest.mark.postgres
async def test_an_intent_whose_chain_head_moved_gets_its_entry_right_after(pg_pool: Pool) -> None:
    """Another process appended since this one last saw the chain head: the statement's
    compare-and-set does not take, the intent is committed all the same, and its entry is
    sealed again onto the new head and appended."""
    stores = postgres_stores(pg_pool)
    await two_users_with_accounts(stores)
    audit = stores.audit
    assert isinstance(audit, PostgresAuditLog)
    await audit.append(entry("user-1", AuditAction.LOGIN, 0))  # this process caches the head
    await PostgresAuditLog(pg_pool).append(entry("user-2", AuditAction.LOGIN, 1))  # another
    record = order("o-1", fingerprint="fp-1")

    await PostgresIntentLog(audit).add(record, success(record, 2))

    assert await stores.orders.get("o-1") == record
    assert await entries_of(stores, "user-1") == [
        entry("user-1", AuditAction.LOGIN, 0),
        success(record, 2),
    ]
    assert first_break(await audit.chain()) is None
    assert await _written_by(pg_pool, "order_history", "id", "o-1") != await _written_by(
        pg_pool, "audit_logs", "resource_id", "o-1"
    )


@pytest.mark.postgres
async def test_an_entry_the_database_refuses_writes_no_intent(pg_pool: Pool) -> None:
    """The intent and its entry are one statement: when the entry cannot be stored (an
    address that is none), its order is not stored either, and the batch's others are."""
    stores = postgres_stores(pg_pool)
    await two_users_with_accounts(stores)
    intents = intents_of(stores)
    good = [order(f"o-{n}", fingerprint=f"fp-{n}") for n in range(3)]
    bad = order("o-bad", fingerprint="fp-bad")
    bad_entry = success(bad, 9)
    bad_entry = AuditEntry(
        user_id=bad_entry.user_id,
        action=bad_entry.action,
        success=True,
        context=bad_entry.context.__class__("not-an-address", "agent", "/webhook", "POST"),
        created_at=bad_entry.created_at,
        resource_type="order",
        resource_id=bad.id,
    )

    outcomes = await asyncio.gather(
        intents.add(good[0], success(good[0], 0)),
        intents.add(bad, bad_entry),
        *(intents.add(r, success(r, n)) for n, r in enumerate(good[1:], start=1)),
        return_exceptions=True,
    )

    assert [o is None for o in outcomes] == [True, False, True, True]
    assert await stores.orders.get("o-bad") is None
    assert {e.resource_id for e in await entries_of(stores, "user-1")} == {r.id for r in good}
    assert first_break(await stores.audit.chain()) is None
