"""The monthly partitions of order_history and audit_logs (migration 0010) and the job that
keeps them (``maintain_partitions``, ``tradecore partitions``), on a real Postgres database.

Each test migrates a throwaway database of its own: the job creates and drops partitions, which
must not change the schema the other contract tests share. The job's clock is passed in.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import attrs
import psycopg
import pytest
from postgres_fixtures import insert_owner
from test_verify_audit import SECRETS, database_url, run_cli, verify

from tradecore.audit import AuditAction, AuditEntry, RequestContext
from tradecore.errors import DuplicateOrder
from tradecore.order_lifecycle import Withdrawn
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderStatus,
    OrderType,
    Source,
)
from tradecore_adapters.postgres import (
    Pool,
    PostgresAuditLog,
    PostgresOrderHistory,
    migrate,
    open_pool,
)
from tradecore_adapters.postgres.partitions import (
    Retention,
    add_months,
    maintain_partitions,
    month_start,
)
from tradecore_entrypoints.audit_verification import verify_audit_chain

pytestmark = pytest.mark.postgres

JAN_31_LAST_SECOND = datetime(2026, 1, 31, 23, 59, 59, tzinfo=UTC)
FEB_1_FIRST_SECOND = datetime(2026, 2, 1, 0, 0, 1, tzinfo=UTC)


@attrs.frozen
class Db:
    conninfo: str
    pool: Pool


@pytest.fixture
async def db(fresh_pg_database: str) -> AsyncIterator[Db]:
    """A migrated database of this test's own, with one user and one trading account."""
    await migrate(fresh_pg_database)
    pool = await open_pool(fresh_pg_database, min_size=2, max_size=4, timeout_s=5.0)
    try:
        async with pool.connection() as conn:
            await insert_owner(conn)
        yield Db(fresh_pg_database, pool)
    finally:
        await pool.close()


def order(order_id: str, created_at: datetime, **changes: Any) -> OrderHistoryRecord:
    base = OrderHistoryRecord(
        id=order_id,
        user_id="u1",
        trading_account_id="a1",
        broker_name="paper",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        quantity=Decimal("0.5"),
        order_type=OrderType.ENTRY,
        source=Source.WEBHOOK,
        simulation=False,
        status=OrderStatus.QUEUED,
        created_at=created_at,
        request_id=f"req-{order_id}",
    )
    return attrs.evolve(base, **changes)


def audit_entry(created_at: datetime) -> AuditEntry:
    return AuditEntry(
        user_id="u1",
        action=AuditAction.LOGIN,
        success=True,
        context=RequestContext("203.0.113.7", "curl/8", "/login", "POST"),
        created_at=created_at,
    )


async def rows(pool: Pool, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        cursor = await conn.execute(query.encode(), params)
        return await cursor.fetchall() if cursor.description is not None else []


async def partitions(pool: Pool, table: str) -> list[str]:
    found = await rows(
        pool,
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass ORDER BY 1",
        table,
    )
    return [name for (name,) in found]


def months(table: str, *names: str) -> list[str]:
    return sorted([f"{table}_{n}" for n in names] + [f"{table}_default"])


# --- months and the migration's partitions ---------------------------------------------------


def test_month_arithmetic_is_utc_and_crosses_years() -> None:
    late = datetime(2026, 1, 31, 23, 30, tzinfo=UTC)
    assert month_start(late.astimezone(UTC)) == datetime(2026, 1, 1, tzinfo=UTC)
    # 00:30 on Feb 1st at UTC+01:00 is still January in UTC
    from datetime import timezone

    assert month_start(datetime(2026, 2, 1, 0, 30, tzinfo=timezone(timedelta(hours=1)))) == (
        datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert add_months(datetime(2026, 11, 1, tzinfo=UTC), 2) == datetime(2027, 1, 1, tzinfo=UTC)
    assert add_months(datetime(2026, 1, 1, tzinfo=UTC), -13) == datetime(2024, 12, 1, tzinfo=UTC)


async def test_the_migration_creates_this_month_the_next_two_and_a_default(db: Db) -> None:
    (now,) = await rows(db.pool, "SELECT now()")
    current = month_start(now[0])
    expected = [f"{add_months(current, n):%Y_%m}" for n in range(3)]
    for table in ("order_history", "audit_logs"):
        assert await partitions(db.pool, table) == months(table, *expected)


# --- rows land in their month ------------------------------------------------------------------


async def test_orders_and_audit_entries_land_in_their_utc_month(db: Db) -> None:
    await maintain_partitions(db.conninfo, now=JAN_31_LAST_SECOND)
    orders, audit = PostgresOrderHistory(db.pool), PostgresAuditLog(db.pool)
    await orders.add(order("jan", JAN_31_LAST_SECOND))
    await orders.add(order("feb", FEB_1_FIRST_SECOND))
    await audit.append(audit_entry(JAN_31_LAST_SECOND))
    await audit.append(audit_entry(FEB_1_FIRST_SECOND))

    assert await rows(
        db.pool, "SELECT id, tableoid::regclass::text FROM order_history ORDER BY id"
    ) == [("feb", "order_history_2026_02"), ("jan", "order_history_2026_01")]
    assert await rows(
        db.pool, "SELECT id, tableoid::regclass::text FROM audit_logs ORDER BY id"
    ) == [(1, "audit_logs_2026_01"), (2, "audit_logs_2026_02")]


async def test_an_order_in_a_month_without_partition_is_kept_and_moved_later(db: Db) -> None:
    """Nobody ran the job for years: the order still goes in (DEFAULT partition), is found
    and updated by id, and the next run moves it into its month."""
    far = datetime(2031, 5, 31, 23, 59, 59, tzinfo=UTC)
    orders = PostgresOrderHistory(db.pool)
    await orders.add(order("late", far, fingerprint="fp-late"))
    assert await rows(db.pool, "SELECT tableoid::regclass::text FROM order_history") == [
        ("order_history_default",)
    ]

    done = await maintain_partitions(db.conninfo, now=far)

    assert "order_history_2031_05" in done.created and done.moved_from_default == 1
    assert await rows(db.pool, "SELECT tableoid::regclass::text FROM order_history") == [
        ("order_history_2031_05",)
    ]
    assert await rows(db.pool, "SELECT count(*) FROM order_history_default") == [(0,)]
    moved = await orders.transition("late", Withdrawn())
    assert moved is not None and moved.status is OrderStatus.CANCELLED
    with pytest.raises(psycopg.errors.CheckViolation):  # the CHECKs came with the partition
        await rows(db.pool, "UPDATE order_history SET status = 'lost' WHERE id = 'late'")


# --- exactly once across months ------------------------------------------------------------------


async def test_a_replay_one_second_into_the_next_month_is_refused(db: Db) -> None:
    await maintain_partitions(db.conninfo, now=JAN_31_LAST_SECOND)
    orders = PostgresOrderHistory(db.pool)
    await orders.add(order("first", JAN_31_LAST_SECOND, fingerprint="fp-boundary"))

    with pytest.raises(DuplicateOrder):
        await orders.add(order("replay", FEB_1_FIRST_SECOND, fingerprint="fp-boundary"))

    assert await rows(db.pool, "SELECT id FROM order_history") == [("first",)]
    assert await rows(db.pool, "SELECT id FROM order_keys") == [("first",)]


async def test_concurrent_replays_in_two_months_make_one_order(db: Db) -> None:
    await maintain_partitions(db.conninfo, now=JAN_31_LAST_SECOND)
    orders = PostgresOrderHistory(db.pool)
    attempts = [
        order(f"try-{n}", JAN_31_LAST_SECOND if n % 2 else FEB_1_FIRST_SECOND, fingerprint="fp")
        for n in range(8)
    ]

    results = await asyncio.gather(*(orders.add(a) for a in attempts), return_exceptions=True)

    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, DuplicateOrder) for r in results if r is not None)
    assert await rows(db.pool, "SELECT count(*) FROM order_history") == [(1,)]


async def test_a_withdrawn_fingerprint_is_free_again_in_the_next_month(db: Db) -> None:
    await maintain_partitions(db.conninfo, now=JAN_31_LAST_SECOND)
    orders = PostgresOrderHistory(db.pool)
    await orders.add(order("first", JAN_31_LAST_SECOND, fingerprint="fp-again"))
    await orders.transition("first", Withdrawn())

    await orders.add(order("second", FEB_1_FIRST_SECOND, fingerprint="fp-again"))

    assert await rows(db.pool, "SELECT id, fingerprint FROM order_keys ORDER BY id") == [
        ("first", None),
        ("second", "fp-again"),
    ]


async def test_an_id_is_unique_across_months(db: Db) -> None:
    await maintain_partitions(db.conninfo, now=JAN_31_LAST_SECOND)
    orders = PostgresOrderHistory(db.pool)
    await orders.add(order("same", JAN_31_LAST_SECOND))

    with pytest.raises(psycopg.errors.UniqueViolation):
        await orders.add(order("same", FEB_1_FIRST_SECOND))


# --- the job -----------------------------------------------------------------------------------


async def test_the_job_creates_ahead_drops_past_retention_and_is_idempotent(db: Db) -> None:
    orders, audit = PostgresOrderHistory(db.pool), PostgresAuditLog(db.pool)
    # three months of history: March to May 2025
    for n, month in enumerate((3, 4, 5)):
        when = datetime(2025, month, 10, tzinfo=UTC)
        await maintain_partitions(db.conninfo, now=when)
        await orders.add(order(f"o{n}", when, status=OrderStatus.FILLED))
        await audit.append(audit_entry(when))
    now = datetime(2025, 7, 2, tzinfo=UTC)
    keep_two = Retention(order_history=2, audit_logs=2)

    done = await maintain_partitions(db.conninfo, now=now, retention=keep_two)

    # kept: May (ended less than two whole months before July began) and later
    assert sorted(done.dropped) == [
        "audit_logs_2025_03",
        "audit_logs_2025_04",
        "order_history_2025_03",
        "order_history_2025_04",
    ]
    assert {"order_history_2025_08", "order_history_2025_09"} <= set(done.created)
    assert await rows(db.pool, "SELECT id FROM order_history") == [("o2",)]
    assert await rows(db.pool, "SELECT id FROM order_keys") == [("o2",)]
    assert [e.id for e in await audit.chain()] == [3]
    assert done.audit_anchor is not None and done.audit_anchor.last_id == 2

    again = await maintain_partitions(db.conninfo, now=now, retention=keep_two)

    assert again.created == () and again.dropped == () and again.audit_anchor is None


async def test_a_month_with_an_open_order_is_kept(db: Db) -> None:
    when = datetime(2025, 3, 10, tzinfo=UTC)
    await maintain_partitions(db.conninfo, now=when)
    await PostgresOrderHistory(db.pool).add(order("open", when, status=OrderStatus.PENDING))

    done = await maintain_partitions(
        db.conninfo, now=datetime(2026, 3, 1, tzinfo=UTC), retention=Retention(order_history=1)
    )

    assert done.kept_open == ("order_history_2025_03",)
    assert "order_history_2025_03" not in done.dropped
    assert await rows(db.pool, "SELECT id FROM order_history") == [("open",)]


async def test_forever_drops_nothing(db: Db) -> None:
    when = datetime(2020, 1, 10, tzinfo=UTC)
    await maintain_partitions(db.conninfo, now=when)
    await PostgresOrderHistory(db.pool).add(order("old", when, status=OrderStatus.FILLED))
    await PostgresAuditLog(db.pool).append(audit_entry(when))

    done = await maintain_partitions(
        db.conninfo, now=datetime(2030, 1, 1, tzinfo=UTC), retention=Retention()
    )

    assert done.dropped == ()
    assert await rows(db.pool, "SELECT count(*) FROM order_history") == [(1,)]
    assert await rows(db.pool, "SELECT count(*) FROM audit_logs") == [(1,)]


async def test_two_hosts_running_the_job_at_once_create_each_month_once(db: Db) -> None:
    now = datetime(2027, 6, 15, tzinfo=UTC)

    runs = await asyncio.gather(*(maintain_partitions(db.conninfo, now=now) for _ in range(3)))

    created = sorted(name for run in runs for name in run.created)
    assert created == sorted(
        f"{table}_{month}"
        for table in ("order_history", "audit_logs")
        for month in ("2027_06", "2027_07", "2027_08")
    )


# --- the audit chain after retention -----------------------------------------------------------


async def sealed_months(db: Db) -> PostgresAuditLog:
    """Two entries in each of January to April 2025, appended in time order."""
    audit = PostgresAuditLog(db.pool)
    for month in (1, 2, 3, 4):
        await maintain_partitions(db.conninfo, now=datetime(2025, month, 1, tzinfo=UTC))
        for day in (10, 20):
            await audit.append(audit_entry(datetime(2025, month, day, tzinfo=UTC)))
    return audit


async def test_verify_audit_after_a_drop_starts_from_the_anchor(db: Db) -> None:
    audit = await sealed_months(db)
    head = await audit.stored_head()
    await maintain_partitions(
        db.conninfo, now=datetime(2025, 5, 5, tzinfo=UTC), retention=Retention(audit_logs=2)
    )
    anchor = await audit.retention_anchor()
    assert anchor is not None and anchor.last_id == 4  # January and February went

    result = await verify_audit_chain(audit, expect_head=head, anchor=anchor)

    assert result["ok"] is True and result["entries"] == 4 and result["head"] == head
    assert result["anchor"]["last_id"] == 4
    assert "removed by retention" in result["anchor"]["detail"]
    # without the anchor the same chain looks cut at its start: the anchor is what vouches
    unanchored = await verify_audit_chain(audit, expect_head=head)
    assert unanchored["ok"] is False and unanchored["kind"] == "unlinked"


@pytest.mark.parametrize("deleted", [5, 6], ids=["oldest-retained", "middle"])
async def test_a_deleted_entry_after_the_anchor_is_still_detected(db: Db, deleted: int) -> None:
    audit = await sealed_months(db)
    await maintain_partitions(
        db.conninfo, now=datetime(2025, 5, 5, tzinfo=UTC), retention=Retention(audit_logs=2)
    )
    await rows(db.pool, "DELETE FROM audit_logs WHERE id = %s", deleted)

    result = await verify_audit_chain(
        audit, expect_head=await audit.stored_head(), anchor=await audit.retention_anchor()
    )

    assert result == {
        "ok": False,
        "entry_id": deleted + 1,
        "kind": "unlinked",
        "detail": "does not follow the previous entry: an entry before it was removed or moved",
    }


async def test_an_entry_sealed_late_across_the_boundary_goes_with_its_month(db: Db) -> None:
    """An entry stamped 1 February but appended before one stamped 31 January (ids follow
    the append, months the stamp): dropping January also removes it, so the retained entries
    are exactly the chain after the anchor."""
    audit = PostgresAuditLog(db.pool)
    await maintain_partitions(db.conninfo, now=datetime(2025, 1, 1, tzinfo=UTC))
    await audit.append(audit_entry(datetime(2025, 1, 20, tzinfo=UTC)))  # id 1
    await audit.append(audit_entry(datetime(2025, 2, 1, 0, 0, 0, tzinfo=UTC)))  # id 2
    await audit.append(audit_entry(datetime(2025, 1, 31, 23, 59, 59, tzinfo=UTC)))  # id 3
    await audit.append(audit_entry(datetime(2025, 2, 1, 0, 0, 5, tzinfo=UTC)))  # id 4

    done = await maintain_partitions(
        db.conninfo, now=datetime(2025, 3, 1, tzinfo=UTC), retention=Retention(audit_logs=1)
    )

    assert done.audit_removed_across_boundary == 1
    assert [e.id for e in await audit.chain()] == [4]
    result = await verify_audit_chain(
        audit, expect_head=await audit.stored_head(), anchor=await audit.retention_anchor()
    )
    assert result["ok"] is True and result["entries"] == 1


# --- the commands -----------------------------------------------------------------------------


async def test_the_partitions_command_prints_what_it_did_and_refuses_a_bad_retention(
    db: Db,
) -> None:
    env = {"DATABASE_URL": database_url(db.conninfo), **SECRETS}

    status, out, err = await run_cli(
        "partitions", "--audit-keep-months", "forever", "--orders-keep-months", "forever", env=env
    )

    assert (status, err) == (0, "")
    assert json.loads(out) == {
        "created": [],
        "moved_from_default": 0,
        "dropped": [],
        "kept_open": [],
        "audit_removed_across_boundary": 0,
        "audit_anchor": None,
    }
    for bad in ("0", "twelve", "-3"):
        status, out, err = await run_cli(
            "partitions", env={**env, "TRADECORE_AUDIT_RETENTION_MONTHS": bad}
        )
        assert status == 2 and out == ""
        assert "neither a number of months (1 or more) nor 'forever'" in err


async def test_verify_audit_says_it_verified_from_the_anchor(db: Db) -> None:
    await sealed_months(db)
    await maintain_partitions(
        db.conninfo, now=datetime(2025, 5, 5, tzinfo=UTC), retention=Retention(audit_logs=2)
    )

    status, result = await verify(db.conninfo)

    assert status == 0 and result["ok"] is True and result["entries"] == 4
    assert result["anchor"]["last_id"] == 4
    assert result["anchor"]["retained_from"] == "2025-03-01T00:00:00+00:00"
