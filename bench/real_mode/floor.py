"""The round-trip floor of this machine: how many HTTP requests per second an aiohttp server
answers when each request makes N Redis GETs and M pooled Postgres ``SELECT 1`` (no logic, no
writes), against a closed-loop aiohttp client at concurrency 16. The same libraries and
loop as `tradecore serve` (aiohttp, redis-py with hiredis, psycopg 3 with psycopg_pool,
uvloop). Postgres and Redis must be up on 127.0.0.1.

    .venv/bin/python bench/real_mode/floor.py                  # the default configurations
    .venv/bin/python bench/real_mode/floor.py 4:4 8:8          # REDIS:POSTGRES pairs
    .venv/bin/python bench/real_mode/floor.py --paced 50,200,1000 0:0

``--paced RATES`` sends the requests on a fixed schedule instead (open loop, ``PACED_S``
seconds at each rate) and reports the CPU that the server process and the client spent per
request (the scheduler's run time, ``/proc/PID/schedstat``): on a virtual machine whose idle
CPUs halt, a process woken from sleep pays for it, so a request costs more CPU the fewer
arrive per second. It is the floor under the real-mode benchmark's CPU per order at a rate.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import aiohttp

PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_HOST = "127.0.0.1"
PORT = 8111
CONCURRENCY = 16
DURATION_S = 8.0
DEFAULT = ["0:0", "4:0", "0:4", "4:4", "8:8"]
PACED_S = 10.0


def run_seconds(pid: int) -> float:
    """CPU time the scheduler gave the process's main thread (ns precision)."""
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0]) / 1e9


async def serve(redis_calls: int, pg_calls: int) -> None:
    import redis.asyncio as redis
    from aiohttp import web
    from psycopg_pool import AsyncConnectionPool

    client = redis.Redis(host=REDIS_HOST, max_connections=64)
    pool: AsyncConnectionPool = AsyncConnectionPool(
        PG_URL, min_size=4, max_size=10, open=False, kwargs={"autocommit": True}
    )
    await pool.open()

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        for _ in range(redis_calls):
            await client.get("floor")
        for _ in range(pg_calls):
            async with pool.connection() as conn:
                await (await conn.execute("SELECT 1")).fetchone()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/x", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", PORT).start()
    await asyncio.Event().wait()


async def load() -> float:
    done = 0
    end = time.monotonic() + DURATION_S
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < end:
                async with session.post(f"http://127.0.0.1:{PORT}/x", data=b"{}") as reply:
                    await reply.read()
                done += 1

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return done / DURATION_S


async def paced(rate: float, server_pid: int) -> tuple[float, float]:
    """Server and client CPU per request (us) with ``rate`` requests/s for ``PACED_S`` s."""
    count = int(rate * PACED_S)
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            async with session.post(f"http://127.0.0.1:{PORT}/x", data=b"{}") as reply:
                await reply.read()

        await one()  # the connection is open before the clock starts
        server_before, client_before = run_seconds(server_pid), run_seconds(os.getpid())
        start = time.monotonic()
        sends = []
        for index in range(count):
            await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
            sends.append(asyncio.create_task(one()))
        await asyncio.gather(*sends)
        server = run_seconds(server_pid) - server_before
        client = run_seconds(os.getpid()) - client_before
    return server / count * 1e6, client / count * 1e6


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--serve":
        import uvloop

        uvloop.run(serve(int(sys.argv[2]), int(sys.argv[3])))
        return
    if len(sys.argv) >= 3 and sys.argv[1] == "--paced":
        rates = [float(r) for r in sys.argv[2].split(",")]
        print(
            "| Redis GETs | Postgres SELECTs | requests/s | server CPU/request (us) | client (us) |"
        )
        print("|---|---|---|---|---|")
        for pair in sys.argv[3:] or ["0:0"]:
            redis_calls, pg_calls = (int(x) for x in pair.split(":"))
            server = subprocess.Popen(
                [sys.executable, __file__, "--serve", str(redis_calls), str(pg_calls)]
            )
            try:
                time.sleep(1.5)
                for rate in rates:
                    cpu = asyncio.run(paced(rate, server.pid))
                    row = (redis_calls, pg_calls, f"{rate:.0f}", f"{cpu[0]:.0f}", f"{cpu[1]:.0f}")
                    print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
            finally:
                server.terminate()
                server.wait()
        return
    print("| Redis GETs | Postgres SELECTs | requests/s |\n|---|---|---|")
    for pair in sys.argv[1:] or DEFAULT:
        redis_calls, pg_calls = (int(x) for x in pair.split(":"))
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(redis_calls), str(pg_calls)]
        )
        try:
            time.sleep(1.5)
            rate = asyncio.run(load())
        finally:
            server.terminate()
            server.wait()
        print(f"| {redis_calls} | {pg_calls} | {rate:.0f} |", flush=True)


if __name__ == "__main__":
    main()
