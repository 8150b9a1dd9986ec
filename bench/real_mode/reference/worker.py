"""The reference design's worker host: executes the orders the API processes pushed.

A measuring instrument for issue 13, not product code. Each step does the work of one of
tradecore's (``src/tradecore/services/execution/``), named in brackets:

1. ONE dispatcher pops up to ``POP`` requests at once from the hosts' shared list (BLMPOP,
   blocking only while it is empty) into per-user asyncio queues [``WorkerHost``: one request
   list, lease and wake-up per user];
2. one task per user runs that user's orders in order [``UserWorker``];
3. paper execution from the user's book in memory (loaded from Postgres at the user's first
   order): the order fills at once at the instrument's fixed price, under tradecore's margin
   rule; the client order id is ``{order_id}-entry`` / ``-exit`` [``PersistentPaperBroker``
   without added latency, ``reversal.plan``'s one step];
4. the outcome and the user's book in ONE compare-and-set from queued to filled per order,
   the batch's orders of every user in ONE statement and ONE commit (``GroupCommit``) [the
   ``ClaimedAndExecuted`` transition with the book's documents saved with it]; a row no longer
   queued (a duplicate delivery, a recovery) writes nothing and is answered from the row;
5. for the whole batch, ONE pipeline: each reply stored under its key (``REPLY_TTL_S``) and
   published on its API's channel, and the fill checks scheduled 2-3 s later [the
   ``complete`` script and ``FillTaskQueue.send``];
6. the fill verifier: the due checks taken by one script (moved in flight for 180 s), their
   rows read by ONE SELECT and compared with the paper broker's record of the order; only a
   row that differs is written (ONE UPDATE), as tradecore's verifier writes only what differs
   (nothing, for a fill the placement recorded); one ZREM acknowledges the batch
   [``FillVerifier.run_batch``];
7. recovery: at start every queued row is pushed again, then every ``SWEEP_S`` those queued
   for longer (a failed push: the API answered 202) [queued recovery, orphan sweep]. No row is
   ever left ``submitted``: claim and outcome are one write, as on tradecore's one-step paper
   path, so a crash leaves the row queued and the book unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import signal
import time
from decimal import Decimal
from typing import Any

import orjson
import psycopg
import psycopg_pool
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from reference.api import MAX_BATCH, QUEUE, REPLY_KEY, REPLY_TTL_S, GroupCommit, plain
from tradecore_entrypoints.loop import run_fast, settle_heap  # worker's loop and heap tuning

log = logging.getLogger("reference.worker")

POP = 256
FILLS = "ref:fills"  # order id -> when its check is due (s)
IN_FLIGHT = "ref:fills:inflight"  # order id -> when it is delivered again (s)
VISIBILITY_S = 180.0
SWEEP_S = 30.0
CASH = Decimal(100_000)  # the paper broker's starting cash
PRICES = {"BTCUSDT": Decimal(60000), "ETHUSDT": Decimal(3000)}  # its catalogue's prices
MARGIN = Decimal("0.1")
ZERO = Decimal(0)
ROW = "id, request_id, status, symbol, action, quantity, fill_quantity, fill_price, position_before"

RESULT_COLUMNS = (
    "id text, status text, client_order_id text, fill_price numeric, fill_quantity numeric, "
    "position_before numeric, user_id text, cash numeric, holdings jsonb"
)
# Step 4 in one statement: each order's compare-and-set from queued, and the book of each
# order whose compare-and-set took (one order per user in a batch: a user's next order waits
# for this one's commit).
RESULT_SQL = f"""
WITH v AS (SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS v({RESULT_COLUMNS})),
done AS (
  UPDATE intents AS i SET status = v.status, client_order_id = v.client_order_id,
    fill_price = v.fill_price, fill_quantity = v.fill_quantity,
    position_before = v.position_before,
    filled_at = CASE WHEN v.status = 'filled' THEN now() END
  FROM v WHERE i.id = v.id AND i.status = 'queued' RETURNING i.id),
book AS (
  INSERT INTO books (user_id, cash, holdings)
  SELECT v.user_id, v.cash, v.holdings FROM v JOIN done USING (id)
  ON CONFLICT (user_id) DO UPDATE SET cash = excluded.cash, holdings = excluded.holdings)
SELECT id FROM done
"""
# Step 6. KEYS: due checks, in flight. ARGV: now, most, visible again at. The due checks (and
# the in-flight ones past their visibility) move in flight; also when the next one is due.
RECEIVE_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local again = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(again) do table.insert(due, id) end
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], ARGV[3], id)
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {due, head[2] or ''}
"""


def execute(book: dict[str, Any], request: dict[str, Any]) -> tuple[dict[str, Any], dict]:
    """Step 3: the book after the order and the order's outcome (a pure function). A buy
    opens or adds long, a sell short; an exit (or a close) only reduces what is held."""
    symbol, action = request["symbol"], request["action"]
    quantity, price = Decimal(request["quantity"]), PRICES.get(request["symbol"], ZERO)
    holdings = dict(book["holdings"])
    held, average = holdings.get(symbol, (ZERO, ZERO))
    held, average = Decimal(held), Decimal(average)
    side = 1 if action in ("buy", "close_short") else -1
    reducible = abs(held) if held * side < 0 else ZERO
    if action.startswith("close"):
        fill = reducible
    elif request["order_type"] == "exit":
        fill = min(quantity, reducible)
    else:
        fill = quantity
    closing, opening = min(fill, reducible), fill - min(fill, reducible)
    cash = book["cash"] + closing * (price - average) * (1 if held > 0 else -1)
    used = sum((abs(Decimal(q)) * PRICES[s] * MARGIN for s, (q, _) in holdings.items()), ZERO)
    status = "filled" if fill > 0 else "no_position"
    if opening * price * MARGIN > cash - used + closing * price * MARGIN:
        status, fill, cash = "rejected", ZERO, book["cash"]  # insufficient margin
    else:
        if opening:
            average = (abs(held) * average + opening * price) / (abs(held) + opening)
        held += side * fill
        holdings[symbol] = (plain(held), plain(average))
        if held == 0:
            del holdings[symbol]
    client_order_id = f"{request['id']}-{'entry' if opening else 'exit'}" if fill else None
    row = {
        "id": request["id"],
        "status": status,
        "client_order_id": client_order_id,
        "fill_price": plain(price) if fill else None,
        "fill_quantity": plain(fill),
        "position_before": plain(Decimal(book["holdings"].get(symbol, (ZERO,))[0])),
        "user_id": request["user_id"],
        "cash": plain(cash),
        "holdings": holdings,
    }
    return {"cash": cash, "holdings": holdings}, row


def result(row: dict[str, Any]) -> bytes:
    """The OrderResult as the API answers it (tradecore's ``views.order_result`` fields)."""
    filled = row["status"] == "filled"
    return orjson.dumps(
        {
            "order_id": row["id"],
            "request_id": row["request_id"],
            "status": row["status"],
            "symbol": row["symbol"],
            "action": row["action"],
            "quantity": plain(Decimal(row["quantity"])),
            "filled_quantity": plain(Decimal(row["fill_quantity"])),
            "fill_price": None if row["fill_price"] is None else plain(Decimal(row["fill_price"])),
            "auto_exit": False,
            "exit_quantity": "0",
            "position_before": plain(Decimal(row["position_before"] or 0)),
            "simulation": False,
            "error": None if row["status"] != "rejected" else {"code": "insufficient_margin"},
            "broker_refs": [f"paper-{row['id']}"] if filled else [],
        }
    )


class Host:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.redis = aioredis.Redis.from_url(args.redis_url)
        self.pool = psycopg_pool.AsyncConnectionPool(args.database_url, min_size=2, open=False)
        self.conn: psycopg.AsyncConnection[Any] | None = None  # the group commit's own
        self.results = GroupCommit(self._write, MAX_BATCH)
        self.receive = self.redis.register_script(RECEIVE_LUA)
        self.queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.books: dict[str, dict[str, Any]] = {}
        self.placed: dict[str, tuple[str, str]] = {}  # the paper broker's fills, by order id
        self.tasks: set[asyncio.Task[None]] = set()  # one per user

    async def dispatch(self) -> None:
        """Step 1: many requests per pop, each to its user's queue (and task)."""
        while True:
            try:
                popped = await self.redis.blmpop(1, 1, QUEUE, direction="LEFT", count=POP)
            except RedisError as e:
                log.warning("pop failed: %r", e)
                await asyncio.sleep(0.1)
                continue
            for raw in popped[1] if popped else ():
                request = orjson.loads(raw)
                queue = self.queues.get(request["user_id"])
                if queue is None:
                    queue = self.queues[request["user_id"]] = asyncio.Queue()
                    self.tasks.add(asyncio.create_task(self.user(request["user_id"], queue)))
                queue.put_nowait(request)

    async def user(self, user_id: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        """Step 2: this user's orders, one at a time, in order."""
        while True:
            request = await queue.get()
            try:
                book = self.books.get(user_id) or await self.load_book(user_id)
                after, row = execute(book, request)
                if await self.results.submit({"row": row, "request": request}):
                    self.books[user_id] = after
                    if row["status"] == "filled":
                        self.placed[row["id"]] = (row["fill_quantity"], row["fill_price"])
                else:
                    self.books.pop(user_id, None)  # not taken: the stored book holds
            except Exception:  # the row stays queued: the sweep pushes it again
                log.exception("order %s failed", request["id"])
                self.books.pop(user_id, None)

    async def load_book(self, user_id: str) -> dict[str, Any]:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT cash, holdings FROM books WHERE user_id = %s", (user_id,)
            )
            found = await cursor.fetchone()
        if found is None:
            return {"cash": CASH, "holdings": {}}
        return {"cash": found[0], "holdings": {s: tuple(h) for s, h in found[1].items()}}

    async def _write(self, items: list[dict[str, Any]]) -> list[bool]:
        """Steps 4 and 5 for a batch: one statement, one commit, one pipeline."""
        if self.conn is None or self.conn.broken:
            self.conn = await psycopg.AsyncConnection.connect(
                self.args.database_url, autocommit=True
            )
        rows = orjson.dumps([item["row"] for item in items]).decode()
        cursor = await self.conn.execute(RESULT_SQL, {"rows": rows})
        taken = {found[0] for found in await cursor.fetchall()}
        lost = [item["row"]["id"] for item in items if item["row"]["id"] not in taken]
        stored = {}
        if lost:  # answered from the row as it stands
            cursor = await self.conn.execute(
                f"SELECT {ROW} FROM intents WHERE id = ANY(%s)", (lost,)
            )
            names = [c.name for c in cursor.description]
            stored = {r[0]: dict(zip(names, r, strict=True)) for r in await cursor.fetchall()}
        pipe = self.redis.pipeline(transaction=False)
        checks = {}
        for item in items:
            request, row = item["request"], item["row"]
            if row["id"] in taken:
                reply = result({**request, **row})
                if row["status"] == "filled":
                    checks[row["id"]] = time.time() + 2.0 + 0.9 * random.random()
            elif row["id"] in stored:
                reply = result(stored[row["id"]])
            else:
                continue
            pipe.set(REPLY_KEY + request["request_id"], reply, ex=REPLY_TTL_S)
            pipe.publish(request["reply_to"], request["request_id"].encode() + b" " + reply)
        if checks:
            pipe.zadd(FILLS, checks)
        await pipe.execute()
        return [item["row"]["id"] in taken for item in items]

    async def verify(self) -> None:
        """Step 6: the fill checks in batches; a row is written only if it differs."""
        while True:
            wait = 1.0
            try:
                now = time.time()
                due, head = await self.receive(
                    keys=[FILLS, IN_FLIGHT], args=[now, 500, now + VISIBILITY_S]
                )
                if head:
                    wait = min(1.0, max(0.1, float(head) - now))  # gathering 0.1 s, as tradecore
                if due:
                    await self.check([d.decode() for d in due])
            except (RedisError, psycopg.Error) as e:
                log.warning("fill verification: %r", e)
            await asyncio.sleep(wait)

    async def check(self, ids: list[str]) -> None:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT id, fill_quantity, fill_price FROM intents WHERE id = ANY(%s)", (ids,)
            )
            differ = []
            for order_id, quantity, price in await cursor.fetchall():
                observed = self.placed.pop(order_id, None)  # the paper broker's view
                if observed is not None and observed != (plain(quantity), plain(price)):
                    differ.append((order_id, *observed))
            if differ:
                await conn.execute(
                    "UPDATE intents AS i SET fill_quantity = v.q::numeric,"
                    " fill_price = v.p::numeric"
                    " FROM unnest(%s::text[], %s::text[], %s::text[]) AS v(id, q, p)"
                    " WHERE i.id = v.id",
                    tuple(map(list, zip(*differ, strict=True))),
                )
        await self.redis.zrem(IN_FLIGHT, *ids)

    async def sweep(self) -> None:
        """Step 7: queued rows pushed again: all at start, then those older than SWEEP_S."""
        older = "0 seconds"
        while True:
            try:
                async with self.pool.connection() as conn:
                    cursor = await conn.execute(
                        "SELECT id, request_id, user_id, account_id, symbol, action, order_type,"
                        " quantity, reply_to FROM intents WHERE status = 'queued'"
                        " AND created_at <= now() - %s::interval ORDER BY created_at",
                        (older,),
                    )
                    names = [c.name for c in cursor.description]
                    rows = [dict(zip(names, r, strict=True)) for r in await cursor.fetchall()]
                for row in rows:
                    row["quantity"] = plain(row["quantity"])
                if rows:
                    log.warning("recovery: %d queued orders pushed again", len(rows))
                    await self.redis.rpush(QUEUE, *(orjson.dumps(r) for r in rows))
            except (RedisError, psycopg.Error) as e:
                log.warning("sweep: %r", e)
            older = f"{SWEEP_S} seconds"
            await asyncio.sleep(SWEEP_S)


async def run(args: argparse.Namespace) -> None:
    host = Host(args)
    await host.pool.open(wait=True)
    tasks = [asyncio.create_task(c) for c in (host.sweep(), host.dispatch(), host.verify())]
    settle_heap()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for task in tasks:
        task.cancel()
    await host.pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    run_fast(run(args))


if __name__ == "__main__":
    main()
