"""The webhook owner cache of one API process, and its repository wrappers, over the memory
repositories and in-process announcements (two caches stand for two API processes).

The stated bound (docs/security.md, "Webhook owner cache"): an entry is served for at most the
TTL after its lookup began; an announced change drops the user's entries in every process;
a lookup in flight when the change is announced does not store its answer; while the
announcements may be missed the cache serves nothing.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest

from tradecore.accounts import TradingAccount
from tradecore.errors import KeyValueStoreUnavailable
from tradecore.identity import AllowedIp, Plan, User
from tradecore.ports.owner_changes import OwnerChangeListener, OwnerChanges
from tradecore.ports.repositories import (
    AllowedIpRepository,
    TradingAccountRepository,
    UserRepository,
    WebhookOwner,
)
from tradecore_adapters.memory.owner_changes import MemoryOwnerChanges
from tradecore_adapters.memory.repositories import (
    MemoryAllowedIpRepository,
    MemoryOrderHistory,
    MemoryTradingAccountRepository,
    MemoryUserRepository,
)
from tradecore_adapters.owner_cache import (
    AnnouncingAllowedIps,
    AnnouncingUsers,
    CachedTradingAccounts,
    WebhookOwnerCache,
)
from tradecore_adapters.owner_cache import cache as cache_module

T0 = datetime(2026, 1, 5, tzinfo=UTC)
TTL_S = 5.0


@attrs.define
class Ticks:
    """A monotonic clock that moves only when told to."""

    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def user(n: int = 1, **changes: Any) -> User:
    base = User(f"user-{n}", f"t{n}@example.com", "hash", Plan.PRO, T0)
    return attrs.evolve(base, **changes)


def account(n: int = 1, user_n: int = 1, **changes: Any) -> TradingAccount:
    base = TradingAccount(
        id=f"acct-{n}",
        user_id=f"user-{user_n}",
        name=f"Account {n}",
        broker_name="paper",
        webhook_token_hash=f"{n:064x}",
        webhook_secret_hash="secret",
        created_at=T0,
    )
    return attrs.evolve(base, **changes)


def owner(n: int = 1, user_n: int = 1) -> WebhookOwner:
    return WebhookOwner(account(n, user_n), user(user_n), ())


def live_cache(ticks: Ticks, max_entries: int = 100) -> WebhookOwnerCache:
    cache = WebhookOwnerCache(max_entries, TTL_S, monotonic=ticks)
    cache.resubscribed()
    return cache


# --- the cache alone -------------------------------------------------------------------------


def test_a_stored_owner_is_served_until_its_ttl_from_when_its_lookup_began() -> None:
    ticks = Ticks()
    cache = live_cache(ticks)
    ticket = cache.ticket()
    ticks.now += 1.0  # the database read took a second
    assert cache.put("t1", owner(1), ticket)

    ticks.now += TTL_S - 1.0 - 0.001
    assert cache.get("t1") == owner(1)
    ticks.now += 0.001
    assert cache.get("t1") is None
    assert len(cache) == 0


def test_a_clock_that_went_back_expires_the_entry() -> None:
    ticks = Ticks()
    cache = live_cache(ticks)
    cache.put("t1", owner(1), cache.ticket())
    ticks.now -= 0.5
    assert cache.get("t1") is None


def test_least_recently_used_entries_go_first_beyond_the_bound() -> None:
    ticks = Ticks()
    cache = live_cache(ticks, max_entries=2)
    for n in (1, 2):
        cache.put(f"t{n}", owner(n, n), cache.ticket())
    assert cache.get("t1") is not None  # t2 is now the least recently used
    cache.put("t3", owner(3, 3), cache.ticket())
    assert len(cache) == 2
    assert cache.get("t2") is None
    assert cache.get("t1") is not None and cache.get("t3") is not None


def test_a_change_drops_every_entry_of_that_user_and_only_them() -> None:
    ticks = Ticks()
    cache = live_cache(ticks)
    cache.put("t1", owner(1, user_n=1), cache.ticket())
    cache.put("t2", owner(2, user_n=1), cache.ticket())
    cache.put("t3", owner(3, user_n=2), cache.ticket())
    cache.changed("user-1")
    assert (cache.get("t1"), cache.get("t2")) == (None, None)
    assert cache.get("t3") == owner(3, user_n=2)


def test_a_lookup_that_began_before_a_change_of_its_user_stores_nothing() -> None:
    cache = live_cache(Ticks())
    before = cache.ticket()
    cache.changed("user-1")
    assert not cache.put("t1", owner(1, user_n=1), before)
    assert cache.get("t1") is None
    # another user's fill of the same moment is unaffected, and a lookup begun after is kept
    assert cache.put("t2", owner(2, user_n=2), before)
    assert cache.put("t1", owner(1, user_n=1), cache.ticket())


def test_changes_of_more_users_than_tracked_still_refuse_older_fills(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cache_module, "TRACKED_DROPS", 2)
    cache = live_cache(Ticks())
    before = cache.ticket()
    for n in (1, 2, 3):  # user-1's drop is forgotten, summed up by the floor
        cache.changed(f"user-{n}")
    assert not cache.put("t1", owner(1, user_n=1), before)
    assert not cache.put("t9", owner(9, user_n=9), before)  # refused too: only ever safe
    assert cache.put("t9", owner(9, user_n=9), cache.ticket())


def test_nothing_is_served_or_kept_before_the_subscription_or_after_losing_it() -> None:
    ticks = Ticks()
    cache = WebhookOwnerCache(100, TTL_S, monotonic=ticks)
    assert not cache.put("t1", owner(1), cache.ticket())
    cache.resubscribed()
    assert cache.put("t1", owner(1), cache.ticket())
    in_flight = cache.ticket()

    cache.interrupted()
    assert cache.get("t1") is None and len(cache) == 0
    assert not cache.put("t1", owner(1), cache.ticket())

    cache.resubscribed()  # announcements of the gap were missed: a read begun then is stale
    assert not cache.put("t1", owner(1), in_flight)
    assert cache.put("t1", owner(1), cache.ticket())


def test_a_resubscription_drops_what_was_kept() -> None:
    cache = live_cache(Ticks())
    cache.put("t1", owner(1), cache.ticket())
    cache.resubscribed()
    assert cache.get("t1") is None


def test_no_room_means_no_cache() -> None:
    cache = WebhookOwnerCache(0, TTL_S)
    cache.resubscribed()
    assert not cache.enabled
    assert not cache.put("t1", owner(1), cache.ticket())


@pytest.mark.parametrize(("size", "ttl_s"), [(-1, 5.0), (10, 0.0), (10, -1.0)])
def test_a_bad_bound_is_refused(size: int, ttl_s: float) -> None:
    with pytest.raises(ValueError, match="zero or more entries for a positive time"):
        WebhookOwnerCache(size, ttl_s)


def test_the_memory_announcements_and_the_cache_fit_their_ports() -> None:
    assert isinstance(MemoryOwnerChanges(), OwnerChanges)
    assert isinstance(WebhookOwnerCache(), OwnerChangeListener)


# --- the wrappers: two API processes over one store -------------------------------------------


class CountingAccounts:
    """The memory accounts, counting the lookups that reach them; ``gate``, when set, holds
    each lookup after it read until the gate opens (a slow database read)."""

    def __init__(self, inner: MemoryTradingAccountRepository) -> None:
        self._inner = inner
        self.lookups = 0
        self.gate: asyncio.Event | None = None
        self.read = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def webhook_owner(self, token_hash: str) -> WebhookOwner | None:
        self.lookups += 1
        found = await self._inner.webhook_owner(token_hash)
        self.read.set()
        if self.gate is not None:
            await self.gate.wait()
        return found


@attrs.define
class Process:
    """One API process's view: its cache and wrappers over the shared memory store."""

    accounts: CachedTradingAccounts
    users: UserRepository
    allowed_ips: AllowedIpRepository
    database: CountingAccounts
    ticks: Ticks


@attrs.define
class World:
    users: MemoryUserRepository
    allowed_ips: MemoryAllowedIpRepository
    accounts: MemoryTradingAccountRepository
    changes: OwnerChanges

    def process(self, changes: OwnerChanges | None = None, max_entries: int = 100) -> Process:
        ticks = Ticks()
        database = CountingAccounts(self.accounts)
        wrapped = CachedTradingAccounts(
            database,  # type: ignore[arg-type]
            changes or self.changes,
            WebhookOwnerCache(max_entries, TTL_S, monotonic=ticks),
        )
        return Process(
            wrapped,
            AnnouncingUsers(self.users, wrapped.announcer),
            AnnouncingAllowedIps(self.allowed_ips, wrapped.announcer),
            database,
            ticks,
        )


@pytest.fixture
async def world() -> World:
    users = MemoryUserRepository()
    allowed_ips = MemoryAllowedIpRepository()
    accounts = MemoryTradingAccountRepository(users, allowed_ips, MemoryOrderHistory())
    await users.add(user(1))
    await accounts.add(account(1))
    return World(users, allowed_ips, accounts, MemoryOwnerChanges())


async def warm(process: Process, token_hash: str = f"{1:064x}") -> WebhookOwner | None:
    """Look the token up twice: the second answer comes from the cache."""
    found = await process.accounts.webhook_owner(token_hash)
    lookups = process.database.lookups
    assert await process.accounts.webhook_owner(token_hash) == found
    assert process.database.lookups == lookups
    return found


def test_the_wrappers_fit_their_ports(world: World) -> None:
    process = world.process()
    assert isinstance(process.accounts, TradingAccountRepository)
    assert isinstance(process.users, UserRepository)
    assert isinstance(process.allowed_ips, AllowedIpRepository)


async def test_a_hit_reads_no_database(world: World) -> None:
    process = world.process()
    assert await warm(process) == owner(1)
    assert process.database.lookups == 1


async def test_an_unknown_token_is_not_cached(world: World) -> None:
    process = world.process()
    for _ in range(3):
        assert await process.accounts.webhook_owner("f" * 64) is None
    assert process.database.lookups == 3
    assert len(process.accounts.cache) == 0


async def test_a_cache_of_size_zero_reads_every_time(world: World) -> None:
    process = world.process(max_entries=0)
    for _ in range(2):
        assert await process.accounts.webhook_owner(f"{1:064x}") == owner(1)
    assert process.database.lookups == 2


async def _rotate_token(p: Process) -> None:
    old = await p.accounts.get("acct-1")
    assert old is not None
    await p.accounts.save(attrs.evolve(old, webhook_token_hash="e" * 64), previous=old)


async def _delete_account(p: Process) -> None:
    old = await p.accounts.get("acct-1")
    assert old is not None
    await p.accounts.save(attrs.evolve(old, deleted=True), previous=old)


async def _disable_user(p: Process) -> None:
    old = await p.users.get("user-1")
    assert old is not None
    await p.users.save(attrs.evolve(old, disabled=True), previous=old)


async def _add_allowed_ip(p: Process) -> None:
    await p.allowed_ips.add(AllowedIp("ip-1", "user-1", "198.51.100.7", T0))


async def _change_credentials(p: Process) -> None:
    old = await p.accounts.get("acct-1")
    assert old is not None
    new = attrs.evolve(old, encrypted_credentials=b"sealed", credentials_verified=True)
    await p.accounts.save(new, previous=old)


def _unchanged(found: WebhookOwner | None) -> bool:
    return found == owner(1)


CHANGES = {
    "token rotated": (_rotate_token, lambda found: found is None),
    "account deleted": (_delete_account, lambda found: found is None),
    "user disabled": (_disable_user, lambda found: found is not None and found.user.disabled),
    "allowed ip added": (_add_allowed_ip, lambda f: f is not None and f.allowed_ips != ()),
    "credentials changed": (
        _change_credentials,
        lambda f: f is not None and f.account.encrypted_credentials == b"sealed",
    ),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
async def test_a_change_through_one_process_is_seen_by_the_other_at_once(
    world: World, change: str
) -> None:
    write, seen = CHANGES[change]
    one, other = world.process(), world.process()
    assert _unchanged(await warm(one)) and _unchanged(await warm(other))

    await write(one)

    for process in (one, other):
        lookups = process.database.lookups
        assert seen(await process.accounts.webhook_owner(f"{1:064x}"))
        assert process.database.lookups == lookups + 1  # a miss: read again


async def test_removing_an_allowed_ip_is_seen_everywhere(world: World) -> None:
    await world.allowed_ips.add(AllowedIp("ip-1", "user-1", "198.51.100.7", T0))
    one, other = world.process(), world.process()
    found = await warm(other)
    assert found is not None and found.allowed_ips == ("198.51.100.7",)

    assert await one.allowed_ips.remove("ip-1", "user-1")

    found = await other.accounts.webhook_owner(f"{1:064x}")
    assert found is not None and found.allowed_ips == ()


async def test_a_new_account_is_announced(world: World) -> None:
    changes = MemoryOwnerChanges()
    process = world.process(changes)
    await process.accounts.add(account(2))
    assert changes.published == ["user-1"]


async def test_a_refused_write_is_announced_all_the_same(world: World) -> None:
    changes = MemoryOwnerChanges()
    process = world.process(changes)
    stale = account(1, name="not what is stored")
    deleted = attrs.evolve(stale, deleted=True)
    assert await process.accounts.save(deleted, previous=stale, guard=("name",)) is None
    assert not await process.allowed_ips.remove("no-such-entry", "user-1")
    assert changes.published == ["user-1", "user-1"]


async def test_without_the_announcement_a_change_is_seen_after_the_ttl(world: World) -> None:
    one = world.process(MemoryOwnerChanges())  # announces where the other does not listen
    other = world.process()
    assert _unchanged(await warm(other))

    await _delete_account(one)

    assert _unchanged(await other.accounts.webhook_owner(f"{1:064x}"))  # stale, within bound
    other.ticks.now += TTL_S
    assert await other.accounts.webhook_owner(f"{1:064x}") is None


async def test_a_lookup_in_flight_during_a_change_stores_nothing(world: World) -> None:
    one, other = world.process(), world.process()
    other.database.gate = asyncio.Event()
    in_flight = asyncio.create_task(other.accounts.webhook_owner(f"{1:064x}"))
    await other.database.read.wait()  # it read the account before the change

    await _delete_account(one)
    other.database.gate.set()

    assert _unchanged(await in_flight)  # begun before the change: its answer is the old one
    assert len(other.accounts.cache) == 0
    other.database.gate = None
    assert await other.accounts.webhook_owner(f"{1:064x}") is None


class DownChanges(MemoryOwnerChanges):
    async def publish(self, user_id: str) -> None:
        raise KeyValueStoreUnavailable("redis publish: down")


async def test_an_unsent_announcement_is_logged_and_the_write_stands(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    process = world.process(DownChanges())
    assert _unchanged(await warm(process))
    caplog.set_level(logging.WARNING)

    await _delete_account(process)

    assert "not announced" in caplog.text
    stored = world.accounts._accounts["acct-1"]
    assert stored.deleted
    assert await process.accounts.webhook_owner(f"{1:064x}") is None  # dropped here at once
