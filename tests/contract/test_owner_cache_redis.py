"""The webhook owner cache across API processes: two caches, each on its own Redis
connections (two API processes' worth), over one Postgres database.

A change written through one side's repository wrappers reaches the other side through Redis
pub/sub, which drops its entries: its next lookup misses and sees the change. Without the
announcement the other side serves its entry until the TTL (on an injected clock), never
longer. A lookup in flight when the announcement comes stores nothing. A lost subscription
drops everything and serves nothing until Redis confirms the next one. Each test has its own
channel (channels are server-wide: other test runs on the same server must not interfere).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
from redis_fixtures import pubsub_listeners

from tradecore.accounts import TradingAccount
from tradecore.identity import AllowedIp, Plan, User
from tradecore.ports.owner_changes import OwnerChanges
from tradecore.ports.repositories import WebhookOwner
from tradecore_adapters.owner_cache import (
    AnnouncingAllowedIps,
    AnnouncingUsers,
    CachedTradingAccounts,
    WebhookOwnerCache,
)
from tradecore_adapters.postgres import (
    Pool,
    PostgresAllowedIpRepository,
    PostgresTradingAccountRepository,
    PostgresUserRepository,
)
from tradecore_adapters.redis import RedisConnections, open_connections
from tradecore_adapters.redis.owner_changes import RedisOwnerChanges

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

T0 = datetime(2026, 1, 5, tzinfo=UTC)
TTL_S = 5.0
TOKEN = "a" * 64
DELIVERY_S = 5.0
"""A generous bound on waiting for a pub/sub event (an event, not a timing assertion)."""


@attrs.define
class Ticks:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


class WatchedCache(WebhookOwnerCache):
    """A cache that counts what its subscription told it, for the tests to wait on."""

    def __init__(self, ticks: Ticks) -> None:
        super().__init__(100, TTL_S, monotonic=ticks)
        self.changes = 0
        self.confirmations = 0
        self.heard = asyncio.Event()

    def changed(self, user_id: str) -> None:
        super().changed(user_id)
        self.changes += 1
        self.heard.set()

    def resubscribed(self) -> None:
        super().resubscribed()
        self.confirmations += 1
        self.heard.set()

    async def hear(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition`` holds after what the subscription delivers."""
        async with asyncio.timeout(DELIVERY_S):
            while not condition():
                self.heard.clear()
                await self.heard.wait()


class CountingAccounts(PostgresTradingAccountRepository):
    """The Postgres lookup, counted; ``gate``, when set, holds a lookup after its read."""

    def __init__(self, pool: Pool) -> None:
        super().__init__(pool)
        self.lookups = 0
        self.read = asyncio.Event()
        self.gate: asyncio.Event | None = None

    async def webhook_owner(self, token_hash: str) -> WebhookOwner | None:
        self.lookups += 1
        found = await super().webhook_owner(token_hash)
        self.read.set()
        if self.gate is not None:
            await self.gate.wait()
        return found


@attrs.define
class Side:
    """One API process: its Redis connections, cache and wrapped repositories."""

    connections: RedisConnections
    changes: RedisOwnerChanges
    cache: WatchedCache
    ticks: Ticks
    database: CountingAccounts
    accounts: CachedTradingAccounts
    users: AnnouncingUsers
    allowed_ips: AnnouncingAllowedIps

    async def lookup(self) -> WebhookOwner | None:
        return await self.accounts.webhook_owner(TOKEN)

    async def warm(self) -> WebhookOwner | None:
        """Subscribe, wait for the confirmation, look up twice (the second from the cache)."""
        await self.lookup()
        await self.cache.hear(lambda: self.cache.live)
        found = await self.lookup()
        lookups = self.database.lookups
        assert await self.lookup() == found
        assert self.database.lookups == lookups
        return found


@pytest.fixture
def channel() -> str:
    return f"webhook:owners:changed:test:{uuid.uuid4().hex}"


@pytest.fixture
async def sides(
    pg_pool: Pool, redis_url: str, channel: str
) -> AsyncIterator[Callable[..., Awaitable[Side]]]:
    made: list[Side] = []

    async def make(on_channel: str = channel) -> Side:
        connections = open_connections(redis_url)
        ticks = Ticks()
        cache = WatchedCache(ticks)
        changes = RedisOwnerChanges(connections.commands, on_channel)
        database = CountingAccounts(pg_pool)
        accounts = CachedTradingAccounts(database, changes, cache)
        side = Side(
            connections,
            changes,
            cache,
            ticks,
            database,
            accounts,
            AnnouncingUsers(PostgresUserRepository(pg_pool), accounts.announcer),
            AnnouncingAllowedIps(PostgresAllowedIpRepository(pg_pool), accounts.announcer),
        )
        made.append(side)
        return side

    yield make
    for side in made:
        await side.accounts.aclose()
        await side.connections.aclose()


def new_user() -> User:
    return User("user-1", "t1@example.com", "hash", Plan.PRO, T0)


def new_account() -> TradingAccount:
    return TradingAccount(
        id="acct-1",
        user_id="user-1",
        name="Account 1",
        broker_name="paper",
        webhook_token_hash=TOKEN,
        webhook_secret_hash="secret",
        created_at=T0,
    )


@pytest.fixture
async def stored(pg_pool: Pool) -> None:
    await PostgresUserRepository(pg_pool).add(new_user())
    await PostgresTradingAccountRepository(pg_pool).add(new_account())
    await PostgresAllowedIpRepository(pg_pool).add(AllowedIp("ip-1", "user-1", "198.51.100.7", T0))


async def revoke_token(side: Side) -> None:
    old = await side.accounts.get("acct-1")
    assert old is not None
    assert await side.accounts.save(attrs.evolve(old, webhook_token_hash="b" * 64), previous=old)


async def delete_account(side: Side) -> None:
    old = await side.accounts.get("acct-1")
    assert old is not None
    assert await side.accounts.save(attrs.evolve(old, deleted=True), previous=old)


async def disable_user(side: Side) -> None:
    old = await side.users.get("user-1")
    assert old is not None
    assert await side.users.save(attrs.evolve(old, disabled=True), previous=old)


async def remove_ip(side: Side) -> None:
    assert await side.allowed_ips.remove("ip-1", "user-1")


async def add_ip(side: Side) -> None:
    assert await side.allowed_ips.add(AllowedIp("ip-2", "user-1", "192.0.2.0/24", T1))


T1 = datetime(2026, 1, 6, tzinfo=UTC)

CHANGES: dict[str, tuple[Callable[[Side], Awaitable[None]], Callable[[Any], bool]]] = {
    "token revoked": (revoke_token, lambda found: found is None),
    "account deleted": (delete_account, lambda found: found is None),
    "user disabled": (disable_user, lambda found: found is not None and found.user.disabled),
    "allowed ip removed": (remove_ip, lambda found: found is not None and not found.allowed_ips),
    "allowed ip added": (
        add_ip,
        lambda found: found is not None and found.allowed_ips == ("198.51.100.7", "192.0.2.0/24"),
    ),
}


def unchanged(found: WebhookOwner | None) -> bool:
    return (
        found is not None
        and found.account == new_account()
        and found.user == new_user()
        and found.allowed_ips == ("198.51.100.7",)
    )


def test_the_redis_announcements_fit_their_port() -> None:
    assert isinstance(RedisOwnerChanges(object()), OwnerChanges)  # type: ignore[arg-type]


@pytest.mark.usefixtures("stored")
@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
async def test_a_change_on_one_process_is_seen_by_the_others_next_lookup(
    sides: Callable[..., Awaitable[Side]], change: str
) -> None:
    write, seen = CHANGES[change]
    one, other = await sides(), await sides()
    assert unchanged(await other.warm())

    await write(one)
    await other.cache.hear(lambda: other.cache.changes > 0)

    lookups = other.database.lookups
    assert seen(await other.lookup())
    assert other.database.lookups == lookups + 1  # a miss: Postgres read again


@pytest.mark.usefixtures("stored")
async def test_without_the_announcement_the_entry_lasts_the_ttl_and_no_longer(
    sides: Callable[..., Awaitable[Side]],
) -> None:
    one = await sides(on_channel="webhook:owners:changed:test:nobody-listens")
    other = await sides()
    assert unchanged(await other.warm())

    await delete_account(one)

    other.ticks.now += TTL_S - 0.001
    assert unchanged(await other.lookup())  # within the bound the entry may still be served
    other.ticks.now += 0.001
    assert await other.lookup() is None
    assert other.cache.changes == 0  # nothing was heard: the TTL alone ended it


@pytest.mark.usefixtures("stored")
async def test_a_lookup_reading_while_the_change_is_announced_stores_nothing(
    sides: Callable[..., Awaitable[Side]],
) -> None:
    one, other = await sides(), await sides()
    await other.warm()
    other.cache.changed("user-1")  # empty it, so the next lookup reads Postgres
    changes = other.cache.changes
    other.database.read.clear()
    other.database.gate = asyncio.Event()
    in_flight = asyncio.create_task(other.lookup())
    await other.database.read.wait()  # it read the live account

    await delete_account(one)
    await other.cache.hear(lambda: other.cache.changes > changes)
    other.database.gate.set()

    assert unchanged(await in_flight)  # begun before the change
    assert len(other.cache) == 0  # ... but not kept
    other.database.gate = None
    assert await other.lookup() is None


@pytest.mark.usefixtures("stored")
async def test_a_lost_subscription_drops_everything_until_redis_confirms_again(
    sides: Callable[..., Awaitable[Side]],
) -> None:
    other = await sides()
    assert unchanged(await other.warm())
    confirmations = other.cache.confirmations
    client = other.connections.commands
    for listener in await pubsub_listeners(client):
        await client.execute_command("CLIENT", "KILL", "ID", listener)

    await other.cache.hear(lambda: other.cache.confirmations > confirmations)

    assert len(other.cache) == 0  # what was kept before the gap is gone
    lookups = other.database.lookups
    assert unchanged(await other.lookup())
    assert other.database.lookups == lookups + 1


@pytest.mark.usefixtures("stored")
async def test_a_closed_subscription_serves_nothing(
    sides: Callable[..., Awaitable[Side]],
) -> None:
    other = await sides()
    await other.warm()
    await other.accounts.aclose()
    lookups = other.database.lookups
    assert unchanged(await other.lookup())
    assert other.database.lookups == lookups + 1
    assert len(other.cache) == 0


async def test_an_announcement_reaches_a_listener_on_a_redis_cluster(
    request: pytest.FixtureRequest, channel: str
) -> None:
    """On a cluster the listener holds one node's connection; a PUBLISH sent through another
    client (to whichever node it picks) reaches it all the same."""
    url = request.getfixturevalue("redis_cluster").url
    publisher, subscriber = open_connections(url), open_connections(url)
    cache = WatchedCache(Ticks())
    listening = RedisOwnerChanges(subscriber.commands, channel)
    try:
        listening.subscribe(cache)
        await cache.hear(lambda: cache.live)
        for n in range(3):
            await RedisOwnerChanges(publisher.commands, channel).publish(f"user-{n}")
        await cache.hear(lambda: cache.changes == 3)
    finally:
        await listening.aclose()
        await publisher.aclose()
        await subscriber.aclose()
    assert not cache.live
