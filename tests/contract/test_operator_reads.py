"""Contract of the operator's read methods and of the first-run insert, on every adapter:
``WorkerDirectory.leases``, ``OrderQueue.depths``, ``FillTaskQueue.pending_count``,
``UserRepository.add_first`` / ``any_exist`` and ``SchemaLedger.state``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import attrs
import pytest
from redis_fixtures import KvHarness, fill_task, order_request, order_result

from tradecore.identity import Plan, User
from tradecore.ports.deployment import SchemaLedger
from tradecore.ports.messaging import QueueDepth, WorkerLease
from tradecore.ports.repositories import UserRepository
from tradecore_adapters.memory.repositories import MemoryUserRepository
from tradecore_adapters.memory.schema_ledger import MemorySchemaLedger
from tradecore_adapters.postgres import Pool, PostgresUserRepository, open_pool
from tradecore_adapters.postgres.migrate import migration_files
from tradecore_adapters.postgres.schema_ledger import PostgresSchemaLedger

T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)

# --- worker leases -------------------------------------------------------------------------


async def test_leases_list_the_live_marks_by_user(kv: KvHarness) -> None:
    assert await kv.directory.leases() == []
    assert await kv.directory.acquire("u2", "host-b:7", 60) == 1
    assert await kv.directory.acquire("u1", "host-a", 60) == 1
    assert await kv.directory.leases() == [
        WorkerLease("u1", "host-a", 1),
        WorkerLease("u2", "host-b:7", 1),  # a holder name may hold colons
    ]
    assert await kv.directory.leases(limit=1) == [WorkerLease("u1", "host-a", 1)]


async def test_released_and_lapsed_leases_are_not_listed(kv: KvHarness) -> None:
    token = await kv.directory.acquire("u1", "host-a", 60)
    await kv.directory.acquire("u2", "host-a", 60)
    assert token is not None
    await kv.directory.release("u1", token)
    await kv.lapse("mark", "u2")
    assert await kv.directory.leases() == []
    assert await kv.directory.acquire("u1", "host-c", 60) == 2
    assert await kv.directory.leases() == [WorkerLease("u1", "host-c", 2)]


# --- order queue depths --------------------------------------------------------------------


async def test_depths_count_waiting_and_in_flight_requests_per_user(kv: KvHarness) -> None:
    assert await kv.queue.depths() == []
    for n in (1, 2, 3):
        await kv.queue.park(order_request(f"r{n}", "u2"))
    await kv.queue.park(order_request("r4", "u1"))
    taken = await kv.queue.take("u2", 0)
    assert taken is not None
    assert await kv.queue.depths() == [QueueDepth("u1", 1, 0), QueueDepth("u2", 2, 1)]
    assert await kv.queue.depths(limit=1) == [QueueDepth("u1", 1, 0)]
    await kv.queue.complete(taken, order_result(taken))
    assert await kv.queue.depths() == [QueueDepth("u1", 1, 0), QueueDepth("u2", 2, 0)]


async def test_users_whose_lists_emptied_are_not_listed(kv: KvHarness) -> None:
    await kv.queue.park(order_request("r1", "u1"))
    taken = await kv.queue.take("u1", 0)
    assert taken is not None
    await kv.queue.complete(taken, order_result(taken))
    assert await kv.queue.depths() == []


# --- fill tasks ----------------------------------------------------------------------------


async def test_pending_count_covers_every_unsettled_message(kv: KvHarness) -> None:
    tasks = kv.tasks()
    assert await tasks.pending_count() == 0
    await tasks.send(fill_task("o1", "u1"), 0)
    await tasks.send(fill_task("o2", "u2"), 0)
    await tasks.send(fill_task("o3", "u3"), 3600)  # delayed still counts
    await tasks.send(fill_task("o1", "u1"), 0)  # deduplicated: not a message
    assert await tasks.pending_count() == 3
    first = await tasks.receive(0)
    assert first is not None
    assert await tasks.pending_count() == 3  # in flight still counts
    await tasks.ack(first)
    second = await tasks.receive(0)
    assert second is not None
    await tasks.dead_letter(second, "gave up")
    assert await tasks.pending_count() == 1
    assert [(t.order_id, r) for t, r in await tasks.dead_letters()] == [
        (second.task.order_id, "gave up")
    ]


# --- the first user ------------------------------------------------------------------------


def user(n: int, **changes: object) -> User:
    base = User(
        id=f"user-{n}",
        email=f"admin{n}@example.com",
        password_hash=f"$argon2id$v=19$m=65536,t=3,p=4$salt{n}$hash",
        plan=Plan.PRO,
        created_at=T0,
    )
    return attrs.evolve(base, **changes)


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def users(request: pytest.FixtureRequest) -> UserRepository:
    if request.param == "memory":
        return MemoryUserRepository()
    pool: Pool = request.getfixturevalue("pg_pool")
    return PostgresUserRepository(pool)


def test_user_stores_implement_the_port() -> None:
    assert isinstance(MemoryUserRepository(), UserRepository)
    assert isinstance(PostgresUserRepository(object()), UserRepository)  # type: ignore[arg-type]


async def test_the_admin_flag_round_trips(users: UserRepository) -> None:
    admin = user(1, is_admin=True)
    assert await users.add(admin)
    assert await users.add(user(2))
    assert await users.get("user-1") == admin
    assert (await users.by_email("admin2@example.com")) == user(2, is_admin=False)
    demoted = attrs.evolve(admin, is_admin=False)
    assert await users.save(demoted, previous=admin) == demoted


async def test_add_first_stores_only_into_an_empty_store(users: UserRepository) -> None:
    assert not await users.any_exist()
    assert await users.add_first(user(1, is_admin=True))
    assert await users.any_exist()
    assert not await users.add_first(user(2, is_admin=True))
    assert await users.get("user-2") is None


async def test_add_first_is_closed_by_any_user(users: UserRepository) -> None:
    assert await users.add(user(1))
    assert not await users.add_first(user(2, is_admin=True))
    assert await users.get("user-2") is None


async def test_concurrent_add_first_store_exactly_one(users: UserRepository) -> None:
    stored = await asyncio.gather(*(users.add_first(user(n, is_admin=True)) for n in range(8)))
    assert sorted(stored) == [False] * 7 + [True]
    winner = stored.index(True)
    assert await users.get(f"user-{winner}") == user(winner, is_admin=True)
    assert [n for n in range(8) if await users.get(f"user-{n}") is not None] == [winner]


# --- the schema ledger ---------------------------------------------------------------------


async def test_memory_schema_has_nothing_to_migrate() -> None:
    ledger = MemorySchemaLedger()
    assert isinstance(ledger, SchemaLedger)
    state = await ledger.state()
    assert (state.store, state.applied, state.pending) == ("memory", (), ())


@pytest.mark.postgres
async def test_postgres_schema_lists_the_applied_migrations(pg_pool: Pool) -> None:
    ledger = PostgresSchemaLedger(pg_pool)
    assert isinstance(ledger, SchemaLedger)
    state = await ledger.state()
    assert state.store == "postgres"
    assert [m.name for m in state.applied] == [name for name, _ in migration_files()]
    assert "0006_admin_role.sql" in [m.name for m in state.applied]
    assert all(m.applied_at.tzinfo is not None for m in state.applied)
    assert state.pending == ()


@pytest.mark.postgres
async def test_an_unmigrated_database_has_everything_pending(fresh_pg_database: str) -> None:
    pool = await open_pool(fresh_pg_database, min_size=1, max_size=2, timeout_s=5.0)
    try:
        state = await PostgresSchemaLedger(pool).state()
    finally:
        await pool.close()
    assert state.applied == ()
    assert state.pending == tuple(name for name, _ in migration_files())
