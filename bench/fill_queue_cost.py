"""What one fill check costs the order-tasks queue on Redis, send to ack (issue 13).

A producer sends ``--messages`` fill tasks over ``--users`` message groups at ``--rate`` per
second, each delayed ``--delay`` seconds plus up to a tenth more (the worker's first check
is delayed 2-3 s, jittered); a consumer does what the worker host's fill verifier does with
the queue: ``receive_many`` up to 64, then every delivery's ``ack`` at once, and after a
batch of fewer a pause of ``CHECK_GATHER_S`` (the checks falling due meanwhile share the
next). Both run through the real adapter (``RedisFillTaskQueue``) on one Redis server.
Printed per run, each per message: the Redis server's CPU (``INFO cpu``, user + system), the
time it spent running the scripts, the commands it executed (the scripts' inner commands
included) and the script calls (``INFO commandstats``), and the client's CPU. The server's
CPU includes its network work and its wake-ups (one per call that arrives alone); the time
in scripts is what their execution alone took. The server is assumed to serve nothing else
meanwhile.

    .venv/bin/python bench/fill_queue_cost.py --url redis://127.0.0.1:6379/14

The database named in the URL is flushed first (never use 0 or a database in use). Compare
builds by putting another checkout's ``src`` first on ``PYTHONPATH``, alternating runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

from tradecore.fills import CHECK_GATHER_S
from tradecore.ports.messaging import FillTask
from tradecore_adapters.redis import RedisFillTaskQueue, open_connections
from tradecore_adapters.redis.client import Client

_SCRIPTS = ("evalsha", "eval")
_BATCH = 64
"""The fill verifier's batch limit (the worker host's FILL_BATCH_LIMIT)."""


async def _server(client: Client) -> tuple[float, dict[str, int], float]:
    """The server's CPU seconds so far, its calls per command, and the microseconds it spent
    running scripts (their inner commands included)."""
    cpu = await client.info("cpu")
    stats = await client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    in_scripts = sum(
        float(stats.get(f"cmdstat_{n}", {}).get("usec", 0)) for n in ("evalsha", "eval")
    )
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls, in_scripts


async def _run(url: str, messages: int, users: int, rate: float, delay_s: float) -> dict[str, Any]:
    connections = open_connections(url)
    client = connections.commands
    await client.flushdb()
    queue = RedisFillTaskQueue(client, shards=connections.queue_shards)
    acked = 0

    async def consume() -> None:
        nonlocal acked
        while acked < messages:
            deliveries = await queue.receive_many(_BATCH, 1.0)
            await asyncio.gather(*(queue.ack(d) for d in deliveries))
            acked += len(deliveries)
            if len(deliveries) < _BATCH:
                await asyncio.sleep(CHECK_GATHER_S)  # as the worker host's loop does

    async def produce() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for n in range(messages):
            pause = start + n / rate - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)
            task = FillTask(f"order-{n}", f"user-{n % users}", "account")
            await queue.send(task, delay_s * (1 + random.random() / 10))

    await client.script_flush()  # every build loads its own scripts
    cpu0, calls0, scripts0 = await _server(client)
    client_cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(produce(), consume())
    client_cpu, wall = time.process_time() - client_cpu0, time.perf_counter() - wall0
    cpu1, calls1, scripts1 = await _server(client)
    await queue.aclose()
    await connections.aclose()
    # INFO itself is counted: leave out what the measuring did
    spent = {k: v - calls0.get(k, 0) for k, v in calls1.items() if k not in ("info",)}
    scripts = spent.get("evalsha", 0) + spent.get("eval", 0)
    inner = sum(v for k, v in spent.items() if k not in ("evalsha", "eval", "script|flush"))
    return {
        "messages": messages,
        "wall_s": round(wall, 2),
        "redis_cpu_us_per_message": round((cpu1 - cpu0) / messages * 1e6, 1),
        "redis_us_in_scripts_per_message": round((scripts1 - scripts0) / messages, 1),
        "redis_commands_per_message": round(inner / messages, 2),
        "script_calls_per_message": round(scripts / messages, 2),
        "client_cpu_us_per_message": round(client_cpu / messages * 1e6, 1),
        "top_commands_per_message": {
            k: round(v / messages, 2) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])[:8]
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=200, help="message groups")
    parser.add_argument("--rate", type=float, default=1000.0, help="sends per second")
    parser.add_argument("--delay", type=float, default=0.2, help="seconds before a check")
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    if options.url.rstrip("/").endswith("/0"):
        parser.error("refusing to flush database 0")
    for _ in range(options.runs):
        result = asyncio.run(
            _run(options.url, options.messages, options.users, options.rate, options.delay)
        )
        print(json.dumps(result))


if __name__ == "__main__":
    main()
