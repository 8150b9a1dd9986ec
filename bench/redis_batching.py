"""Client CPU per order-path Redis call, with and without the batcher (issue 13).

N concurrent tasks each make the worker host's pair of calls per order, ``complete`` (the
reply script) then the fill-check ``send`` (the FIFO script), through the real adapters on
one Redis, for R rounds. The same run is made with the adapters' shared batcher
(``tradecore_adapters.redis.batching``) and with every call sent alone (the path before the
batcher: the script object's own call on the client). Printed per mode: calls, wall time,
client CPU (this process's user + system time) per call, and calls per second.

    .venv/bin/python bench/redis_batching.py --url redis://127.0.0.1:6379/14 --tasks 200

The database named in the URL is flushed first (never use 0 or a database in use). The
Redis server runs on the same machine, so wall times include its work; the CPU figure is
the client's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from redis.commands.core import AsyncScript

from tradecore.ports.messaging import FillTask
from tradecore.testing import orders as testing_orders
from tradecore_adapters.redis import RedisFillTaskQueue, RedisOrderQueue, open_connections
from tradecore_adapters.redis.client import Client


class _Alone:
    """Each call sent on its own, as the adapters did before the batcher."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def script(self, script: AsyncScript, keys: Sequence[Any], args: Iterable[Any]) -> Any:
        return await script(keys=list(keys), args=list(args))

    async def command(self, *command: Any) -> Any:
        return await self._client.execute_command(*command)


async def _run(url: str, tasks: int, rounds: int, batched: bool) -> dict[str, Any]:
    connections = open_connections(url)
    await connections.commands.flushdb()
    queue = RedisOrderQueue(connections)
    fills = RedisFillTaskQueue(connections.commands, shards=connections.queue_shards)
    if not batched:
        alone = _Alone(connections.commands)
        queue._batch = alone  # type: ignore[assignment]
        fills._batch = alone  # type: ignore[assignment]

    async def one_user(n: int, round_: int) -> None:
        user = f"user-{n}"
        request = testing_orders.order_request(f"r-{round_}-{n}", user, quantity=Decimal("1"))
        result = testing_orders.filled_result(request, fill_price=Decimal("100"))
        await queue.complete(request, result)
        await fills.send(
            FillTask(order_id=request.request_id, user_id=user, trading_account_id="acct"), 0.0
        )

    await asyncio.gather(*(one_user(n, -1) for n in range(tasks)))  # warm: scripts, sockets
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for round_ in range(rounds):
        await asyncio.gather(*(one_user(n, round_) for n in range(tasks)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await queue.aclose()
    await fills.aclose()
    await connections.aclose()
    calls = 2 * tasks * rounds
    return {
        "mode": "batched" if batched else "alone",
        "tasks": tasks,
        "calls": calls,
        "wall_s": round(wall, 3),
        "cpu_us_per_call": round(cpu / calls * 1e6, 1),
        "calls_per_s": round(calls / wall),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--tasks", type=int, default=200, help="concurrent tasks (users)")
    parser.add_argument("--rounds", type=int, default=25, help="pairs of calls per task")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode, alternating")
    options = parser.parse_args()
    if options.url.rstrip("/").endswith("/0"):
        parser.error("refusing to flush database 0")
    for _ in range(options.repeat):
        for batched in (False, True):
            print(
                json.dumps(asyncio.run(_run(options.url, options.tasks, options.rounds, batched)))
            )


if __name__ == "__main__":
    main()
