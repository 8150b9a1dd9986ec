"""The Redis batcher against a real server and a real cluster: calls issued during a round
trip share the next pipeline, in order; an error reply fails its caller only; a lost
connection fails the whole pipeline without sending it again; a cancelled caller leaves the
others' replies intact; scripts the server does not know are loaded and their calls sent
again. On a cluster each call goes alone and the same answers come back."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis import exceptions as rx
from redis.asyncio import Redis
from redis_cluster import ThreeMasterCluster
from redis_fixtures import flush

from tradecore.errors import KeyValueStoreUnavailable
from tradecore_adapters.redis import RedisConnections, connect, open_connections
from tradecore_adapters.redis.batching import KEEP_FROM, RedisBatcher, shared_batcher
from tradecore_adapters.redis.client import Client
from tradecore_adapters.redis.errors import unavailable_on_failure

pytestmark = pytest.mark.redis

_INCR = "return redis.call('INCR', KEYS[1])"
_FAIL = "return redis.error_reply('ERR refused on purpose')"


class Recorded(RedisBatcher):
    """A batcher that records each round trip's size and can hold one round trip: before it
    is written (``hold_before``) or after its replies were read (``hold_after``)."""

    def __init__(self, client: Client, **options: Any) -> None:
        super().__init__(client, **options)
        self.sizes: list[int] = []
        self.in_flight = asyncio.Event()
        self._before: asyncio.Event | None = None
        self._after: asyncio.Event | None = None

    def forget(self) -> None:
        """Forget the round trips so far."""
        self.sizes.clear()
        self.in_flight.clear()

    def hold_before(self) -> asyncio.Event:
        self._before = asyncio.Event()
        return self._before

    def hold_after(self) -> asyncio.Event:
        self._after = asyncio.Event()
        return self._after

    async def _send(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        self.sizes.append(len(commands))
        self.in_flight.set()
        if self._before is not None:
            gate, self._before = self._before, None
            await gate.wait()
        replies = await super()._send(commands)
        if self._after is not None:
            gate, self._after = self._after, None
            await gate.wait()
        return replies


def _unique(body: str) -> str:
    """``body`` as a script no server has cached yet (its SHA is new)."""
    return f"-- {uuid.uuid4().hex}\n{body}"


async def _started(n: int, call: Any) -> list[asyncio.Task[Any]]:
    """``n`` tasks each making ``call(i)``, run until each has issued its call."""
    tasks = [asyncio.create_task(call(i)) for i in range(n)]
    await asyncio.sleep(0)  # every task runs up to its wait for the reply
    return tasks


async def test_calls_issued_during_a_round_trip_share_the_next_pipeline_in_order(
    redis_client: Redis,
) -> None:
    batcher = Recorded(redis_client, max_batch=4)
    script = redis_client.register_script(_INCR)
    await batcher.script(script, ["warm"], [])  # cached from here on
    batcher.forget()
    held = batcher.hold_before()
    first = asyncio.create_task(batcher.script(script, ["n"], []))
    await batcher.in_flight.wait()  # the lone first call is on its way, held
    rest = await _started(10, lambda i: batcher.script(script, ["n"], []))
    held.set()

    replies = [await first] + [await t for t in rest]

    assert replies == list(range(1, 12))  # each caller its own reply, in the order issued
    # the first alone; the ten issued meanwhile in pipelines of at most four
    assert batcher.sizes == [1, 4, 4, 2]


async def test_concurrent_calls_cost_one_round_trip_once_the_script_is_cached(
    redis_client: Redis,
) -> None:
    batcher = Recorded(redis_client)
    script = redis_client.register_script(_INCR)
    await batcher.script(script, ["warm"], [])
    batcher.forget()

    replies = await asyncio.gather(*(batcher.script(script, ["n"], []) for _ in range(50)))

    assert replies == list(range(1, 51))
    assert batcher.sizes == [50]


async def test_a_batch_is_bounded_by_max_batch(redis_client: Redis) -> None:
    batcher = Recorded(redis_client, max_batch=8)

    replies = await asyncio.gather(*(batcher.command("INCR", "n") for _ in range(20)))

    assert replies == list(range(1, 21))
    assert batcher.sizes == [8, 8, 4]


async def test_an_error_reply_fails_its_caller_only(redis_client: Redis) -> None:
    batcher = Recorded(redis_client)
    good = redis_client.register_script(_INCR)
    bad = redis_client.register_script(_FAIL)
    await asyncio.gather(  # both scripts cached from here on
        batcher.script(good, ["warm"], []), batcher.script(bad, ["x"], []), return_exceptions=True
    )
    await redis_client.set("text", "not a list")
    batcher.forget()

    replies = await asyncio.gather(
        batcher.script(good, ["n"], []),
        batcher.script(bad, ["n"], []),
        batcher.command("LPOP", "text"),  # WRONGTYPE
        batcher.script(good, ["n"], []),
        return_exceptions=True,
    )

    assert batcher.sizes == [4]
    assert replies[0] == 1 and replies[3] == 2
    assert isinstance(replies[1], rx.ResponseError) and "refused on purpose" in str(replies[1])
    assert isinstance(replies[2], rx.ResponseError) and "WRONGTYPE" in str(replies[2])


async def test_unknown_scripts_are_loaded_and_their_calls_sent_again_once(
    redis_client: Redis,
) -> None:
    batcher = Recorded(redis_client)
    first = redis_client.register_script(_unique(_INCR))
    second = redis_client.register_script(_unique(_INCR))

    replies = await asyncio.gather(
        batcher.script(first, ["a"], []),
        batcher.command("INCR", "b"),
        batcher.script(second, ["a"], []),
        batcher.script(first, ["a"], []),
    )

    # the INCR of "b" ran in the first pipeline and was not sent again; the three script
    # calls, answered NOSCRIPT there, ran after the two loads, in their order
    assert replies == [1, 1, 2, 3]
    assert batcher.sizes == [4, 2 + 3]
    assert await redis_client.get("b") == "1"


async def _one_pipeline(batcher: Recorded, *commands: tuple[Any, ...]) -> list[object]:
    """The outcomes of ``commands`` issued together, which go as one pipeline, each failure
    translated as the adapters translate it (``unavailable_on_failure``)."""

    async def call(command: tuple[Any, ...]) -> object:
        with unavailable_on_failure("test call"):
            return await batcher.command(*command)

    outcomes = await asyncio.gather(*(call(c) for c in commands), return_exceptions=True)
    assert batcher.sizes == [len(commands)]
    return outcomes


def _assert_all_unavailable(outcomes: list[object], cause: type[BaseException]) -> None:
    assert all(isinstance(o, KeyValueStoreUnavailable) for o in outcomes), outcomes
    assert all(isinstance(o.__cause__, cause) for o in outcomes)  # type: ignore[attr-defined]


async def test_a_lost_connection_fails_every_call_of_the_pipeline_and_sends_nothing_twice(
    redis_url: str,
) -> None:
    # One connection, so the batcher's pipeline runs on the connection it asks to be killed.
    client = connect(redis_url, socket_timeout_s=2.0, max_connections=1)
    try:
        batcher = Recorded(client)
        own_id = await batcher.command("CLIENT", "ID")
        batcher.forget()

        outcomes = await _one_pipeline(
            batcher,
            ("INCR", "ran"),
            ("CLIENT", "KILL", "ID", own_id, "SKIPME", "no"),  # the server closes the connection
            ("INCR", "never"),
        )

        _assert_all_unavailable(outcomes, rx.ConnectionError)
        # the first call ran once: the pipeline was not sent again after the failure
        assert await batcher.command("GET", "ran") == "1"
        assert await batcher.command("GET", "never") is None
    finally:
        await client.aclose()


async def test_replies_later_than_the_socket_timeout_fail_the_pipeline_and_its_connection(
    redis_url: str,
) -> None:
    # The replies of a round trip are read under one deadline, the socket timeout: a reply
    # that has not come by then fails every call of the pipeline, and the connection is
    # dropped, so its late reply is never read as the answer to a later call.
    client = connect(redis_url, socket_timeout_s=0.3, max_connections=KEEP_FROM)
    try:
        batcher = Recorded(client)
        await batcher.command("DEL", "ran", "empty")
        batcher.forget()

        outcomes = await _one_pipeline(
            batcher,
            ("INCR", "ran"),
            ("BLPOP", "empty", 2),  # the server answers after 2 s
            ("INCR", "ran"),
        )

        _assert_all_unavailable(outcomes, rx.TimeoutError)
        # answered on a new connection (on the old one the BLPOP's reply comes first), and
        # the call behind the BLPOP never ran
        assert await batcher.command("GET", "ran") == "1"
    finally:
        await client.aclose()


class ReplyCutter:
    """A TCP relay to the Redis server that, once ``cut_next_reply`` is set, closes the
    connection that the next reply would go back on instead of relaying it: the command ran,
    its caller sees a lost connection."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self.cut_next_reply = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)

        async def pipe(
            source: asyncio.StreamReader, sink: asyncio.StreamWriter, replies: bool
        ) -> None:
            while data := await source.read(65536):
                if replies and self.cut_next_reply:
                    self.cut_next_reply = False
                    break
                sink.write(data)
                await sink.drain()
            writer.close()
            up_writer.close()

        for task in (pipe(reader, up_writer, False), pipe(up_reader, writer, True)):
            self._tasks.add(asyncio.create_task(task))


async def test_a_lone_call_whose_reply_is_lost_is_not_sent_again(redis_url: str) -> None:
    # A call sent alone (nothing else in flight) follows the pipeline's rule: run twice, an
    # order's push would be a doubled order (the client's own retry would send it again).
    url = urlsplit(redis_url)
    cutter = ReplyCutter(url.hostname or "127.0.0.1", url.port or 6379)
    port = await cutter.start()
    client = connect(url._replace(netloc=f"127.0.0.1:{port}").geturl(), socket_timeout_s=2.0)
    try:
        batcher = Recorded(client)
        await batcher.command("DEL", "ran")
        batcher.forget()
        cutter.cut_next_reply = True

        with pytest.raises(KeyValueStoreUnavailable) as raised, unavailable_on_failure("call"):
            await batcher.command("INCR", "ran")

        assert batcher.sizes == [1]
        assert isinstance(raised.value.__cause__, rx.ConnectionError)
        assert await batcher.command("GET", "ran") == "1"  # it ran once, on a new connection
    finally:
        await client.aclose()
        await cutter.aclose()


async def test_the_batcher_keeps_a_connection_of_its_own_and_replaces_one_the_server_closed(
    redis_url: str, redis_client: Redis
) -> None:
    client = connect(redis_url, socket_timeout_s=2.0, max_connections=KEEP_FROM)
    try:
        batcher = Recorded(client)
        kept = await batcher.command("CLIENT", "ID")
        together = await asyncio.gather(*(batcher.command("CLIENT", "ID") for _ in range(3)))
        assert set(together) == {kept}
        assert await client.client_id() != kept  # the pool's others serve the client

        await redis_client.client_kill_filter(_id=kept)  # closed while the batcher is idle
        assert await batcher.command("INCR", "after") == 1  # replaced first: no failure
        assert await batcher.command("CLIENT", "ID") != kept
    finally:
        await client.aclose()


async def test_a_pool_too_small_to_spare_a_connection_stays_shared(redis_url: str) -> None:
    client = connect(redis_url, socket_timeout_s=0.5, max_connections=KEEP_FROM - 1)
    try:
        batcher = Recorded(client)
        assert await batcher.command("INCR", "n") == 1
        pool = client.connection_pool
        # every connection of the pool can be had (a kept one would make the last wait, then
        # fail after the pool's timeout)
        held = [await pool.get_connection() for _ in range(KEEP_FROM - 1)]
        for connection in held:
            await pool.release(connection)
    finally:
        await client.aclose()


async def test_an_unreachable_server_fails_every_caller_with_the_store_unavailable() -> None:
    client = connect("redis://127.0.0.1:1/0", socket_timeout_s=0.5, connect_timeout_s=0.5)
    try:
        batcher = Recorded(client)
        held = batcher.hold_before()
        first = asyncio.create_task(batcher.command("INCR", "n"))
        await batcher.in_flight.wait()
        rest = await _started(3, lambda i: batcher.command("INCR", "n"))
        held.set()

        async def translated(call: Awaitable[object]) -> object:
            with unavailable_on_failure("test call"):
                return await call

        outcomes = await asyncio.gather(
            *(translated(t) for t in [first, *rest]), return_exceptions=True
        )

        assert batcher.sizes == [1, 3]
        assert all(isinstance(o, KeyValueStoreUnavailable) for o in outcomes), outcomes
    finally:
        await client.aclose()


async def test_a_caller_cancelled_before_its_pipeline_left_is_not_sent(
    redis_client: Redis,
) -> None:
    batcher = Recorded(redis_client)
    held = batcher.hold_before()
    first = asyncio.create_task(batcher.command("INCR", "n"))
    await batcher.in_flight.wait()
    waiting = await _started(3, lambda i: batcher.command("INCR", "n"))
    waiting[1].cancel()
    held.set()

    assert [await first, await waiting[0], await waiting[2]] == [1, 2, 3]
    with pytest.raises(asyncio.CancelledError):
        await waiting[1]
    assert batcher.sizes == [1, 2]
    assert await redis_client.get("n") == "3"


async def test_a_caller_cancelled_while_its_pipeline_is_read_leaves_the_others_intact(
    redis_client: Redis,
) -> None:
    batcher = Recorded(redis_client)
    held = batcher.hold_after()
    calls = await _started(3, lambda i: batcher.command("INCR", "n"))
    await batcher.in_flight.wait()
    calls[1].cancel()  # its call is already on the wire: it runs, unanswered
    held.set()

    assert [await calls[0], await calls[2]] == [1, 3]
    with pytest.raises(asyncio.CancelledError):
        await calls[1]
    assert batcher.sizes == [3]
    # the batcher goes on with the next calls
    assert await batcher.command("INCR", "n") == 4


async def test_every_adapter_on_a_client_shares_one_batcher(redis_client: Redis) -> None:
    assert shared_batcher(redis_client) is shared_batcher(redis_client)
    other = connect("redis://127.0.0.1:6379/0", socket_timeout_s=1.0)  # never connects
    try:
        assert shared_batcher(other) is not shared_batcher(redis_client)
    finally:
        await other.aclose()


@pytest.fixture
async def cluster_connections(redis_cluster: ThreeMasterCluster) -> AsyncIterator[RedisConnections]:
    connections = open_connections(redis_cluster.url)
    await flush(connections)
    yield connections
    await connections.aclose()


async def test_on_a_cluster_each_call_goes_alone_with_the_same_answers(
    cluster_connections: RedisConnections,
) -> None:
    client = cluster_connections.commands
    batcher = Recorded(client)
    counter = client.register_script(_unique(_INCR))  # unknown to every node: NOSCRIPT first
    bad = client.register_script(_FAIL)
    users = [f"user-{i}" for i in range(12)]  # spread over the three masters

    replies = await asyncio.gather(
        *(batcher.script(counter, [f"n:{{{u}}}"], []) for u in users),
        batcher.script(bad, ["x:{u}"], []),
        batcher.command("INCR", "m:{user-0}"),
        batcher.command("LMOVE", "a:{u}", "b:{u}", "LEFT", "RIGHT"),
        return_exceptions=True,
    )

    assert replies[: len(users)] == [1] * len(users)
    assert isinstance(replies[len(users)], rx.ResponseError)
    assert replies[len(users) + 1 :] == [1, None]
    assert batcher.sizes == []  # nothing pipelined: the cluster client sent each call


async def test_on_a_cluster_an_unreachable_store_is_unavailable() -> None:
    connections = open_connections("redis+cluster://127.0.0.1:1", socket_timeout_s=0.5)
    try:
        batcher = RedisBatcher(connections.commands)
        with pytest.raises(KeyValueStoreUnavailable), unavailable_on_failure("test call"):
            await batcher.command("INCR", "n:{u}")
    finally:
        await connections.aclose()
