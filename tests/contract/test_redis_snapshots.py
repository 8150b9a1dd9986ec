"""The shared snapshot (``redis/snapshots.py``): a document stored by one process is what the
others load until its time to live runs out, on one server and on a cluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis_cluster import ThreeMasterCluster
from redis_fixtures import flush

from tradecore_adapters.redis import RedisConnections, open_connections
from tradecore_adapters.redis.snapshots import RedisSnapshot

pytestmark = pytest.mark.redis

KEY = "metrics:queue-counts"
DOCUMENT = {"requests_waiting": 3, "held_by": {"host-a": 2, "host-b:7:x": 1}, "note": "€"}


@pytest.fixture(params=["redis", "cluster"])
async def connections(request: pytest.FixtureRequest) -> AsyncIterator[RedisConnections]:
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
    else:
        cluster: ThreeMasterCluster = request.getfixturevalue("redis_cluster")
        url = cluster.url
    opened = open_connections(url)
    await flush(opened)
    yield opened
    await opened.aclose()


async def test_a_stored_document_is_loaded_by_another_process_until_it_lapses(
    connections: RedisConnections,
) -> None:
    writer = RedisSnapshot(connections.commands, KEY)
    reader = RedisSnapshot(connections.commands, KEY)
    assert await reader.load() is None  # nothing stored yet

    await writer.store(DOCUMENT, 30.0)
    assert await reader.load() == DOCUMENT

    await writer.store(DOCUMENT, 0.05)
    for _ in range(200):  # 2 s at most: a generous bound for a 50 ms time to live
        if await reader.load() is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the document outlived its time to live")


async def test_a_store_replaces_the_document_and_its_time_to_live(
    connections: RedisConnections,
) -> None:
    snapshot = RedisSnapshot(connections.commands, KEY)
    await snapshot.store({"requests_waiting": 1}, 0.05)
    await snapshot.store(DOCUMENT, 30.0)

    await asyncio.sleep(0.15)

    assert await snapshot.load() == DOCUMENT
    assert 29_000 < int(await connections.commands.pttl(KEY)) <= 30_000
