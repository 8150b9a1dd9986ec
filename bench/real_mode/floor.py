"""The round-trip floor of this machine: how many HTTP requests per second an aiohttp server
answers when each request makes N Redis GETs and M pooled Postgres ``SELECT 1`` (no logic, no
writes), against a closed-loop aiohttp client at concurrency 16. The same libraries and
loop as `tradecore serve` (aiohttp, redis-py with hiredis, psycopg 3 with psycopg_pool,
uvloop). Postgres and Redis must be up on 127.0.0.1.

    .venv/bin/python bench/real_mode/floor.py                  # the default configurations
    .venv/bin/python bench/real_mode/floor.py 4:4 8:8          # REDIS:POSTGRES pairs
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


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--serve":
        import uvloop

        uvloop.run(serve(int(sys.argv[2]), int(sys.argv[3])))
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
