"""Load and measurements for the real-mode benchmark (driven by ``run.py``).

* ``open_loop``: webhook orders on a fixed schedule; latency counts from each request's
  *scheduled* send time (no coordinated omission). Sent by the lean client
  (``bench/lean_http.py``: raw HTTP/1.1 on keep-alive connections, as the issue's own
  open-loop measurements were), or by aiohttp's client (``client="aiohttp"``, what this
  benchmark used before 2026-11-27), which costs the machine several times more per request
  and adds its own time to every answer.
* ``closed_loop``: C client tasks, each sending its next order when the previous one is
  answered: the throughput at that concurrency.
* ``closed_loop_wrk``: the same closed loop driven by wrk (``bench/wrk_runner.py``), a C
  client that leaves the machine's CPU to the service (the issue's own measurements used it).
* ``prime``: one order per account, so every user's worker is running before a measured
  phase (a first order is a cold activation, measured on its own by ``cold_orders``).
* ``cold_orders``: the first order of never-activated users, one at a time: send to
  OrderResult.
* ``lease_acquisition``: ``request_start`` to ``wait_active`` True, through the API's own
  ``RedisWorkerDirectory``, for fresh user ids.

Every body is unique (microsecond timestamp, per-account sequence in the quantity). Each
account alternates a BTCUSDT ``buy`` entry and a ``sell`` exit of the same quantity, strictly
one request at a time, so positions and margin stay bounded. Anything but 200 with
``status: filled`` is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from stack import cpu_seconds, machine_busy_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from webhook_load import LeanHttpClient, judge_webhook
from wrk_runner import closed_loop as wrk_closed_loop

SYMBOL = "BTCUSDT"
TIMEOUT_S = 10.0


class Account:
    def __init__(self, url: str, secret: str, user_id: str) -> None:
        self.url = url
        self.path = urlsplit(url).path.encode()  # what webhook_load.LeanHttpClient writes
        self.secret = secret
        self.user_id = user_id
        self.sequence = 0
        self.open_quantity: str | None = None
        self.lock = asyncio.Lock()

    def next_body(self) -> tuple[bytes, str]:
        if self.open_quantity is None:
            self.sequence += 1
            quantity = f"0.{1000 + self.sequence % 9000:04d}1"
            action, order_type = "buy", "entry"
        else:
            quantity = self.open_quantity
            action, order_type = "sell", "exit"
        timestamp = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        text = (
            f'{{"action": "{action}", "order_type": "{order_type}", '
            f'"symbol": "{SYMBOL}", "quantity": {quantity}, "timestamp": "{timestamp}", '
            f'"secret": "{self.secret}"}}'
        )
        return text.encode(), quantity

    def filled(self, quantity: str) -> None:
        self.open_quantity = quantity if self.open_quantity is None else None


def accounts_from(documents: Sequence[dict[str, str]]) -> list[Account]:
    return [Account(d["webhook_url"], d["webhook_secret"], d["user_id"]) for d in documents]


def session(connections: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections)
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
    )


async def send(client: aiohttp.ClientSession, account: Account) -> tuple[bool, str]:
    body, quantity = account.next_body()
    try:
        async with client.post(
            account.url, data=body, headers={"Content-Type": "application/json"}
        ) as response:
            payload = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as e:
        return False, type(e).__name__
    return judge_webhook(account, quantity, status, payload)


@contextlib.asynccontextmanager
async def sender(
    accounts: Sequence[Account], connections: int, client: str
) -> AsyncIterator[Callable[[Account], Awaitable[tuple[bool, str]]]]:
    """``send``'s counterpart for ``client`` ("lean" or "aiohttp"), open for the block: the
    lean one is ``webhook_load``'s client, judged as ``send`` judges aiohttp's answers."""
    if client == "aiohttp":
        async with session(connections) as http:
            yield functools.partial(send, http)
        return
    lean = LeanHttpClient(accounts[0].url.split("/webhook/", 1)[0], connections, TIMEOUT_S)

    async def send_lean(account: Account) -> tuple[bool, str]:
        ok, tag, _ = await lean.webhook(account)  # type: ignore[arg-type]  # duck-typed Account
        return ok, tag

    try:
        yield send_lean
    finally:
        await lean.close()


# -- statistics ---------------------------------------------------------------------------


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank percentiles and max of seconds, in milliseconds."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "p99_9": None, "max": None}
    ordered = sorted(values)

    def rank(p: float) -> float:
        index = max(0, min(len(ordered) - 1, int(-(-p * len(ordered) // 100)) - 1))
        return round(ordered[index] * 1000, 3)

    return {
        "p50": rank(50),
        "p90": rank(90),
        "p99": rank(99),
        "p99_9": rank(99.9),
        "max": round(ordered[-1] * 1000, 3),
    }


class CpuMeter:
    """CPU over a window, percent of one core: the API, the worker host, the client, and
    everything else (Postgres and Redis included, plus anything unrelated). The client is
    this process (``time.process_time``) unless ``client_seconds`` says otherwise."""

    def __init__(
        self, pids: dict[str, int], client_seconds: Callable[[], float] = time.process_time
    ) -> None:
        self._pids = pids
        self._client_seconds = client_seconds
        self._marks: list[tuple[float, dict[str, float], float, float]] = []

    def mark(self) -> None:
        self._marks.append(
            (
                time.monotonic(),
                {name: cpu_seconds(pid) for name, pid in self._pids.items()},
                self._client_seconds(),
                machine_busy_seconds(),
            )
        )

    def report(self) -> dict[str, float]:
        if len(self._marks) < 2:
            return {}
        (t0, p0, c0, m0), (t1, p1, c1, m1) = self._marks[0], self._marks[-1]
        span = t1 - t0

        def percent(seconds: float) -> float:
            return round(100 * seconds / span, 1)

        named = {f"{n}_cpu_percent": percent(p1[n] - p0[n]) for n in self._pids}
        client = c1 - c0
        others = (m1 - m0) - sum(p1[n] - p0[n] for n in self._pids) - client
        return {
            **named,
            "client_cpu_percent": percent(client),
            "others_cpu_percent": percent(others),
            "machine_cpu_percent": percent(m1 - m0),
        }


Sample = tuple[float, float, float, bool, str]  # (scheduled/sent, latency, service, ok, tag)


def summarize(samples: list[Sample], begin: float, end: float) -> dict[str, Any]:
    errors = Counter(tag for *_, ok, tag in samples if not ok)
    seconds = end - begin
    return {
        "requests": len(samples),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors.most_common(10)),
        "achieved_rate_per_s": round(len(samples) / seconds, 1) if seconds > 0 else None,
        "latency_ms": percentiles([s[1] for s in samples]),
        "service_ms": percentiles([s[2] for s in samples]),
    }


# -- phases -------------------------------------------------------------------------------


async def prime(accounts: Sequence[Account], concurrency: int) -> dict[str, Any]:
    """One order per account (the first order of each is a cold activation)."""
    started = time.monotonic()
    tags: Counter[str] = Counter()
    queue = list(accounts)

    async def worker(client: aiohttp.ClientSession) -> None:
        while queue:
            account = queue.pop()
            async with account.lock:
                _, tag = await send(client, account)
            tags[tag] += 1

    async with session(concurrency) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return {"orders": len(accounts), "outcomes": dict(tags), "seconds": time.monotonic() - started}


async def open_loop(
    accounts: Sequence[Account],
    rate: float,
    warmup_s: float,
    duration_s: float,
    pids: dict[str, int],
    client: str = "lean",
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    samples: list[Sample] = []
    lags: list[tuple[float, float]] = []
    cpu = CpuMeter(pids)
    async with sender(accounts, 512, client) as send_one:

        async def fire(index: int, scheduled: float) -> None:
            account = accounts[index % len(accounts)]
            async with account.lock:
                sent = loop.time()
                ok, tag = await send_one(account)
            done = loop.time()
            samples.append((scheduled, done - scheduled, done - sent, ok, tag))
            lags.append((scheduled, sent - scheduled))

        total = int((warmup_s + duration_s) * rate)
        start = loop.time() + 0.05
        begin, end = start + warmup_s, start + total / rate
        loop.call_at(begin, cpu.mark)
        loop.call_at(end, cpu.mark)
        in_flight: set[asyncio.Task[None]] = set()
        paced = asyncio.Event()

        def launch(index: int, scheduled: float) -> None:
            task = asyncio.create_task(fire(index, scheduled))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            if index == total - 1:
                paced.set()

        def pace() -> None:
            # The send times are kept by a thread sleeping in time.sleep (nanosleep, a tenth
            # of a millisecond late at most here) and handing each send to the event loop:
            # the loop's own timers are a millisecond coarse, and busy-waiting the last
            # stretch would take a good part of a core from the processes under test.
            for index in range(total):
                scheduled = start + index / rate
                time.sleep(max(0.0, scheduled - time.monotonic()))
                loop.call_soon_threadsafe(launch, index, scheduled)

        if total:
            pacer = loop.run_in_executor(None, pace)
            await paced.wait()
            await pacer
        await asyncio.gather(*in_flight)
        await asyncio.sleep(max(0.0, end - loop.time()) + 0.01)
    measured = [s for s in samples if begin <= s[0] < end]
    result = summarize(measured, begin, end)
    result["target_rate_per_s"] = rate
    result["client"] = client
    result["send_lag_ms"] = percentiles([lag for at, lag in lags if begin <= at < end])
    result.update(cpu.report())
    return result


async def closed_loop(
    accounts: Sequence[Account],
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    pids: dict[str, int],
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    samples: list[Sample] = []
    cpu = CpuMeter(pids)
    start = loop.time()
    begin, end = start + warmup_s, start + warmup_s + duration_s
    loop.call_at(begin, cpu.mark)
    loop.call_at(end, cpu.mark)

    async def worker(client: aiohttp.ClientSession, mine: Sequence[Account]) -> None:
        turn = 0
        while True:
            account = mine[turn % len(mine)]
            turn += 1
            sent = loop.time()
            if sent >= end:
                return
            ok, tag = await send(client, account)
            done = loop.time()
            samples.append((sent, done - sent, done - sent, ok, tag))

    async with session(concurrency) as client:
        groups = [accounts[i::concurrency] for i in range(concurrency)]
        await asyncio.gather(*(worker(client, g) for g in groups if g))
    await asyncio.sleep(max(0.0, end - loop.time()) + 0.01)
    result = summarize([s for s in samples if begin <= s[0] < end], begin, end)
    result["concurrency"] = concurrency
    result.update(cpu.report())
    return result


def closed_loop_wrk(
    accounts: Sequence[Account],
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    pids: dict[str, int],
    *,
    threads: int = 2,
) -> dict[str, Any]:
    """``closed_loop`` driven by wrk: a warm-up run, then the measured one (whole seconds).
    The accounts' state here (``Account.open_quantity``) is neither read nor changed: wrk
    opens before it exits (``wrk_runner``), so what it leaves is a longer position, which
    this client's next exit still finds."""
    return wrk_closed_loop(
        [{"webhook_url": a.url, "webhook_secret": a.secret} for a in accounts],
        accounts[0].url.split("/webhook/", 1)[0],
        threads=threads,
        concurrency=concurrency,
        warmup_s=warmup_s,
        duration_s=duration_s,
        timeout_s=TIMEOUT_S,
        meter=lambda client_seconds: CpuMeter(pids, client_seconds),
    )


async def cold_orders(accounts: Sequence[Account], pause_s: float = 0.02) -> dict[str, Any]:
    """The first order of each never-activated user, one at a time: send to OrderResult."""
    latencies: list[float] = []
    tags: Counter[str] = Counter()
    async with session(4) as client:
        for account in accounts:
            started = time.perf_counter()
            _, tag = await send(client, account)
            latencies.append(time.perf_counter() - started)
            tags[tag] += 1
            await asyncio.sleep(pause_s)
    return {"orders": len(accounts), "outcomes": dict(tags), "latency_ms": percentiles(latencies)}


async def lease_acquisition(redis_url: str, count: int, pause_s: float = 0.02) -> dict[str, Any]:
    """For ``count`` fresh user ids, one at a time: the time from ``request_start`` (the API
    puts the start request on worker-control) until ``wait_active`` returns True (the API
    sees the user's ``worker:active`` lease), with the API's own RedisWorkerDirectory."""
    from tradecore_adapters.redis import RedisWorkerDirectory, open_connections

    connections = open_connections(redis_url)
    directory = RedisWorkerDirectory(connections)
    latencies: list[float] = []
    missed = 0
    try:
        await connections.check()
        for _ in range(count):
            user_id = f"bench-cold-{secrets.token_hex(8)}"
            started = time.perf_counter()
            await directory.request_start(user_id)
            active = await directory.wait_active(user_id, 5.0)
            latencies.append(time.perf_counter() - started)
            missed += not active
            await asyncio.sleep(pause_s)
    finally:
        await connections.aclose()
    return {"users": count, "not_active_within_5s": missed, "latency_ms": percentiles(latencies)}


def main() -> None:
    """Load against a stack held by ``hold.py`` (for profiling): ``load.py ACCOUNTS_FILE
    open RATE | closed CONCURRENCY``."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("accounts_file", type=Path)
    parser.add_argument("mode", choices=("open", "closed", "prime"))
    parser.add_argument("value", type=float, help="open: orders/s; closed/prime: concurrency")
    parser.add_argument("--users", type=int, default=None, help="use the first N accounts")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=15.0)
    args = parser.parse_args()
    document = json.loads(args.accounts_file.read_text())
    accounts = accounts_from(document["accounts"][: args.users])
    pids: dict[str, int] = document["pids"]
    if args.mode == "open":
        result = asyncio.run(open_loop(accounts, args.value, args.warmup, args.duration, pids))
    elif args.mode == "closed":
        result = asyncio.run(
            closed_loop(accounts, int(args.value), args.warmup, args.duration, pids)
        )
    else:
        result = asyncio.run(prime(accounts, int(args.value)))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
