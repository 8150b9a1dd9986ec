"""A local venue emulator from ``tests/venues`` in a process of its own, for
``bench/venue_adapter.py``: the emulator's CPU is not counted in the benchmark's process.

It starts the emulator (``binanceusdm``, ``binance`` (spot), ``bybit`` or ``alpaca``) on
127.0.0.1 at ``--port`` (0: a free port), adds ``--accounts`` accounts (``bench-key-<k>``,
``bench-secret-<k>``, 10,000,000 of cash each, so that no run depends on the last) and sets
the price of the benchmark's symbol (BTCUSDT 60,000; AAPL 190.50, the market open). Then it
prints one JSON line, ``{"origin": ..., "port": ..., "pid": ...}``, and serves (on uvloop
where installed, as ``tradecore serve`` does).

Each line ``stats`` on stdin is answered with one JSON line on stdout: the requests the
emulator has received so far and the CPU its process has used (seconds). It stops at the end
of stdin, or on SIGTERM (the only way when stdin is not a pipe: it is not read then).

Run from the repository root: ``.venv/bin/python bench/venue_server.py --venue bybit``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import stat
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from aiohttp import web

from tradecore_entrypoints.loop import run_fast
from venues.alpaca import AlpacaVenue
from venues.base import LocalVenue
from venues.binance import BinanceVenue
from venues.bybit import BybitVenue

VENUES = ("binanceusdm", "binance", "bybit", "alpaca")
CASH = Decimal(10_000_000)
SYMBOLS = {"alpaca": ("AAPL", Decimal("190.50"))}
DEFAULT_SYMBOL = ("BTCUSDT", Decimal(60000))


def credentials(k: int) -> tuple[str, str]:
    """The API key and secret of the emulator's ``k``-th account."""
    return f"bench-key-{k:04d}", f"bench-secret-{k:04d}"


def emulator(venue: str, accounts: int) -> LocalVenue:
    made: Any
    if venue in ("binanceusdm", "binance"):
        made = BinanceVenue(default_market="usdm" if venue == "binanceusdm" else "spot")
    elif venue == "bybit":
        made = BybitVenue()
    else:
        made = AlpacaVenue()
        made.set_market_open(True)
    for k in range(accounts):
        made.add_account(*credentials(k), cash=CASH)
    made.set_price(*SYMBOLS.get(venue, DEFAULT_SYMBOL))
    return made


async def serve(venue: str, port: int, accounts: int) -> None:
    local = emulator(venue, accounts)
    runner = web.AppRunner(local.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server: Any = site._server
    local.port = server.sockets[0].getsockname()[1]
    say({"origin": local.origin, "port": local.port, "pid": os.getpid()})
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    reader = asyncio.create_task(commands(local, stop)) if _piped() else None
    try:
        await stop.wait()
    finally:
        if reader is not None:
            reader.cancel()
        await runner.cleanup()


async def commands(local: LocalVenue, stop: asyncio.Event) -> None:
    stdin = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(stdin)
    await asyncio.get_running_loop().connect_read_pipe(lambda: protocol, sys.stdin)
    while line := await stdin.readline():
        if line.strip() == b"stats":
            say({"requests": len(local.requests), "cpu_s": time.process_time()})
    stop.set()


def _piped() -> bool:
    """Whether stdin is a pipe (the benchmark's); anything else is not read."""
    return stat.S_ISFIFO(os.fstat(sys.stdin.fileno()).st_mode)


def say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venue", choices=VENUES, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--accounts", type=int, default=16)
    args = parser.parse_args()
    run_fast(serve(args.venue, args.port, args.accounts))


if __name__ == "__main__":
    main()
