"""What only the Redis adapters have: the payload codec, the key layout, failure translation,
cancelled blocking calls and the wake-up listener's reconnection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import attrs
import cattrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis import exceptions as rx
from redis.asyncio import Redis
from redis_fixtures import fill_task, order_request, order_result, pubsub_listeners

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.limits import RATE_KEY_TTL_S
from tradecore.orders import (
    AlertAction,
    OrderError,
    OrderRequest,
    OrderResult,
    OrderStatus,
    OrderType,
    RejectionCode,
    Source,
)
from tradecore.ports.messaging import FillDelivery, FillTask
from tradecore_adapters.redis import (
    RedisAlertThrottle,
    RedisConnections,
    RedisFillTaskQueue,
    RedisOrderQueue,
    RedisRateLimiter,
    RedisReplayStore,
    RedisWorkerDirectory,
    codec,
    open_connections,
)
from tradecore_adapters.redis.keys import DEFAULT_SHARDS, shard_of
from tradecore_adapters.redis.messaging import fence_key, mark_key, processing_key, response_key

NOWHERE = "redis://127.0.0.1:1/9"  # nothing listens on port 1

# --- Codec -----------------------------------------------------------------------------------

texts = st.text(min_size=1, max_size=20)
decimals = st.decimals(allow_nan=False, places=None) | st.decimals(allow_nan=False, places=8)
moments = st.datetimes(
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone.min])
)
order_requests = st.builds(
    OrderRequest,
    request_id=texts,
    order_id=texts,
    user_id=texts,
    trading_account_id=texts,
    symbol=texts,
    action=st.sampled_from(AlertAction),
    order_type=st.sampled_from(OrderType),
    quantity=decimals,
    source=st.sampled_from(Source),
    simulation=st.booleans(),
    created_at=moments,
    expires_at=moments,
    broker_name=st.none() | texts,
)
order_errors = st.builds(
    OrderError,
    code=st.sampled_from(RejectionCode),
    message=st.text(max_size=40),
    retry_after=st.none() | st.floats(min_value=0, max_value=1e6),
)
order_results = st.builds(
    OrderResult,
    order_id=texts,
    request_id=texts,
    status=st.sampled_from(OrderStatus),
    symbol=texts,
    action=st.sampled_from(AlertAction),
    quantity=decimals,
    filled_quantity=decimals,
    fill_price=st.none() | decimals,
    auto_exit=st.booleans(),
    exit_quantity=decimals,
    position_before=decimals,
    simulation=st.booleans(),
    error=st.none() | order_errors,
    broker_refs=st.lists(texts, max_size=3).map(tuple),
)
fill_tasks = st.builds(FillTask, order_id=texts, user_id=texts, trading_account_id=texts)


@given(order_requests)
def test_an_order_request_survives_the_codec_exactly(request: OrderRequest) -> None:
    raw = codec.encode_request(request)
    decoded = codec.decode_request(raw)
    assert decoded == request
    assert str(decoded.quantity) == str(request.quantity)  # 1.50 stays 1.50
    assert decoded.created_at.tzinfo is UTC
    assert codec.encode_request(decoded) == raw  # the queue finds an entry by its text


def _standard_library_text(value: object) -> str:
    """What the codec wrote before it used orjson (the text of entries queued by then)."""
    unstructured = codec._converter.unstructure(value)
    return json.dumps(unstructured, separators=(",", ":"), ensure_ascii=False)


@given(order_requests, fill_tasks)
def test_requests_and_tasks_are_written_as_the_standard_library_wrote_them(
    request: OrderRequest, task: FillTask
) -> None:
    # an entry queued by an earlier version is found again by the text this one writes
    assert codec.encode_request(request) == _standard_library_text(request)
    assert codec.encode_task(task) == _standard_library_text(task)
    assert codec.decode_request(_standard_library_text(request)) == request


@given(order_results)
def test_a_result_written_by_either_encoder_reads_the_same(result: OrderResult) -> None:
    assert codec.decode_result(_standard_library_text(result)) == result
    assert json.loads(codec.encode_result(result)) == json.loads(_standard_library_text(result))


def test_a_request_queued_before_broker_name_decodes_and_re_encodes_to_its_text() -> None:
    raw = codec.encode_request(order_request("r1"))
    assert "broker_name" not in raw  # None is left out
    decoded = codec.decode_request(raw)
    assert decoded.broker_name is None
    assert codec.encode_request(decoded) == raw
    named = attrs.evolve(decoded, broker_name="paper")
    assert codec.decode_request(codec.encode_request(named)) == named


@given(order_results)
def test_an_order_result_survives_the_codec_exactly(result: OrderResult) -> None:
    raw = codec.encode_result(result)
    assert codec.decode_result(raw) == result
    assert codec.encode_result(codec.decode_result(raw)) == raw


@given(fill_tasks)
def test_a_fill_task_survives_the_codec_exactly(task: FillTask) -> None:
    assert codec.decode_task(codec.encode_task(task)) == task


def test_the_codec_writes_compact_json_with_decimal_strings_and_utc_times() -> None:
    raw = codec.encode_request(order_request("r1"))
    assert ", " not in raw and ": " not in raw
    assert '"quantity":"1.50"' in raw
    assert '"created_at":"2026-01-05T14:30:00+00:00"' in raw


def test_the_codec_refuses_naive_datetimes_and_numeric_decimals() -> None:
    naive = attrs.evolve(order_request("r1"), created_at=datetime(2026, 1, 5, 14, 30))
    with pytest.raises(ValueError, match="naive"):
        codec.encode_request(naive)
    raw = codec.encode_request(order_request("r1")).replace('"1.50"', "1.5")
    with pytest.raises(cattrs.ClassValidationError) as caught:
        codec.decode_request(raw)
    assert any("decimal" in str(e) for e in caught.value.exceptions)


# --- Key layout ------------------------------------------------------------------------------


@pytest.mark.redis
async def test_keys_are_named_as_the_specification_says(
    redis_connections: RedisConnections,
) -> None:
    client = redis_connections.commands
    queue = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    tasks = RedisFillTaskQueue(client)
    try:
        await RedisReplayStore(client).claim("u1", "abc", 600)
        await RedisRateLimiter(client).hit("u1", 60, 60)
        await RedisAlertThrottle(client).try_claim("u1", 3600)
        assert await directory.acquire("u1", "host-a:12:x", 30) == 1
        await directory.request_start("u2")
        for rid in ("r1", "r2"):
            await queue.push(order_request(rid))
        taken = await queue.take("u1", 0)
        assert taken is not None
        await queue.complete(taken, order_result(taken))
        await queue.take("u1", 0)
        await tasks.send(fill_task("o1"), 0)
        await tasks.dead_letter(await _received(tasks), "reason")
        keys = set(await client.keys("*"))
    finally:
        await queue.aclose()
        await directory.aclose()
    u1_shard = f"{{s{shard_of('u1', DEFAULT_SHARDS):02d}}}"
    u2_shard = f"{{s{shard_of('u2', DEFAULT_SHARDS):02d}}}"
    assert {
        "webhook:replay:{u1}:abc",
        "ratelimit:{u1}",
        "alert:throttle:u1",
        "worker:active:{u1}",
        "worker:fence:{u1}",
        f"worker-control.fifo:{u2_shard}",
        f"worker-control.fifo:{u2_shard}:pending",
        "trading:user:{u1}:processing",
        "trading:response:{u1}:r1",
        f"order-tasks.fifo:{u1_shard}:seq",
        f"order-tasks.fifo:{u1_shard}:dead",
        f"order-tasks.fifo:{u1_shard}:dedup:o1",
    } <= keys
    assert "trading:user:{u1}:requests" not in keys  # emptied lists vanish
    assert not any(
        k.startswith(("worker:", "trading:", "order-tasks")) and "{" not in k for k in keys
    )
    assert await client.type("ratelimit:{u1}") == "zset"
    assert await client.type("trading:response:{u1}:r1") == "list"
    assert await client.get("worker:active:{u1}") == "host-a:12:x:1"  # "{holder}:{token}"
    assert await client.get("worker:fence:{u1}") == "1"
    dedup = f"order-tasks.fifo:{u1_shard}:dedup:o1"
    assert 299_000 < await client.pttl(dedup) <= 300_000  # SQS's 5 min


@pytest.mark.redis
async def test_the_fencing_counter_outlives_every_lease(redis_client: Redis) -> None:
    directory = RedisWorkerDirectory(RedisConnections(redis_client, redis_client))
    token = await directory.acquire("u1", "h1", 0.05)
    assert token is not None
    assert await redis_client.pttl(fence_key("u1")) == -1  # no time to live
    await directory.release("u1", token)
    assert await redis_client.get(fence_key("u1")) == str(token)
    assert await directory.acquire("u1", "h1", 30) == token + 1


@pytest.mark.redis
async def test_a_mark_that_is_not_a_lease_is_nobodys_to_take_or_change(
    redis_client: Redis,
) -> None:
    """A mark without a token (as an older release wrote it) stays until its TTL ends."""
    directory = RedisWorkerDirectory(RedisConnections(redis_client, redis_client))
    await redis_client.set(mark_key("u1"), "1", px=30_000)
    assert await directory.is_active("u1")
    assert await directory.acquire("u1", "h1", 30) is None
    assert not await directory.renew("u1", 1, 60)
    await directory.release("u1", 1)
    assert not await directory.retire("u1", 1)
    assert await redis_client.get(mark_key("u1")) == "1"
    assert 29_000 < await redis_client.pttl(mark_key("u1")) <= 30_000


async def _received(tasks: RedisFillTaskQueue) -> FillDelivery:
    delivery = await tasks.receive(0)
    assert delivery is not None
    return delivery


@pytest.mark.redis
async def test_a_reachable_server_passes_the_readiness_check(
    redis_connections: RedisConnections,
) -> None:
    await redis_connections.check()


@pytest.mark.redis
async def test_the_rate_window_keeps_unique_members_and_a_65_s_ttl(redis_client: Redis) -> None:
    limiter = RedisRateLimiter(redis_client)
    await asyncio.gather(*(limiter.hit("u1", 60, 60) for _ in range(10)))
    assert await redis_client.zcard("ratelimit:{u1}") == 10
    pttl = await redis_client.pttl("ratelimit:{u1}")
    assert RATE_KEY_TTL_S * 1000 - 1000 < pttl <= RATE_KEY_TTL_S * 1000
    await limiter.hit("u2", 60, 120)  # a window longer than the TTL keeps its entries
    assert (await redis_client.pttl("ratelimit:{u2}")) > 120_000


@pytest.mark.redis
async def test_a_refused_hit_does_not_refresh_the_ttl(redis_client: Redis) -> None:
    limiter = RedisRateLimiter(redis_client)
    await limiter.hit("u1", 1, 60)
    await redis_client.pexpire("ratelimit:{u1}", 10_000)
    assert not (await limiter.hit("u1", 1, 60)).allowed
    assert await redis_client.pttl("ratelimit:{u1}") <= 10_000


# --- Failures --------------------------------------------------------------------------------


async def _unavailable(call: Callable[[], Awaitable[object]]) -> None:
    with pytest.raises(KeyValueStoreUnavailable) as caught:
        await call()
    assert isinstance(caught.value.__cause__, rx.ConnectionError)


async def test_an_unreachable_server_raises_key_value_store_unavailable() -> None:
    connections = open_connections(NOWHERE, socket_timeout_s=0.5, connect_timeout_s=0.5)
    client = connections.commands
    queue = RedisOrderQueue(connections)
    directory = RedisWorkerDirectory(connections)
    tasks = RedisFillTaskQueue(client)
    try:
        await _unavailable(connections.check)
        await _unavailable(lambda: RedisReplayStore(client).claim("u1", "fp", 600))
        await _unavailable(lambda: RedisReplayStore(client).release("u1", "fp"))
        await _unavailable(lambda: RedisAlertThrottle(client).try_claim("u1", 60))
        await _unavailable(lambda: queue.push(order_request("r1")))
        await _unavailable(lambda: queue.take("u1", 0))
        await _unavailable(lambda: queue.take("u1", 1.0))
        await _unavailable(lambda: queue.wait_result("r1", 1.0, user_id="u1"))
        await _unavailable(lambda: queue.in_flight("u1"))
        await _unavailable(lambda: directory.is_active("u1"))
        await _unavailable(lambda: directory.wait_active("u1", 1.0))
        await _unavailable(lambda: directory.request_start("u1"))
        await _unavailable(lambda: directory.next_start_request(1.0))
        await _unavailable(lambda: directory.acquire("u1", "h1", 30))
        await _unavailable(lambda: directory.renew("u1", 1, 30))
        await _unavailable(lambda: directory.release("u1", 1))
        await _unavailable(lambda: directory.retire("u1", 1))
        await _unavailable(lambda: tasks.send(fill_task("o1"), 0))
        await _unavailable(lambda: tasks.receive(1.0))
    finally:
        await queue.aclose()
        await connections.aclose()


async def test_the_rate_limiter_fails_open() -> None:
    connections = open_connections(NOWHERE, socket_timeout_s=0.5, connect_timeout_s=0.5)
    try:
        decision = await RedisRateLimiter(connections.commands).hit("u1", 60, 60)
    finally:
        await connections.aclose()
    assert (decision.allowed, decision.remaining, decision.retry_after_s) == (True, 59, None)


# --- Cancelled blocking calls ----------------------------------------------------------------


async def _no_blocked_clients(client: Redis) -> bool:
    """True once the server has no client of the test database blocked in a pop (it saw the
    cancelled call's connection close); checked for a bounded number of rounds. Clients of
    other databases are not counted: other processes may share the server."""
    db = int(client.connection_pool.connection_kwargs.get("db", 0))
    for _ in range(200):
        clients = await client.client_list()
        if not any("b" in c["flags"] and int(c["db"]) == db for c in clients):
            return True
        await asyncio.sleep(0.01)
    return False


@pytest.mark.redis
async def test_a_cancelled_wait_leaves_no_reader_behind(
    redis_connections: RedisConnections,
) -> None:
    queue = RedisOrderQueue(redis_connections)
    for rid in ("r1", "r2", "r3"):
        await queue.park(order_request(rid))  # handed over by this queue: it may wait
    waiter = asyncio.create_task(queue.wait_result("r1", 30))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await _no_blocked_clients(redis_connections.commands)
    # The reply that comes later is not swallowed by the cancelled pop, and the blocking
    # client still pairs every reply with its own call.
    for rid in ("r1", "r2", "r3"):
        request = order_request(rid)
        await queue.complete(request, order_result(request))
    results = await asyncio.gather(*(queue.wait_result(rid, 5) for rid in ("r3", "r1", "r2")))
    assert results == [order_result(order_request(rid)) for rid in ("r3", "r1", "r2")]
    await queue.aclose()


@pytest.mark.redis
async def test_a_cancelled_start_wait_loses_no_later_request(
    redis_connections: RedisConnections,
) -> None:
    directory = RedisWorkerDirectory(redis_connections)
    waiter = asyncio.create_task(directory.next_start_request(30))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await _no_blocked_clients(redis_connections.commands)
    await directory.request_start("u1")
    assert await directory.next_start_request(5) == "u1"
    await directory.aclose()


@pytest.mark.redis
async def test_a_cancelled_take_leaves_the_request_for_the_next_take(
    redis_connections: RedisConnections,
) -> None:
    queue = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    assert await directory.acquire("u1", "h1", 30) is not None
    taker = asyncio.create_task(queue.take("u1", 30))
    await asyncio.sleep(0.05)
    taker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taker
    assert await queue.push(order_request("r1"))
    assert await queue.take("u1", 5) == order_request("r1")
    assert await queue.in_flight("u1") == [order_request("r1")]
    await queue.aclose()


@pytest.mark.redis
async def test_a_sub_millisecond_wait_does_not_block_forever(
    redis_connections: RedisConnections,
) -> None:
    queue = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    await queue.park(order_request("r1"))
    assert await queue.wait_result("r1", 0.0004) is None
    assert await directory.next_start_request(0.0004) is None
    await queue.aclose()
    await directory.aclose()


@pytest.mark.redis
async def test_a_stale_in_flight_entry_is_recovered_after_a_crash(
    redis_connections: RedisConnections,
) -> None:
    """A new worker (a new adapter instance, as after a host restart) finds the entry."""
    first = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    assert await directory.acquire("u1", "h1", 30) is not None
    await first.push(order_request("r1"))
    assert await first.take("u1", 0) == order_request("r1")
    await first.aclose()
    second = RedisOrderQueue(redis_connections)
    stranded = await second.in_flight("u1")
    assert stranded == [order_request("r1")]
    await second.complete(stranded[0], order_result(stranded[0]))
    assert await second.in_flight("u1") == []
    await second.aclose()


@pytest.mark.redis
async def test_complete_is_one_script_that_also_clears_an_entry_queued_before_broker_name(
    redis_connections: RedisConnections,
) -> None:
    """An in-flight payload written before ``broker_name`` existed is found by its text, and
    the script survives a server that forgot it (a restart, SCRIPT FLUSH)."""
    client = redis_connections.commands
    queue = RedisOrderQueue(redis_connections)
    old = order_request("r1")
    legacy = codec.encode_request(old)
    assert "broker_name" not in legacy
    await client.rpush(processing_key("u1"), legacy)
    await client.rpush(response_key("u1", "r1"), "stale reply")
    await client.script_flush()

    (stranded,) = await queue.in_flight("u1")
    await queue.complete(stranded, order_result(stranded))

    assert await queue.in_flight("u1") == []
    assert await client.lrange(response_key("u1", "r1"), 0, -1) == [
        codec.encode_result(order_result(old))
    ]
    assert 0 < await client.pttl(response_key("u1", "r1")) <= 60_000
    await queue.aclose()


# --- Wake-ups --------------------------------------------------------------------------------


@pytest.mark.redis
async def test_take_is_woken_again_after_the_listener_reconnects(
    redis_connections: RedisConnections,
) -> None:
    client = redis_connections.commands
    queue = RedisOrderQueue(redis_connections)
    directory = RedisWorkerDirectory(redis_connections)
    assert await directory.acquire("u1", "h1", 30) is not None
    # listeners of other test runs on this database are not ours to count or kill
    others = set(await pubsub_listeners(client, rounds=1))
    # Below the take's own re-check interval: only a wake-up can deliver within it.
    first = asyncio.create_task(queue.take("u1", 3))
    (listener,) = await pubsub_listeners(client, exclude=others)
    assert await client.client_kill_filter(_id=listener) == 1
    assert await queue.push(order_request("r1"))
    assert await first == order_request("r1")
    assert len(await pubsub_listeners(client, exclude=others | {listener})) == 1
    second = asyncio.create_task(queue.take("u1", 3))
    await asyncio.sleep(0.01)
    assert await queue.push(order_request("r2"))
    assert await second == order_request("r2")
    await queue.aclose()


def test_decimals_keep_their_digits_and_exponent() -> None:
    for text in ["1E+2", "-0", "0.00000001", "1.500", "123456789012345678901234567890.5"]:
        quantity = Decimal(text)
        request = attrs.evolve(order_request("r1"), quantity=quantity)
        decoded = codec.decode_request(codec.encode_request(request)).quantity
        assert decoded.as_tuple() == quantity.as_tuple()


@pytest.mark.redis
async def test_a_waiting_receiver_takes_a_delayed_message_when_it_is_due(
    redis_connections: RedisConnections,
) -> None:
    tasks = RedisFillTaskQueue(redis_connections.commands)
    try:
        await tasks.send(fill_task("o1"), 0.2)
        delivery = await tasks.receive(5.0)  # one call: it sleeps until the timer, then looks
        assert delivery is not None and delivery.task == fill_task("o1")
        assert await tasks.receive(0) is None
    finally:
        await tasks.aclose()
