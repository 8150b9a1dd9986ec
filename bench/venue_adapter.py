"""Real venue adapters: what one order costs the worker's process, against a local venue.

One broker connection (``CcxtVenue(...).open`` for ``binanceusdm``, ``binance`` (spot) and
``bybit``; ``AlpacaVenue(...).open`` for ``alpaca``; ``PaperBrokerFactory`` for ``paper``, the
baseline with no network) places ``--orders`` market orders one after another (``fresh``
True, a new core client id each, ``<uuid>-entry`` buys and reduce-only ``<uuid>-exit`` sells
in turn so the position stays small), then reads each one's ``order_status``. The venue is
the emulator from ``tests/venues``, served by ``bench/venue_server.py`` in its own process
so that its CPU is not counted here; every run uses a fresh account on it.

Per run and phase (placement, status check) it reports the wall time of each call (p50,
p90, ms), this process's CPU per call (``time.process_time``, µs: the event loop, the HTTP
client, the library, the adapter, and alpaca-py's threads), the HTTP requests per call and
the emulator's CPU per call (both from the emulator), and the CPU everything else on the
machine used meanwhile (``other_cpu_pct``, percent of one core, near 0 in a clean run; from
``/proc/stat``, so only roughly, and None for a phase shorter than a second). ``--warmup``
orders (placed and checked) come first and are not counted. ``floor`` is the bare round
trip: an aiohttp GET of the venue's cheapest endpoint (its server time or clock), no
library.

ccxt's rate limiter is on unless ``off`` is asked for. ccxt paces each exchange object
with a leaky bucket: a request may go when the bucket holds no debt; it then owes the
endpoint's cost (Binance USDⓈ-M: 4 for a new order, 1 for an order query; Bybit: 2.5 and 5)
times ``rateLimit`` ms, and the next request waits, polling every 1 ms, until that is paid
back. The debt is paid back only while a request waits (ccxt 4.5.90 restarts the bucket's
clock when a request arrives after a pause; ccxt/ccxt#25556), so each request waits the cost
of the one before it, however long ago that was. ``--pacing`` (comma-separated, default
``venue,fast``): ``venue`` keeps ccxt's ``rateLimit`` for the venue (Binance 50 ms, Bybit
20 ms) with the limiter the adapter configures (``RATE_LIMITER``: since the measurements of
the leaky bucket above, a rolling minute, which waits only when the minute's budget is
spent); ``fast`` sets it to 1 ms (each wait shrinks to the
cost in ms); ``off`` turns the limiter off (``enableRateLimit`` False), leaving only the
adapter's own cost. ``--gap S`` pauses S seconds before each timed call (not timed), as when
orders come seconds apart: the waits stay.

``--profile`` adds one run (``fast`` pacing) under cProfile, in the event loop's thread and
in alpaca-py's worker threads (each its own profiler, merged). The timer is ``perf_counter``:
the loop's idle time falls outside every function, and the threads' waits for the venue
(socket reads, ``WAITS``) are taken out of the total and reported apart. The top entries by
cumulative time go to stderr; the result gets the share of the profiled time by package (C
functions, frozen modules and generic helpers charged to the package that called them) and
the cumulative share of a few named functions (ccxt's signing, the HTTP fetch, JSON and
order parsing, requests' per-request proxy lookup). Shares, not µs: cProfile adds a cost to
every call, so code made of many small calls weighs more than it does unprofiled.

Run from the repository root: ``.venv/bin/python bench/venue_adapter.py --venue binanceusdm
--orders 300 --repeat 3 --profile``. The result is one dict on the last line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import io
import json
import pstats
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import ccxt
from venue_server import credentials
from webhook_load import machine_seconds, percentiles

from tradecore.orders import Side
from tradecore.ports.broker import Broker, BrokerAccount, BrokerOrder, BrokerOrderStatus
from tradecore_adapters.brokers.alpaca_venue import AlpacaVenue
from tradecore_adapters.brokers.ccxt_venue import DIALECTS, CcxtVenue
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_adapters.system import SystemClock
from tradecore_entrypoints.loop import loop_factory, settle_heap

BENCH = Path(__file__).resolve().parent
VENUES = ("binanceusdm", "binance", "bybit", "alpaca", "paper")
CCXT = ("binanceusdm", "binance", "bybit")
PACINGS = ("venue", "fast", "off")
ORDER = {  # symbol and quantity, as in tests/contract/test_broker_contract.py
    "binanceusdm": ("BTCUSDT", Decimal("0.5")),
    "binance": ("BTCUSDT", Decimal("0.01")),
    "bybit": ("BTCUSDT", Decimal("0.5")),
    "alpaca": ("AAPL", Decimal(3)),
    "paper": ("BTCUSDT", Decimal("0.5")),
}
FLOOR_PATH = {
    "binanceusdm": "/fapi/v1/time",
    "binance": "/api/v3/time",
    "bybit": "/v5/market/time",
    "alpaca": "/v2/clock",
}
TIMEOUT_MS = 10_000
FLOOR_REQUESTS = 200


class Emulator:
    """``bench/venue_server.py`` in a child process; ``stats`` asks it for its request count
    and CPU seconds."""

    def __init__(self, venue: str, accounts: int) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(BENCH / "venue_server.py"), "--venue", venue,
             "--accounts", str(accounts)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.origin: str = self._read()["origin"]

    def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError("the venue server stopped")
        return dict(json.loads(line))

    def stats(self) -> tuple[int, float]:
        assert self._process.stdin is not None
        self._process.stdin.write("stats\n")
        self._process.stdin.flush()
        answer = self._read()
        return int(answer["requests"]), float(answer["cpu_s"])

    def stop(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class NoEmulator:
    """The paper broker's stand-in: no process, nothing counted."""

    origin = ""

    def stats(self) -> tuple[int, float]:
        return 0, 0.0

    def stop(self) -> None:
        pass


def rate_limit_ms(venue: str, pacing: str) -> int | None:
    """ccxt's ``rateLimit`` in a run (None: no ccxt)."""
    if venue not in CCXT:
        return None
    if pacing == "fast":
        return 1
    if pacing == "off":
        return 0
    return int(getattr(ccxt, venue)().rateLimit)


def open_broker(venue: str, origin: str, pacing: str, k: int) -> Broker:
    """A broker for the emulator's ``k``-th account, not yet connected."""
    if venue == "paper":
        factory = PaperBrokerFactory(PaperExchange(), PaperExchange(), SystemClock())
        return factory.open(BrokerAccount(f"bench-{k}", "paper"), simulation=False)
    key, secret = credentials(k)
    account = BrokerAccount(f"bench-{k}", venue, False, {"api_key": key, "api_secret": secret})
    if venue == "alpaca":
        return AlpacaVenue(endpoint=origin, timeout_s=TIMEOUT_MS / 1000).open(account)
    config: dict[str, Any] = {"timeout_on_exit": 0}
    if pacing == "fast":
        config["rateLimit"] = 1
    elif pacing == "off":
        config["enableRateLimit"] = False
    return CcxtVenue(DIALECTS[venue], endpoint=origin, timeout_ms=TIMEOUT_MS, config=config).open(
        account
    )


class Timings:
    """Wall seconds and this process's CPU seconds of each call of one phase; over the
    phase, what the emulator counted and the CPU the rest of the machine used."""

    def __init__(self, emulator: Emulator | NoEmulator) -> None:
        self._emulator = emulator
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.requests = 0
        self.venue_cpu = 0.0
        self.window = 0.0
        self.others = 0.0

    @contextlib.contextmanager
    def phase(self) -> Iterator[None]:
        requests, venue_cpu = self._emulator.stats()
        busy, own, wall = machine_seconds()[0], time.process_time(), time.perf_counter()
        yield
        wall, own = time.perf_counter() - wall, time.process_time() - own
        busy = machine_seconds()[0] - busy
        after_requests, after_cpu = self._emulator.stats()
        self.requests += after_requests - requests
        self.venue_cpu += after_cpu - venue_cpu
        self.window += wall
        self.others += busy - own - (after_cpu - venue_cpu)

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        cpu, wall = time.process_time(), time.perf_counter()
        yield
        self.wall.append(time.perf_counter() - wall)
        self.cpu.append(time.process_time() - cpu)

    def summary(self) -> dict[str, Any]:
        calls = max(len(self.wall), 1)
        wall = percentiles(self.wall)
        return {
            "wall_ms": {"p50": wall["p50"], "p90": wall["p90"]},
            "cpu_us": round(sum(self.cpu) * 1e6 / calls, 1),
            "requests": round(self.requests / calls, 2),
            "venue_cpu_us": round(self.venue_cpu * 1e6 / calls, 1),
            "other_cpu_pct": (  # /proc/stat counts in 10 ms ticks: None for a short phase
                round(100 * self.others / self.window, 1) if self.window >= 1 else None
            ),
        }


def core_id(buy: bool) -> str:
    """A client order id as the worker makes them: an order-history id and the step."""
    return f"{uuid.uuid4()}-{'entry' if buy else 'exit'}"


async def place(broker: Broker, venue: str, k: int) -> tuple[str, BrokerOrder]:
    symbol, quantity = ORDER[venue]
    buy = k % 2 == 0
    cid = core_id(buy)
    side = Side.BUY if buy else Side.SELL
    return cid, await broker.place_order(
        cid, symbol, side, quantity, reduce_only=not buy, fresh=True
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one run does: ``orders`` timed placements and status checks after ``warmup``
    untimed ones, with a pause of ``gap`` seconds (not timed) before each timed call."""

    orders: int
    warmup: int
    gap: float


async def one_run(
    broker: Broker, venue: str, emulator: Emulator | NoEmulator, plan: Plan
) -> dict[str, Any]:
    """Warm-up orders, then ``plan.orders`` placements and their status checks, timed."""
    symbol, orders, warmup = ORDER[venue][0], plan.orders, plan.warmup
    connect = time.perf_counter()
    await broker.connect()
    connect = time.perf_counter() - connect
    for k in range(warmup):
        cid, _ = await place(broker, venue, k)
        await broker.order_status(cid, symbol)
    settle_heap()
    placing, checking = Timings(emulator), Timings(emulator)
    placed: list[str] = []
    filled = 0
    with placing.phase():
        for k in range(orders):
            await pause(plan.gap)
            with placing.call():
                cid, order = await place(broker, venue, warmup + k)
            placed.append(cid)
            filled += order.status is BrokerOrderStatus.FILLED
    confirmed = 0
    with checking.phase():
        for cid in placed:
            await pause(plan.gap)
            with checking.call():
                status = await broker.order_status(cid, symbol)
            confirmed += status is not None and status.status is BrokerOrderStatus.FILLED
    return {
        "connect_ms": round(connect * 1000, 1),
        "place": placing.summary(),
        "status": checking.summary(),
        "placed": orders,
        "filled": min(filled, confirmed),
    }


async def pause(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)


async def floor(venue: str, origin: str, requests: int) -> dict[str, Any] | None:
    """The bare round trip: aiohttp GETs of the venue's cheapest endpoint."""
    path = FLOOR_PATH.get(venue)
    if path is None:
        return None
    key, secret = credentials(0)
    headers = {"APCA-API-KEY-ID": key, "APCA-API-SECRET-KEY": secret}  # Alpaca's clock
    timings = Timings(NoEmulator())
    async with aiohttp.ClientSession(origin, headers=headers) as session:
        for k in range(requests + 20):
            measured = k >= 20
            cpu, wall = time.process_time(), time.perf_counter()
            async with session.get(path) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{path}: HTTP {response.status}")
            if measured:
                timings.wall.append(time.perf_counter() - wall)
                timings.cpu.append(time.process_time() - cpu)
    summary = timings.summary()
    return {"path": path, "wall_ms": summary["wall_ms"], "cpu_us": summary["cpu_us"]}


# --- profiling ----------------------------------------------------------------------------

PACKAGES = (  # (label, path fragments), the first match wins
    ("hmac, hashlib, urllib.parse", ("/hmac.py", "/hashlib.py", "/urllib/parse.py")),
    ("json", ("/json/",)),
    ("ccxt", ("/ccxt/",)),
    ("aiohttp, yarl, multidict", ("/aiohttp/", "/yarl/", "/multidict/", "/aiohappyeyeballs/")),
    ("alpaca-py, pydantic", ("/alpaca/", "/pydantic/", "/pydantic_core/")),
    (
        "requests, urllib3, http.client",
        ("/requests/", "/urllib3/", "/http/", "/email/", "/socket.py", "/urllib/request.py"),
    ),
    ("threads (executor)", ("/concurrent/", "/threading.py", "/queue.py")),
    ("asyncio", ("/asyncio/",)),
    ("adapter (tradecore_adapters)", ("/tradecore_adapters/",)),
    ("core (tradecore)", ("/tradecore/",)),
    ("this benchmark", ("/bench/",)),
)
C_PACKAGES = (  # C functions of a package of their own: (label, name fragments)
    ("json", ("json", "orjson")),
    ("hmac, hashlib, urllib.parse", ("_hashlib", "hmac")),
)
NAMED = (  # (label, path fragment, function name): cumulative share
    ("ccxt sign (query, HMAC, headers)", "/ccxt/", "sign"),
    ("ccxt fetch (the HTTP request, aiohttp)", "/ccxt/async_support/base/exchange.py", "fetch"),
    ("ccxt throttle", "/ccxt/", "throttle"),
    ("json.loads", "/json/__init__.py", "loads"),
    ("orjson.loads (ccxt's JSON parser)", "~", "<orjson.loads>"),
    ("ccxt parse_order", "/ccxt/", "parse_order"),
    ("requests: proxies from the environment", "/requests/utils.py", "get_environ_proxies"),
    ("requests: PreparedRequest.prepare", "/requests/models.py", "prepare"),
    ("adapter place_order", "/tradecore_adapters/", "place_order"),
    ("adapter order_status", "/tradecore_adapters/", "order_status"),
)

GENERIC = ("/typing.py", "/abc.py", "/_collections_abc.py", "/enum.py", "/functools.py")
Key = tuple[str, int, str]
WAITS = frozenset(  # C functions in which alpaca-py's threads wait for the venue: not CPU
    {
        "<method 'recv_into' of '_socket.socket' objects>",
        "<method 'recv' of '_socket.socket' objects>",
        "<method 'connect' of '_socket.socket' objects>",
        "<method 'acquire' of '_thread.lock' objects>",
    }
)
NOT_THE_HARNESS = r"^(?!.*(/bench/|asyncio/runners\.py|asyncio/events\.py|asyncio/threads\.py))"
"""A ``pstats`` restriction: every entry but this script's and the event loop's own frames."""


def package(key: Key, stats: dict[Key, Any], seen: frozenset[Key] = frozenset()) -> str:
    """The package a function's self time is charged to: its file's (JSON and HMAC C
    functions: theirs); for any other C function, a frozen module (``os.environ``) or a
    generic helper (``typing``, ``abc``), the package of the caller that spent the most in
    it."""
    filename = key[0]
    if filename == "~":
        for label, fragments in C_PACKAGES:
            if any(fragment in key[2] for fragment in fragments):
                return label
    if not (filename == "~" or filename.startswith("<") or filename.endswith(GENERIC)):
        for label, fragments in PACKAGES:
            if any(fragment in filename for fragment in fragments):
                return label
        return "other"
    callers = {c: edge for c, edge in stats[key][4].items() if c not in seen}
    if not callers:
        return "other"
    caller = max(callers, key=lambda c: callers[c][3])
    return package(caller, stats, seen | {key})


class ProfiledExecutor(ThreadPoolExecutor):
    """The loop's default executor under profiling: each worker thread's calls are profiled
    by a profiler of its own (``asyncio.to_thread`` runs here)."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="profiled")
        self.profiles: list[cProfile.Profile] = []
        self._local = threading.local()
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def profiled() -> Any:
            profile = getattr(self._local, "profile", None)
            if profile is None:
                profile = self._local.profile = cProfile.Profile()
                with self._lock:
                    self.profiles.append(profile)
            profile.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                profile.disable()

        return super().submit(profiled)


async def profiled_run(
    venue: str, emulator: Emulator | NoEmulator, account: int, orders: int, warmup: int, top: int
) -> dict[str, Any]:
    executor = ProfiledExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    broker = open_broker(venue, emulator.origin, "fast", account)
    main = cProfile.Profile()  # perf_counter: the loop's idle time falls outside every frame
    try:
        await broker.connect()
        for k in range(warmup):
            cid, _ = await place(broker, venue, k)
            await broker.order_status(cid, ORDER[venue][0])
        cpu = time.process_time()
        main.enable()
        placed = [(await place(broker, venue, warmup + k))[0] for k in range(orders)]
        for cid in placed:
            await broker.order_status(cid, ORDER[venue][0])
        main.disable()
        cpu = time.process_time() - cpu
    finally:
        await broker.close()
    text = io.StringIO()
    stats = pstats.Stats(main, stream=text)
    for profile in executor.profiles:
        with contextlib.suppress(TypeError):  # a thread that never ran a profiled call
            stats.add(profile)
    stats.sort_stats("cumulative").print_stats(NOT_THE_HARNESS, top)
    print(text.getvalue(), file=sys.stderr)
    return {
        "orders": orders,
        "cpu_us_per_order_profiled": round(cpu * 1e6 / orders, 1),
        **shares(stats, orders),
    }


def shares(stats: pstats.Stats, orders: int) -> dict[str, Any]:
    raw: dict[Key, Any] = stats.stats  # type: ignore[attr-defined]
    waiting = sum(entry[2] for key, entry in raw.items() if key[0] == "~" and key[2] in WAITS)
    total = sum(entry[2] for entry in raw.values()) - waiting or 1.0
    by_package: dict[str, float] = {}
    for key, entry in raw.items():
        if key[0] == "~" and key[2] in WAITS:
            continue
        label = package(key, raw)
        by_package[label] = by_package.get(label, 0.0) + entry[2]
    named: dict[str, float] = {}
    for label, fragment, function in NAMED:
        cumulative = sum(
            entry[3] for key, entry in raw.items() if fragment in key[0] and key[2] == function
        )
        if cumulative:
            named[label] = round(100 * cumulative / total, 1)
    ordered = sorted(by_package.items(), key=lambda item: -item[1])
    return {
        "self_cpu_pct_by_package": {
            k: round(100 * v / total, 1) for k, v in ordered if v >= total / 1000
        },
        "cumulative_cpu_pct": named,
        "threads_waiting_ms_per_order": round(waiting * 1000 / orders, 3),
    }


# --- the runs -----------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    pacings = args.pacing if args.venue in CCXT else ["none"]
    runs = len(pacings) * args.repeat + (1 if args.profile else 0)
    emulator: Emulator | NoEmulator = (
        NoEmulator() if args.venue == "paper" else Emulator(args.venue, runs)
    )
    try:
        results: list[dict[str, Any]] = []
        plan = Plan(args.orders, args.warmup, args.gap)
        account = 0
        for pacing in pacings:
            for repeat in range(args.repeat):
                broker = open_broker(args.venue, emulator.origin, pacing, account)
                try:
                    done = await one_run(broker, args.venue, emulator, plan)
                finally:
                    await broker.close()
                account += 1
                limit = rate_limit_ms(args.venue, pacing)
                results.append({"pacing": pacing, "rate_limit_ms": limit, **done})
                print(f"{pacing} run {repeat + 1}: {done}", file=sys.stderr)
        bare = await floor(args.venue, emulator.origin, FLOOR_REQUESTS)
        profile = None
        if args.profile:
            profile = await profiled_run(
                args.venue, emulator, account, args.orders, args.warmup, args.top
            )
    finally:
        emulator.stop()
    return {
        "venue": args.venue,
        "orders": args.orders,
        "repeat": args.repeat,
        "gap_s": args.gap,
        "loop": "asyncio" if loop_factory() is None else "uvloop",
        "placed": sum(r["placed"] for r in results),
        "filled": sum(r["filled"] for r in results),
        "floor": bare,
        "runs": results,
        "profile": profile,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venue", choices=VENUES, required=True)
    parser.add_argument("--orders", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20, help="orders before each run")
    parser.add_argument(
        "--pacing",
        type=lambda text: text.split(","),
        default=["venue", "fast"],
        help="ccxt runs, comma-separated: venue (ccxt's rateLimit), fast (rateLimit 1 ms), "
        "off (no rate limiter); default venue,fast",
    )
    parser.add_argument(
        "--gap", type=float, default=0.0, help="seconds of pause before each timed call"
    )
    parser.add_argument("--profile", action="store_true", help="one more run under cProfile")
    parser.add_argument("--top", type=int, default=25, help="profile lines on stderr")
    args = parser.parse_args()
    if not args.pacing or any(p not in PACINGS for p in args.pacing):
        parser.error(f"--pacing takes a comma-separated list of {', '.join(PACINGS)}")
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        result = runner.run(run(args))
    print(result)


if __name__ == "__main__":
    main()
