"""What only a Redis Cluster shows: one user's keys share a slot, the shared queues spread
over the nodes, a wake-up published in one node's slot reaches a listener on another, and
the cluster URL. (Every ``kv`` contract test also runs on the cluster.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis_cluster import ThreeMasterCluster
from redis_fixtures import fill_task, flush, order_request, order_result

from tradecore.errors import KeyValueStoreUnavailable
from tradecore_adapters.redis import (
    RedisConnections,
    RedisFillTaskQueue,
    RedisOrderQueue,
    RedisWorkerDirectory,
    Wakeups,
    open_connections,
)
from tradecore_adapters.redis.client import cluster_nodes, is_cluster_url
from tradecore_adapters.redis.keys import DEFAULT_SHARDS, shard_tag
from tradecore_adapters.redis.messaging import (
    control_keys,
    fence_key,
    mark_key,
    processing_key,
    requests_key,
    response_key,
)

USERS = ["u1", "0b6f6d1e-6a55-4c3a-9a53-8a1f0d3c2b7e", "user:with:colons", "ü-ñ"]


def _per_user_keys(user_id: str) -> list[str]:
    return [
        mark_key(user_id),
        fence_key(user_id),
        requests_key(user_id),
        processing_key(user_id),
        response_key(user_id, "r-1"),
    ]


@pytest.mark.parametrize("user_id", USERS)
def test_the_keys_of_one_user_share_one_slot(user_id: str) -> None:
    slots = {key_slot(key.encode()) for key in _per_user_keys(user_id)}
    assert slots == {key_slot(("{" + user_id + "}").encode())}


def test_the_shards_of_the_shared_queues_spread_over_many_slots() -> None:
    control = [control_keys(n) for n in range(DEFAULT_SHARDS)]
    fifo = [f"order-tasks.fifo:{shard_tag(n)}" for n in range(DEFAULT_SHARDS)]
    assert len({key_slot(base.encode()) for base, _ in control}) == DEFAULT_SHARDS
    assert len({key_slot(prefix.encode()) for prefix in fifo}) == DEFAULT_SHARDS
    for base, pending in control:
        assert key_slot(base.encode()) == key_slot(pending.encode())


def test_a_cluster_url_names_its_nodes_credentials_and_tls() -> None:
    assert is_cluster_url("redis+cluster://a:1") and is_cluster_url("REDISS+CLUSTER://a:1")
    assert not is_cluster_url("redis://a:1/0")
    assert cluster_nodes("rediss+cluster://app:s%40cret@h1:7000,h2:7001,[::1]:7002/0") == (
        [("h1", 7000), ("h2", 7001), ("::1", 7002)],
        "app",
        "s@cret",
        True,
    )
    assert cluster_nodes("redis+cluster://h1:7000") == ([("h1", 7000)], None, None, False)
    for bad in ("redis+cluster://h1", "redis+cluster://h1:7000/3", "redis+cluster://h1:x"):
        with pytest.raises(ValueError, match=r"host:port|only database 0"):
            cluster_nodes(bad)


@pytest.fixture
async def cluster(redis_cluster: ThreeMasterCluster) -> AsyncIterator[RedisConnections]:
    connections = open_connections(redis_cluster.url)
    await flush(connections)
    yield connections
    await connections.aclose()


@pytest.mark.redis
async def test_the_shards_land_on_every_node(cluster: RedisConnections) -> None:
    client = cluster.commands
    assert isinstance(client, RedisCluster)
    await client.initialize()
    nodes = {
        client.get_node_from_key(f"order-tasks.fifo:{shard_tag(n)}").name
        for n in range(DEFAULT_SHARDS)
    }
    assert len(nodes) == len(client.get_primaries()) == 3


@pytest.mark.redis
async def test_one_users_keys_are_on_one_node_and_many_users_on_every_node(
    cluster: RedisConnections,
) -> None:
    """The server's own CLUSTER KEYSLOT agrees: every key a user's scripts touch is in the
    user's slot, and users spread over the three masters."""
    queue = RedisOrderQueue(cluster)
    directory = RedisWorkerDirectory(cluster)
    client = cluster.commands
    assert isinstance(client, RedisCluster)
    try:
        users = [f"user-{n}" for n in range(24)]
        for user in users:
            assert await directory.acquire(user, "h1", 30) is not None
            assert await queue.push(order_request(f"r-{user}", user))
            taken = await queue.take(user, 0)
            assert taken is not None
            await queue.complete(taken, order_result(taken))
        for user in users[:4]:
            slots = {int(await client.cluster_keyslot(key)) for key in _per_user_keys(user)}
            assert len(slots) == 1
        homes = {client.get_node_from_key(mark_key(user)).name for user in users}
        assert len(homes) == 3
        assert {lease.user_id for lease in await directory.leases()} == set(users)
    finally:
        await queue.aclose()
        await directory.aclose()


@pytest.mark.redis
async def test_a_scripts_publish_reaches_a_listener_on_every_node(
    cluster: RedisConnections,
) -> None:
    """PUBLISH inside a script runs on the node of the script's key; classic pub/sub carries
    it to the subscribers of every node, so one listener hears the pushes of all slots."""
    client = cluster.commands
    assert isinstance(client, RedisCluster)
    await client.initialize()
    wakeups = Wakeups(client, "test:wakeups")
    script = client.register_script(
        "redis.call('SET', KEYS[1], 1) redis.call('PUBLISH', ARGV[1], ARGV[2]) return 1"
    )
    users = {client.get_node_from_key(mark_key(f"user-{n}")).name: f"user-{n}" for n in range(24)}
    assert len(users) == 3
    events = {user: wakeups.watch(user) for user in users.values()}
    try:
        for _ in range(300):  # until the subscription is confirmed (it wakes every watcher)
            if all(e.is_set() for e in events.values()):
                break
            await asyncio.sleep(0.01)
        for event in events.values():
            event.clear()
        for user in users.values():
            await script(keys=[mark_key(user)], args=[wakeups.channel, user])
        async with asyncio.timeout(10):
            for event in events.values():
                await event.wait()
    finally:
        await wakeups.aclose()


@pytest.mark.redis
async def test_start_requests_and_fill_checks_of_users_on_every_shard_are_served(
    cluster: RedisConnections,
) -> None:
    directory = RedisWorkerDirectory(cluster)
    tasks = RedisFillTaskQueue(cluster.commands)
    users = [f"user-{n}" for n in range(40)]
    try:
        waiter = asyncio.create_task(directory.next_start_request(10))
        await asyncio.sleep(0.05)
        await directory.request_start(users[0])
        assert await waiter == users[0]  # woken, not polled: a 10 s wait returns
        for user in users:
            await directory.request_start(user)
            await tasks.send(fill_task(f"o-{user}", user), 0)
        started = [await directory.next_start_request(0) for _ in users]
        assert sorted(u for u in started if u is not None) == sorted(users)
        assert await directory.next_start_request(0) is None
        assert await tasks.pending_count() == len(users)
        received = []
        while (delivery := await tasks.receive(0)) is not None:
            received.append(delivery.task.user_id)
            await tasks.dead_letter(delivery, "test")
        assert sorted(received) == sorted(users)
        assert sorted(t.user_id for t, _ in await tasks.dead_letters()) == sorted(users)
        assert await tasks.pending_count() == 0
    finally:
        await directory.aclose()
        await tasks.aclose()


async def test_an_unreachable_cluster_raises_key_value_store_unavailable() -> None:
    connections = open_connections(
        "redis+cluster://127.0.0.1:1", socket_timeout_s=0.5, connect_timeout_s=0.5
    )
    try:
        with pytest.raises(KeyValueStoreUnavailable):
            await connections.check()
        with pytest.raises(KeyValueStoreUnavailable):
            await RedisOrderQueue(connections).push(order_request("r1"))
    finally:
        await connections.aclose()
