"""How a group-commit batch refuses one duplicate without failing the others: the cost of
``INSERT ... ON CONFLICT DO NOTHING RETURNING`` against per-row savepoints, and of both against
one commit per order (before group commit).

Each variant writes ``--batches`` batches of ``--size`` order-history-like rows into a
throwaway database (one row in ``--duplicate-every`` repeats an earlier row's fingerprint) and
reports per row: wall time, this process's CPU, and the server round trips (pipeline syncs)
per batch.

* ``autocommit``: one INSERT ... ON CONFLICT DO NOTHING per row, each its own commit (the
  order history before group commit).
* ``on_conflict``: the batch in one transaction sent as one pipeline, each row
  ``ON CONFLICT DO NOTHING RETURNING id`` (what ``PostgresOrderHistory.add`` does); a refused
  row returns no id.
* ``savepoints``: the batch in one transaction, each row a plain INSERT between ``SAVEPOINT``
  and ``RELEASE``; a unique violation is undone with ``ROLLBACK TO SAVEPOINT``. An error
  aborts the rest of a pipeline, so each row must be its own round trip (a sync).

    .venv/bin/python bench/real_mode/refusals.py --size 32 --batches 100

Postgres (``BENCH_PG_ADMIN``, default the local server, user postgres) must be up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

ADMIN_URL = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
TABLE = (
    "CREATE TABLE intents (id text PRIMARY KEY, user_id text NOT NULL, fingerprint text,"
    " body text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
)
UNIQUE = "CREATE UNIQUE INDEX intents_fp ON intents (user_id, fingerprint)"
ON_CONFLICT = (
    "INSERT INTO intents (id, user_id, fingerprint, body) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (user_id, fingerprint) DO NOTHING RETURNING id"
)
PLAIN = "INSERT INTO intents (id, user_id, fingerprint, body) VALUES (%s, %s, %s, %s)"

Row = tuple[str, str, str, str]
Conn = psycopg.AsyncConnection[Any]


def batch_rows(batch: int, size: int, duplicate_every: int) -> list[Row]:
    rows: list[Row] = []
    for n in range(size):
        user, fingerprint = f"u-{n % 50}", f"fp-{batch}-{n}"
        if duplicate_every and n % duplicate_every == duplicate_every - 1:
            user, fingerprint = "u-0", f"fp-{batch}-0"  # a replay of the batch's first alert
        rows.append((f"o-{batch}-{n}", user, fingerprint, "x" * 200))
    return rows


async def autocommit(conn: Conn, rows: list[Row]) -> tuple[int, int]:
    refused = 0
    for row in rows:
        cur = await conn.execute(ON_CONFLICT, row)
        refused += await cur.fetchone() is None
    return refused, len(rows)


async def on_conflict(conn: Conn, rows: list[Row]) -> tuple[int, int]:
    cursors = []
    async with conn.pipeline(), conn.transaction():
        for row in rows:
            cur = conn.cursor()
            await cur.execute(ON_CONFLICT, row)
            cursors.append(cur)
    refused = sum([await c.fetchone() is None for c in cursors])
    return refused, 1


async def savepoints(conn: Conn, rows: list[Row]) -> tuple[int, int]:
    refused = 0
    async with conn.transaction():
        for row in rows:
            try:
                async with conn.transaction():  # a savepoint, released or rolled back to
                    await conn.execute(PLAIN, row)
            except psycopg.errors.UniqueViolation:
                refused += 1
    return refused, 3 * len(rows) + 2  # BEGIN, then SAVEPOINT, INSERT, RELEASE a row, COMMIT


VARIANTS: dict[str, Callable[[Conn, list[Row]], Awaitable[tuple[int, int]]]] = {
    "autocommit": autocommit,
    "on_conflict": on_conflict,
    "savepoints": savepoints,
}


async def measure(conninfo: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    variant = VARIANTS[name]
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("TRUNCATE intents")
        refused = trips = 0
        wall, cpu = time.perf_counter(), time.process_time()
        for batch in range(args.batches):
            got, syncs = await variant(conn, batch_rows(batch, args.size, args.duplicate_every))
            refused += got
            trips += syncs
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        cur = await conn.execute("SELECT count(*) FROM intents")
        stored = (await cur.fetchone() or (0,))[0]
    rows = args.batches * args.size
    return {
        "variant": name,
        "rows": rows,
        "stored": stored,
        "refused": refused,
        "wall_us_per_row": round(wall / rows * 1e6, 1),
        "client_cpu_us_per_row": round(cpu / rows * 1e6, 1),
        "round_trips_per_batch": trips / args.batches,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--duplicate-every", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    name = f"tradecore_refusals_{secrets.token_hex(4)}"
    async with await psycopg.AsyncConnection.connect(ADMIN_URL, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    conninfo = make_conninfo(ADMIN_URL, dbname=name)
    try:
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            await conn.execute(TABLE)
            await conn.execute(UNIQUE)
        for _ in range(args.repeat):
            for variant in VARIANTS:
                print(await measure(conninfo, variant, args), flush=True)
    finally:
        async with await psycopg.AsyncConnection.connect(ADMIN_URL, autocommit=True) as admin:
            await admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


if __name__ == "__main__":
    asyncio.run(main())
