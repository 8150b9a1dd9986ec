"""Commands packed by hiredis (``redis/packing.py``): the client's connections put the same
bytes on the wire as redis-py's own packer for every kind of argument the adapters send, and
values of every kind come back intact from a real server, singly and in a batch."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis import exceptions as rx
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from tradecore_adapters.redis import connect
from tradecore_adapters.redis.batching import RedisBatcher
from tradecore_adapters.redis.packing import hiredis_packing

pytestmark = pytest.mark.redis

ARGUMENTS = [
    ("SET", "plain", "value"),
    ("SET", "non-ascii", "prix 1.5 €, ordre n°7 — 買い"),
    ("SET", b"raw-bytes", b"\x00\xff\r\n*3\r\n"),
    ("SET", "int", 42),
    ("SET", "big-int", 10**20),
    ("SET", "negative", -7),
    ("SET", "float", 0.1),
    ("SET", "view", memoryview(b"from a view")),
    ("SET", "array", bytearray(b"from an array")),
    ("EVALSHA", "26b0725146f5deda41b4209904b5369f0016207d", 2, "k:{u}", "k2:{u}", "x" * 70_000),
    ("SCRIPT LOAD", "return 1"),
    ("CLIENT SETNAME", "worker"),
    (b"CONFIG GET", b"maxmemory"),
]


@pytest.mark.parametrize("args", ARGUMENTS, ids=lambda a: str(a[:2])[:40])
def test_the_bytes_on_the_wire_are_redis_pys_own(args: tuple[object, ...]) -> None:
    python_packed = b"".join(Connection().pack_command(*args))
    assert b"".join(hiredis_packing(Connection)().pack_command(*args)) == python_packed
    several = [args, ("GET", "plain"), args]
    assert b"".join(hiredis_packing(Connection)().pack_commands(several)) == b"".join(
        Connection().pack_commands(several)
    )


@pytest.mark.parametrize("bad", [None, True, object()])
def test_an_argument_redis_refuses_is_refused_before_sending(bad: object) -> None:
    with pytest.raises(rx.DataError):
        Connection().pack_command("SET", "k", bad)
    with pytest.raises(rx.DataError):
        hiredis_packing(Connection)().pack_command("SET", "k", bad)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    client = connect(redis_url, socket_timeout_s=5.0)
    try:
        yield client
    finally:
        await client.aclose()


async def test_the_clients_connections_pack_with_hiredis(client: Redis) -> None:
    assert client.connection_pool.connection_class is hiredis_packing(Connection)


async def test_values_of_every_kind_round_trip_singly_and_in_a_batch(client: Redis) -> None:
    prefix = f"packing:{uuid.uuid4().hex}:"
    values: dict[str, str | bytes | int | float] = {
        "text": "prix 1.5 €, ordre n°7 — 買い",
        "big": "x" * 70_000,
        "int": 10**20,
        "float": 0.1,
        "crlf": "a\r\nb",
    }
    for name, value in values.items():
        await client.set(prefix + name, value, ex=60)
    assert {n: await client.get(prefix + n) for n in values} == {
        n: str(v) for n, v in values.items()
    }
    batcher = RedisBatcher(client)
    keys = [prefix + n for n in values]
    replies = await asyncio.gather(  # issued together: one pipeline (pack_commands)
        batcher.command("MGET", *keys), batcher.command("GET", prefix + "big")
    )
    assert replies == [[str(v) for v in values.values()], "x" * 70_000]
    await client.delete(*keys)
