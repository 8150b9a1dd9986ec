"""Client CPU per order-history write, with and without merged statements (issue 13).

N concurrent tasks each write one order's life through ``PostgresOrderHistory`` on group
commit: the intent (``add``), the claim (``transition`` to ``Submitted``) and the result
(``transition`` to ``Executed``), each phase gathered over the N tasks, for R rounds. The same
run is made with the batch's writes merged into one statement per kind
(``group_commit.Merge``, ``order_writes``) and with every write its own statement in the
batch's pipeline (the path before merging: the statements' ``merge`` dropped). Printed per
mode and phase: writes, wall time, client CPU (this process's ``time.process_time()``) per
write, and writes per second.

    .venv/bin/python bench/merged_writes.py --tasks 64 --rounds 30 --repeat 3

A scratch database (``tradecore_bench_<random>``) is created through ``--admin-url``, migrated,
filled with ``--rows-per-month`` finished orders in each of ``--months`` monthly partitions
(the current month and the ones before it), and dropped at the end. The bench's own orders
are spread over those months too, so the merged UPDATE meets every partition. ``--explain``
prints instead EXPLAIN ANALYZE of one merged claim of ``--tasks`` queued orders, as a custom
plan and as the generic plan of a prepared statement. The server runs on the same machine,
so wall times include its work; the CPU figure is the client's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tradecore.order_lifecycle import Executed, Submitted
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderStatus,
    OrderType,
    Source,
)
from tradecore_adapters.postgres import Pool, PostgresOrderHistory, migrate, open_pool
from tradecore_adapters.postgres.group_commit import (
    Statement,
    StatementBatcher,
    StatementResult,
    shared_batcher,
)
from tradecore_adapters.postgres.order_writes import transition_merge
from tradecore_adapters.postgres.partitions import add_months, maintain_partitions, month_start


class _Unmerged:
    """The shared batcher, each statement sent as its own (the path before merging)."""

    def __init__(self, batcher: StatementBatcher) -> None:
        self._batcher = batcher

    async def run(self, statement: Statement) -> StatementResult:
        return await self._batcher.run(attrs.evolve(statement, merge=None))


def _months(now: datetime, count: int) -> list[datetime]:
    """The first instants of the current month and the ``count - 1`` before it."""
    start = month_start(now)
    return [add_months(start, -n) for n in range(count)]


async def _prepare(conninfo: str, months: list[datetime], rows_per_month: int) -> None:
    """A user and account, and ``rows_per_month`` filled orders in each month's partition."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO users (id, email, email_key, password_hash, plan, created_at)"
            " VALUES ('u1', 'a@example.com', 'a@example.com', 'x', 'pro', now())"
        )
        await conn.execute(
            "INSERT INTO trading_accounts (id, user_id, name, broker_name,"
            " webhook_token_hash, webhook_secret_hash, created_at, max_request_age,"
            " max_quantity) VALUES ('a1', 'u1', 'Main', 'paper', 'h', 's', now(), 300, 10)"
        )
        for month in months:
            # Spread over the month's first 27 days, so every row stays inside it.
            params = {"month": month, "rows": rows_per_month}
            await conn.execute(
                "INSERT INTO order_keys (id, user_id, created_at, fingerprint)"
                " SELECT md5(%(month)s::text || n), 'u1', %(month)s::timestamptz"
                " + (n %% 27) * interval '1 day' + n * interval '1 ms', NULL"
                " FROM generate_series(1, %(rows)s) AS n",
                params,
            )
        await conn.execute(
            "INSERT INTO order_history (id, user_id, trading_account_id, broker_name, symbol,"
            " action, quantity, order_type, source, simulation, status, created_at,"
            " request_id) SELECT id, user_id, 'a1', 'paper', 'BTCUSDT', 'buy', 0.01, 'entry',"
            " 'webhook', false, 'filled', created_at, 'r' FROM order_keys"
        )
    # Past months' rows landed in the DEFAULT partition: the job moves them into their own.
    await maintain_partitions(conninfo, now=months[0], months_ahead=1)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE order_keys")
        await conn.execute("VACUUM ANALYZE order_history")


def _order(order_id: str, created_at: datetime) -> OrderHistoryRecord:
    return OrderHistoryRecord(
        id=order_id,
        user_id="u1",
        trading_account_id="a1",
        broker_name="paper",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        quantity=Decimal("0.010"),
        order_type=OrderType.ENTRY,
        source=Source.WEBHOOK,
        simulation=False,
        status=OrderStatus.QUEUED,
        created_at=created_at,
        request_id=f"req-{order_id}",
        fingerprint=f"fp-{order_id}",
    )


def _outcome(now: datetime) -> Executed:
    return Executed(
        status=OrderStatus.FILLED,
        order_id="paper-2",
        client_order_id="o-entry",
        broker_refs=("paper-1", "paper-2"),
        fill_price=Decimal("100.50"),
        fill_quantity=Decimal("0.010"),
        filled_at=now,
        auto_exit=False,
        exit_quantity=Decimal(0),
        exit_order_result=None,
        error=None,
        placed_at=now,
    )


async def _run(
    pool: Pool, months: list[datetime], tasks: int, rounds: int, merged: bool, tag: str
) -> dict[str, Any]:
    history = PostgresOrderHistory(pool)
    if not merged:
        history._batcher = _Unmerged(shared_batcher(pool))  # type: ignore[assignment]
    now = datetime.now(UTC)
    claim = Submitted(now, Decimal(0))
    outcome = _outcome(now)
    spent = {"add": [0.0, 0.0], "claim": [0.0, 0.0], "result": [0.0, 0.0]}

    async def phase(name: str, writes: list[Any]) -> None:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        results = await asyncio.gather(*writes)
        spent[name][0] += time.process_time() - cpu0
        spent[name][1] += time.perf_counter() - wall0
        if name != "add" and not all(results):
            raise RuntimeError(f"{name}: a transition found nothing to change")

    for round_ in range(-1, rounds):  # round -1 warms up: connections, prepared statements
        ids = [f"{tag}-{round_}-{n}" for n in range(tasks)]
        records = [
            _order(i, months[n % len(months)] + (now - months[0])) for n, i in enumerate(ids)
        ]
        for name, writes in (
            ("add", [history.add(r) for r in records]),
            ("claim", [history.transition(i, claim) for i in ids]),
            ("result", [history.transition(i, outcome) for i in ids]),
        ):
            if round_ < 0:
                await asyncio.gather(*writes)
            else:
                await phase(name, writes)
    report: dict[str, Any] = {"mode": "merged" if merged else "single", "tasks": tasks}
    count = tasks * rounds
    for name, (cpu, wall) in spent.items():
        report[name] = {
            "writes": count,
            "wall_s": round(wall, 3),
            "cpu_us_per_write": round(cpu / count * 1e6, 1),
            "writes_per_s": round(count / wall),
        }
    return report


async def _explain(pool: Pool, conninfo: str, months: list[datetime], tasks: int) -> None:
    """EXPLAIN ANALYZE of one merged claim of ``tasks`` queued orders over the months, as a
    custom plan and as a prepared statement's generic plan (each rolled back)."""
    history = PostgresOrderHistory(pool)
    now = datetime.now(UTC)
    ids = [f"explain-{n}" for n in range(tasks)]
    for n, order_id in enumerate(ids):
        await history.add(_order(order_id, months[n % len(months)] + (now - months[0])))
    claim = Submitted(now, Decimal(0))
    encoded = {"set_status": "submitted", "set_submitted_at": now, "set_position_before": 0}
    statements = [
        Statement("", {"order_id": i, "expected": ["queued"], **encoded}, ("order_history", i))
        for i in ids
    ]
    query, params = transition_merge(tuple(claim.fields())).combine(statements)
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE merged ({})").format(
        sql.SQL(", ").join(sql.Literal(p) for p in params)
    )
    # A connection of its own: psycopg answers a ROLLBACK on a connection where it prepared
    # statements itself with DEALLOCATE ALL, which would take ``merged`` too.
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        for title, setting in (("custom plan", "auto"), ("generic plan", "force_generic_plan")):
            await conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.Literal(setting)))
            await conn.execute(f"PREPARE merged AS {query}")
            plan: list[str] = []
            for _ in range(2):  # the second EXECUTE reuses the plan the first one made
                async with conn.transaction(force_rollback=True):
                    plan = [line for (line,) in await (await conn.execute(explain)).fetchall()]
            await conn.execute("DEALLOCATE merged")
            print(f"--- {title}, {tasks} claims over {len(months)} months (second EXECUTE)")
            print("\n".join(plan))


async def _main(options: argparse.Namespace) -> None:
    name = f"tradecore_bench_{secrets.token_hex(6)}"
    admin = options.admin_url
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    conninfo = make_conninfo(admin, dbname=name)
    try:
        await migrate(conninfo)
        months = _months(datetime.now(UTC), options.months)
        await _prepare(conninfo, months, options.rows_per_month)
        pool = await open_pool(conninfo, min_size=2, max_size=4, timeout_s=10.0)
        try:
            if options.explain:
                await _explain(pool, conninfo, months, options.tasks)
                return
            for run in range(options.repeat):
                for merged in (False, True):
                    tag = f"r{run}-{'m' if merged else 's'}"
                    report = await _run(pool, months, options.tasks, options.rounds, merged, tag)
                    print(json.dumps(report))
        finally:
            await pool.close()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--tasks", type=int, default=64, help="concurrent writers (orders)")
    parser.add_argument("--rounds", type=int, default=30, help="orders per writer")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode, alternating")
    parser.add_argument("--months", type=int, default=4, help="monthly partitions filled")
    parser.add_argument("--rows-per-month", type=int, default=50_000)
    parser.add_argument("--explain", action="store_true", help="print the merged claim's plans")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
