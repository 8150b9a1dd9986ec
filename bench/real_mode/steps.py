"""Where one order's answer time goes in real mode, step by step (issue 13).

Starts the real-mode stack (``stack.py``: API process, worker host, Postgres, Redis), primes
every user's worker, then sends webhook orders on a fixed schedule (open loop) from the users
in turn: at a slow rate each order meets an idle system, at a high one it shows which step
the load lengthens. For every order it joins the client's send and answer times
with the timestamps the order's row records on its way:

* ``created_at``: the API built the intent (after the webhook's checks and its admission);
* ``submitted_at``: the worker is about to claim the row (``queued -> submitted``);
* ``placed_at``: the broker answered the placement;

and prints the median and p90 of each gap, beside the CPU and the sleeps (voluntary context
switches) per order of the API, the worker host, Postgres and Redis, the Redis commands
per order and Postgres's writing transactions (commits) per order (the servers', so run it
alone):

* send -> created: HTTP, parse, the four webhook checks, the admission script;
* created -> submitted: the intent and audit commit, the hand-over to the worker host, its
  take, the position read;
* submitted -> placed: the claim's commit and the broker's placement (the paper broker's in
  memory);
* placed -> answer: the result's commit (the paper broker's book with it), the fill check's
  scheduling, the reply, the API's wake-up and the HTTP answer.

All clocks are this machine's wall clock (the processes share it). Beside the steps it
measures this machine's floor for one hop at the same pacing: the round trip of a UDP
datagram to a second process that echoes it, sent as often as the orders. On a virtual
machine whose idle virtual CPUs halt, a process that slept costs more to wake the less often
it is woken, and an order makes a dozen such hops (client, API, Redis, Postgres and its WAL
flush, worker host and back). Usage::

    .venv/bin/python bench/real_mode/steps.py --users 50 --orders 400 --rate 20

``--hops`` splits the answer further, hop by hop: the processes start with
``bench/real_mode/hops`` first on their ``PYTHONPATH``, whose ``sitecustomize`` wraps the
methods an order goes through so each writes a timestamp (``HOPS`` below names them); the
product's code is unchanged, and the writes cost a little time of their own. With
``--slowest N`` it also lists the N slowest orders, each with when it was sent and the hops
that took 2 ms or more: slow orders sent together, with every hop slow, are a stall of the
whole machine (a burst, a collection); one hop slow across the run is that step's tail.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import accounts_from, prime, session
from stack import REDIS_URL, Stack, cpu_seconds, machine_busy_seconds

HOPS_SITE = Path(__file__).resolve().parent / "hops"
HOPS = (
    # (hop, from, to): the marks of hops/sitecustomize.py
    ("HTTP in: the client's send to the webhook handler", "sent", "received"),
    (
        "checks: parse, token, IP, timestamp, secret and the admission script",
        "received",
        "admitted",
    ),
    ("the remaining checks (plan, daily cap, credentials, symbol)", "admitted", "add"),
    ("intent: the INSERT, committed", "add", "intent"),
    ("push: the push script", "intent", "pushed"),
    ("take: the worker host's wake-up (and LMOVE unless handed over)", "pushed", "taken"),
    ("position: the broker's positions", "taken", "positioned"),
    ("placement: the broker's answer", "positioned", "placed"),
    ("result: queued -> filled with its claim, committed with the paper book", "placed", "result"),
    ("fill check sent, from the placement", "placed", "fill"),
    ("complete: the reply published", "result", "completed"),
    ("answer: the API has the reply", "completed", "replied"),
    ("HTTP out: the API's reply to the client's answer", "replied", "answered"),
    ("intent to answer", "add", "replied"),
    ("send to answer", "sent", "answered"),
)
GAPS = (
    ("send -> created", "sent", "created_at"),
    ("created -> submitted", "created_at", "submitted_at"),
    ("submitted -> placed", "submitted_at", "placed_at"),
    ("placed -> answer", "placed_at", "answered"),
    ("send -> answer", "sent", "answered"),
)


async def _orders(
    documents: list[dict[str, str]],
    orders: int,
    rate: float,
    pids: dict[str, int],
    database_url: str,
) -> list[dict[str, float]]:
    """``orders`` orders sent on a fixed schedule (open loop, ``rate`` per second), each by
    the next account in turn (an account sends its next order only once its last one was
    answered, so positions stay bounded); the send and answer times of each."""
    accounts = accounts_from(documents)
    timings: list[dict[str, float]] = []
    await prime(accounts, 4)
    async with session(max(4, len(accounts))) as client:

        async def one(index: int) -> None:
            account = accounts[index % len(accounts)]
            async with account.lock:
                body, quantity = account.next_body()
                sent = time.time()
                async with client.post(
                    account.url, data=body, headers={"Content-Type": "application/json"}
                ) as response:
                    payload = await response.json(content_type=None)
                answered = time.time()
                if response.status != 200 or payload.get("status") != "filled":
                    raise SystemExit(f"order {index}: {response.status} {payload}")
                account.filled(quantity)
            timings.append({"id": payload["order_id"], "sent": sent, "answered": answered})

        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        groups_before = process_groups(pids)
        commands_before = redis_commands()
        transactions_before = write_transactions(database_url)
        busy_before = machine_busy_seconds()
        start = time.monotonic()
        sends = []
        for index in range(orders):
            await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
            sends.append(asyncio.create_task(one(index)))
        await asyncio.gather(*sends)
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        cpu["machine"] = machine_busy_seconds() - busy_before
        per_order = {f"{name}_ms": round(1000 * s / orders, 3) for name, s in cpu.items()}
        print(json.dumps({"cpu_per_order": per_order}))
        groups = process_groups(pids)
        print(
            json.dumps(
                {
                    f"{name}_per_order": {
                        g: round((groups[g][i] - groups_before[g][i]) * scale / orders, 3)
                        for g in groups
                    }
                    for i, name, scale in ((0, "cpu_ms", 1000), (1, "sleeps", 1))
                }
            )
        )
        commands = redis_commands()
        calls = {k: (v - commands_before.get(k, 0)) / orders for k, v in commands.items()}
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:8]
        print(json.dumps({"redis_commands_per_order": {k: round(v, 2) for k, v in top}}))
        transactions = write_transactions(database_url) - transactions_before
        print(
            json.dumps({"postgres_write_transactions_per_order": round(transactions / orders, 2)})
        )
    return timings


def _thread_stats(pid: int) -> tuple[float, int]:
    """CPU seconds the scheduler gave every thread of ``pid`` (``schedstat``, nanoseconds)
    and their voluntary context switches (each one a sleep, so a later wake-up)."""
    run_ns, sleeps = 0, 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            run_ns += int((task / "schedstat").read_text().split()[0])
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    sleeps += int(line.split()[1])
    return run_ns / 1e9, sleeps


def process_groups(pids: dict[str, int]) -> dict[str, tuple[float, int]]:
    """CPU seconds and sleeps so far of the API and worker processes (by name) and of all
    of this machine's Postgres and Redis server processes (summed; the processes that ended
    meanwhile, such as a closed connection's backend, are missed)."""
    groups: dict[str, tuple[float, int]] = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            groups[name] = _thread_stats(pid)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            command = (proc / "comm").read_text().strip()
            group = "postgres" if command.startswith("postgres") else None
            group = "redis" if command.startswith("redis-server") else group
            if group is not None:
                cpu, sleeps = _thread_stats(int(proc.name))
                before = groups.get(group, (0.0, 0))
                groups[group] = (before[0] + cpu, before[1] + sleeps)
    return groups


def write_transactions(database_url: str) -> int:
    """Transaction ids the Postgres server has handed out so far: one per transaction that
    wrote (a commit that reaches the disk), none for one that only read. Server-wide, so run
    it alone."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT txid_snapshot_xmax(txid_current_snapshot())").fetchone()
    assert row is not None
    return int(row[0])


def redis_commands() -> dict[str, int]:
    """Calls of each Redis command so far on the benchmark's server (``INFO commandstats``)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def idle_round_trip_us(rate: float, samples: int) -> float:
    """Median round trip (µs) of a datagram to a forked echo process, one every 1/``rate`` s."""
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    echo.bind(("127.0.0.1", 0))
    child = os.fork()
    if child == 0:  # the echo process
        while True:
            data, address = echo.recvfrom(16)
            if data == b"stop":
                os._exit(0)
            echo.sendto(data, address)
    try:
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            client.sendto(b"ping", echo.getsockname())
            client.recvfrom(16)
            times.append(time.perf_counter() - started)
            time.sleep(1.0 / rate)
        return statistics.median(times) * 1e6
    finally:
        client.sendto(b"stop", echo.getsockname())
        os.waitpid(child, 0)
        client.close()
        echo.close()


def _rows(database_url: str, ids: list[str]) -> dict[str, dict[str, datetime]]:
    with psycopg.connect(database_url) as conn:
        cursor = conn.execute(
            "SELECT id, created_at, submitted_at, placed_at FROM order_history WHERE id = ANY(%s)",
            (ids,),
        )
        names = ("created_at", "submitted_at", "placed_at")
        return {row[0]: dict(zip(names, row[1:], strict=True)) for row in cursor}


def hop_marks(directory: Path) -> dict[str, dict[str, float]]:
    """Each order's marks (step -> first time) from the processes' files."""
    marks: dict[str, dict[str, float]] = {}
    for path in directory.glob("*.log"):
        for line in path.read_text().splitlines():
            at, step, order_id, _ = line.split()
            marks.setdefault(order_id, {}).setdefault(step, float(at))
    return marks


def print_hops(marks: dict[str, dict[str, float]], ids: list[str]) -> None:
    for name, start, end in HOPS:
        values = sorted(
            (m[end] - m[start]) * 1000
            for m in (marks.get(i, {}) for i in ids)
            if start in m and end in m
        )
        if not values:
            raise SystemExit(f"no order has the marks of {name!r}: a wrapped method changed?")
        print_spread("hop", name, values)


SLOW_HOP_MS = 2.0
"""A hop of one of the slowest orders is listed when it took at least this long."""


def print_slowest(marks: dict[str, dict[str, float]], count: int) -> None:
    """One line of JSON for each of the ``count`` slowest orders (send to answer): when it
    was sent (seconds after the first order), its answer time and every hop that took
    ``SLOW_HOP_MS`` or more, so a tail can be told apart from a periodic stall (the sends of
    the slow orders) and placed in a step."""
    whole = [m for m in marks.values() if "sent" in m and "answered" in m]
    if not whole or count <= 0:
        return
    first = min(m["sent"] for m in whole)
    slowest = sorted(whole, key=lambda m: m["answered"] - m["sent"], reverse=True)[:count]
    for m in slowest:
        hops = {
            name: round((m[end] - m[start]) * 1000, 2)
            for name, start, end in HOPS[:-2]  # not the two spans that cover the others
            if start in m and end in m and (m[end] - m[start]) * 1000 >= SLOW_HOP_MS
        }
        print(
            json.dumps(
                {
                    "slow_order_sent_s": round(m["sent"] - first, 3),
                    "answer_ms": round((m["answered"] - m["sent"]) * 1000, 2),
                    "slow_hops_ms": hops,
                }
            )
        )


def print_spread(kind: str, name: str, values: list[float]) -> None:
    """One line of JSON: ``name`` under ``kind``, and the median, p90 and p99 of the sorted
    ``values`` (ms)."""
    print(
        json.dumps(
            {
                kind: name,
                "n": len(values),
                "p50_ms": round(statistics.median(values), 3),
                "p90_ms": round(values[int(len(values) * 0.9)], 3),
                "p99_ms": round(values[int(len(values) * 0.99)], 3),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--orders", type=int, default=400)
    parser.add_argument("--rate", type=float, default=20.0, help="orders per second")
    parser.add_argument("--hops", action="store_true", help="timestamps around each step")
    parser.add_argument(
        "--slowest",
        type=int,
        default=0,
        help="with --hops: the slowest orders, each with its send time and its slow hops",
    )
    args = parser.parse_args()
    hops_dir = None
    if args.hops:  # before the stack copies the environment for its processes
        hops_dir = Path(tempfile.mkdtemp(prefix="tradecore-hops-"))
        os.environ["BENCH_HOPS_DIR"] = str(hops_dir)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HOPS_SITE), os.environ.get("PYTHONPATH")) if p
        )
    floor_us = idle_round_trip_us(args.rate, min(args.orders, 200))
    print(json.dumps({"idle_round_trip_p50_us": round(floor_us, 1), "rate": args.rate}))
    stack = Stack(Path(tempfile.mkdtemp(prefix="tradecore-steps-")))
    try:
        stack.create()
        documents = asyncio.run(stack.provision(args.users))
        stack.start_api()
        stack.start_worker()
        timings = asyncio.run(
            _orders(documents, args.orders, args.rate, stack.pids(), stack.database_url)
        )
        rows = _rows(stack.database_url, [t["id"] for t in timings])
    finally:
        stack.close()
    gaps: dict[str, list[float]] = {name: [] for name, _, _ in GAPS}
    for timing in timings:
        points: dict[str, float] = {"sent": timing["sent"], "answered": timing["answered"]}
        points.update({k: v.timestamp() for k, v in rows[str(timing["id"])].items() if v})
        for name, start, end in GAPS:
            if start in points and end in points:
                gaps[name].append((points[end] - points[start]) * 1000)
    for name, values in gaps.items():
        print_spread("step", name, sorted(values))
    if hops_dir is not None:
        marks = hop_marks(hops_dir)
        for timing in timings:  # the client's own times beside the processes'
            own = marks.setdefault(str(timing["id"]), {})
            own.update(sent=timing["sent"], answered=timing["answered"])
        print_hops(marks, [str(t["id"]) for t in timings])
        print_slowest(marks, args.slowest)
        shutil.rmtree(hops_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
