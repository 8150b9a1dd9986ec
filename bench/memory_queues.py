"""Cost per operation of the in-memory order queue and order-tasks queue (embedded runtime).

Two measurements, in one process, on the event loop ``tradecore serve`` uses (uvloop where
installed):

* ``order round trip``: ``push`` -> ``take`` -> ``complete`` -> ``wait_result`` through
  ``MemoryOrderQueue`` (on the system clock), by ``--pairs`` client/worker pairs of users,
  while ``--idle`` other users' workers wait in ``take`` as a host's idle workers do. Each
  round trip has the worker waiting for the push and the client waiting for the reply.
* ``fill send+receive+ack``: one cycle of ``MemoryFillTaskQueue``, ``--cycles`` of them, with
  ``--pending`` delayed messages queued (checks not yet due, as 2-3 s of fill checks are at a
  high order rate); or with ``--window`` orders in the deduplication window (600 orders/s
  for its 300 s make 180,000), on a fake clock that moves ``300 s / window`` per cycle, so
  that one order leaves the window per cycle, for as many cycles as the window holds.

``--impl PATH`` (repeatable) loads the three adapters from one module file, e.g. a copy of an
earlier version, instead of the installed ``tradecore_adapters.memory`` ones (``--impl
current``); runs of the implementations alternate. Run from the repository root::

    .venv/bin/python bench/memory_queues.py --impl /tmp/old_messaging.py --impl current

It prints, per case and implementation, the best and the median of ``--repeat`` runs, in
microseconds per round trip or cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from tradecore.ports.messaging import FillTask
from tradecore.testing.clock import FakeClock
from tradecore.testing.orders import filled_result, order_request
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory
from tradecore_adapters.system import SystemClock
from tradecore_entrypoints.loop import loop_factory

CURRENT = "current"
DEDUP_WINDOW_S = 300.0
FAR_S = 10 * 365 * 86400.0  # a delay no run reaches, even on the fake clock


def load(impl: str) -> ModuleType:
    """The adapters (``MemoryWorkerDirectory``, ``MemoryOrderQueue``, ``MemoryFillTaskQueue``)
    as one module: the installed ones for ``current``, else those of the file ``impl``."""
    if impl == CURRENT:
        current = ModuleType(CURRENT)
        vars(current).update(
            MemoryWorkerDirectory=MemoryWorkerDirectory,
            MemoryOrderQueue=MemoryOrderQueue,
            MemoryFillTaskQueue=MemoryFillTaskQueue,
        )
        return current
    path = Path(impl)
    name = f"bench_messaging_{len(sys.modules)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def order_round_trips(impl: ModuleType, idle: int, pairs: int, trips: int) -> float:
    """Microseconds per round trip, ``trips`` in all, with ``idle`` workers waiting."""
    clock = SystemClock()
    directory = impl.MemoryWorkerDirectory(clock)
    queue = impl.MemoryOrderQueue(clock, directory)
    directory.attach_queue(queue)
    idle_users = [f"idle-{i}" for i in range(idle)]
    busy_users = [f"busy-{i}" for i in range(pairs)]
    for user in idle_users + busy_users:
        assert await directory.acquire(user, "bench", 3600) is not None
    per_pair = trips // pairs
    requests = {
        u: [order_request(f"{u}-r{n}", u, simulation=True) for n in range(per_pair)]
        for u in busy_users
    }
    results = {r.request_id: filled_result(r) for rs in requests.values() for r in rs}
    waiting = [asyncio.create_task(queue.take(u, 3600)) for u in idle_users]
    await asyncio.sleep(0)

    async def worker(user: str) -> None:
        for _ in range(per_pair):
            request = await queue.take(user, 60)
            assert request is not None
            await queue.complete(request, results[request.request_id])

    async def client(user: str) -> None:
        for request in requests[user]:
            assert await queue.push(request)
            assert await queue.wait_result(request.request_id, 60) is not None

    workers = [asyncio.create_task(worker(u)) for u in busy_users]
    await asyncio.sleep(0)  # every worker waits in take before the first push
    started = time.perf_counter()
    await asyncio.gather(*(client(u) for u in busy_users), *workers)
    elapsed = time.perf_counter() - started
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    return elapsed / (per_pair * pairs) * 1e6


async def fill_cycles(impl: ModuleType, pending: int, window: int, cycles: int) -> float:
    """Microseconds per send+receive+ack with ``pending`` delayed messages and ``window``
    orders in the deduplication window."""
    clock = FakeClock()
    tasks = impl.MemoryFillTaskQueue(clock, dedup_window_s=DEDUP_WINDOW_S)
    step_s = DEDUP_WINDOW_S / window if window else 0.0
    users = [f"u{i}" for i in range(1000)]
    sent = 0

    async def cycle() -> None:
        nonlocal sent
        task = FillTask(f"o{sent}", users[sent % len(users)], "acct")
        sent += 1
        await tasks.send(task, 0)
        delivery = await tasks.receive(0)
        assert delivery is not None and delivery.task == task
        await tasks.ack(delivery)
        clock.advance(step_s)

    for _ in range(window):  # fill the window with settled orders, one step apart
        await cycle()
    for n in range(pending):
        await tasks.send(FillTask(f"p{n}", users[n % len(users)], "acct"), FAR_S)
    started = time.perf_counter()
    for _ in range(cycles):
        await cycle()
    return (time.perf_counter() - started) / cycles * 1e6


def run(
    factory: Callable[[], asyncio.AbstractEventLoop] | None, main: Coroutine[Any, Any, float]
) -> float:
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", action="append", help=f"module file, or {CURRENT!r}")
    parser.add_argument("--idle", type=numbers, default=[0, 2000], help="idle workers")
    parser.add_argument("--pairs", type=int, default=16, help="client/worker pairs")
    parser.add_argument("--trips", type=int, default=20000, help="round trips per run")
    parser.add_argument("--pending", type=numbers, default=[0, 1000, 5000])
    parser.add_argument("--window", type=numbers, default=[180000], help="orders")
    parser.add_argument("--cycles", type=int, default=5000, help="fill cycles per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()

    paths = args.impl or [CURRENT]
    impls = [path if path == CURRENT else Path(path).stem for path in paths]
    if len(set(impls)) != len(impls):
        raise SystemExit("two --impl files share a name")
    modules = {impl: load(path) for impl, path in zip(impls, paths, strict=True)}
    factory = loop_factory() if args.loop == "uvloop" else None
    cases: list[tuple[str, Callable[[ModuleType], Coroutine[Any, Any, float]]]] = []
    for idle in args.idle:
        label = f"order round trip, {idle} idle, {args.pairs} pairs"
        cases.append(
            (label, partial(order_round_trips, idle=idle, pairs=args.pairs, trips=args.trips))
        )
    for pending in args.pending:
        label = f"fill send+receive+ack, {pending} pending"
        cases.append((label, partial(fill_cycles, pending=pending, window=0, cycles=args.cycles)))
    for window in args.window:
        label = f"fill send+receive+ack, {window} in dedup window"
        cycles = max(args.cycles, window)
        cases.append((label, partial(fill_cycles, pending=0, window=window, cycles=cycles)))

    print(f"loop: {args.loop}; µs per operation, best / median of {args.repeat}")
    label_width = max(len(label) for label, _ in cases)
    impl_width = max(len(impl) for impl in impls)
    print(f"{'case':<{label_width}}  {'impl':<{impl_width}}  {'best':>9}  {'median':>9}")
    for label, measure in cases:
        samples: dict[str, list[float]] = {impl: [] for impl in impls}
        for _ in range(args.repeat):
            for impl in impls:  # alternate, so that a disturbance hits every impl alike
                samples[impl].append(run(factory, measure(modules[impl])))
        for impl in impls:
            best, median = min(samples[impl]), statistics.median(samples[impl])
            print(f"{label:<{label_width}}  {impl:<{impl_width}}  {best:9.2f}  {median:9.2f}")


if __name__ == "__main__":
    main()
