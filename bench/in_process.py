"""Webhook orders through the core without HTTP: what an order costs the embedded runtime.

Builds the system as ``bench/seeded_server.py`` does (``Settings.from_env``,
``build_container``, ``make_app`` with its cleanup context set up, ``seed``, the collector
settings of ``settle_heap``) and drives ``WebhookIntake.handle`` directly with the bodies of
``bench/webhook_load.py`` (each account alternates a buy entry and a sell exit; an order
counts only when it is ``filled``). The worker host, the fill checks 2-3 s after each order
and the audit log all run as in ``tradecore serve``; aiohttp, the middlewares and the
loopback do not. First every account sends one unmeasured order (its worker starts), then:

* ``closed``: ``--concurrency`` accounts at a time, each sending its next order as soon as the
  last is answered, ``--orders`` in all: CPU per order and orders per second;
* ``open``: ``--rate`` orders per second for ``--duration`` seconds after ``--warmup``
  seconds, over the accounts in turn: latency of ``handle`` from each order's scheduled time
  (p50, p90, p99) and CPU per order.

Run from the repository root: ``.venv/bin/python bench/in_process.py closed`` or
``.venv/bin/python bench/in_process.py open --rate 200 --users 400``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from aiohttp import web
from seeded_server import seed
from webhook_load import Account, percentiles

from tradecore.audit import RequestContext
from tradecore.services.orders.outcomes import Accepted
from tradecore_entrypoints.container import build_container, make_app
from tradecore_entrypoints.loop import run_fast, settle_heap
from tradecore_entrypoints.settings import Settings

CONTEXT = RequestContext(
    ip_address="127.0.0.1",
    user_agent="bench/in_process",
    request_path="/webhook/<token>/order",
    request_method="POST",
)


class Sender:
    """One account's orders through ``handle``, strictly one after another."""

    def __init__(self, system: Any, account: dict[str, str]) -> None:
        self._handle = system.webhooks.handle
        self._account = Account(account["webhook_url"], account["webhook_secret"])
        self._token = account["webhook_url"].rsplit("/", 2)[-2]

    async def send(self) -> None:
        async with self._account.lock:
            body, quantity = self._account.next_body()
            outcome = await self._handle(self._token, body, simulation=False, context=CONTEXT)
            if not isinstance(outcome, Accepted) or outcome.result.status.value != "filled":
                raise RuntimeError(f"order not filled: {outcome}")
            self._account.filled(quantity)


async def closed(senders: list[Sender], concurrency: int, orders: int) -> dict[str, Any]:
    rounds = max(orders // concurrency, 1)

    async def lane(first: int) -> None:
        for step in range(rounds):
            await senders[(first + step * concurrency) % len(senders)].send()

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(lane(k) for k in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    done = rounds * concurrency
    return {
        "orders": done,
        "orders_per_s": round(done / wall),
        "cpu_us_per_order": cpu_us(cpu, done),
    }


async def open_loop(
    senders: list[Sender], rate: float, warmup_s: float, duration_s: float
) -> dict[str, Any]:
    latencies: list[float] = []
    tasks: list[asyncio.Task[None]] = []
    warmup, total = int(rate * warmup_s), int(rate * (warmup_s + duration_s))

    async def timed(sender: Sender, due: float, measured: bool) -> None:
        await sender.send()
        if measured:
            latencies.append(time.perf_counter() - due)

    start = time.perf_counter()
    cpu = wall = 0.0
    for k in range(total):
        due = start + k / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if k == warmup:
            cpu, wall = time.process_time(), time.perf_counter()
        sender = senders[k % len(senders)]
        tasks.append(asyncio.create_task(timed(sender, due, k >= warmup)))
    await asyncio.gather(*tasks)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "orders": len(latencies),
        "latency_ms": percentiles(latencies),
        "cpu_percent": round(100 * cpu / wall, 1),
        "cpu_us_per_order": cpu_us(cpu, len(latencies)),
    }


def cpu_us(cpu_s: float, orders: int) -> float:
    return round(cpu_s * 1e6 / max(orders, 1), 1)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    container = build_container(Settings.from_env(), base_url="http://127.0.0.1:8099")
    runner = web.AppRunner(make_app(container))
    await runner.setup()  # the cleanup context starts the worker host and the fill verifier
    try:
        document = await seed(container, args.users, 0)
        system = container.services.system()
        senders = [Sender(system, account) for account in document["accounts"]]
        await asyncio.gather(*(sender.send() for sender in senders))  # every worker started
        settle_heap()
        if args.mode == "closed":
            return await closed(senders, args.concurrency, args.orders)
        return await open_loop(senders, args.rate, args.warmup, args.duration)
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["closed", "open"])
    parser.add_argument("--users", type=int, default=None, help="2,000 closed, 400 open")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--orders", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    if args.users is None:
        args.users = 2000 if args.mode == "closed" else 400
    result = run_fast(run(args))
    print({"mode": args.mode, "users": args.users, **result})


if __name__ == "__main__":
    main()
