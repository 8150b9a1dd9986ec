"""An API process killed while its order intents are inside a group-commit batch.

The API writes the intents of concurrent webhooks in shared transactions (group commit). The
test holds those transactions open (it locks ``order_history`` against writes, so each batch's
insert waits inside its transaction), kills the API with SIGKILL, releases the lock, and waits
until the server has ended every session of the killed process (it connects as a database
role of its own, so its sessions can be told apart). Then:

* nothing was acknowledged: every webhook sent to the killed process got no answer;
* each alert has at most one order-history row, and no such row went further than ``queued``
  (none was handed to a worker);
* once Redis has lost the replay keys (so only Postgres can tell a replay), each alert sent
  again to a new API process ends as exactly one order: a row the killed process's batch left
  behind refuses its replay (409); an alert without a row is executed (200, filled).

Whether the server committed the killed process's batches (it had the whole batch, commit
included, before the kill) or not, the outcome per alert is one of those two.

The worker host runs with a grace period (``QUEUED_ORDER_GRACE_S``) longer than the test, so
its recovery of never-pushed intents leaves the rows as the crash left them; that recovery is
tested in ``test_lost_intent_recovery.py``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from harness import Account, Reply, Stack, eventually, webhook_body
from psycopg import sql

pytestmark = pytest.mark.faults

ALERTS = 6
NO_RECOVERY_DURING_THE_TEST = {"QUEUED_ORDER_GRACE_S": "3600"}

_WAITING_WRITERS = (
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
    " WHERE NOT l.granted AND l.relation = 'order_history'::regclass AND a.usename = %s"
)
_SESSIONS = "SELECT count(*) FROM pg_stat_activity WHERE usename = %s"


@asynccontextmanager
async def own_role(stack: Stack) -> AsyncIterator[tuple[str, str]]:
    """A login role made for this test (name, and the database URL as that role); dropped at
    the end."""
    role = f"tradecore_killed_{secrets.token_hex(4)}"
    name = sql.Identifier(role)
    await _execute(stack, sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(name))
    dbname = psycopg.conninfo.conninfo_to_dict(stack.db.conninfo)["dbname"]
    try:
        yield role, f"postgresql://{role}@{stack.db.host}:{stack.db.port}/{dbname}"
    finally:
        await _execute(stack, sql.SQL("DROP ROLE IF EXISTS {}").format(name))


async def _execute(stack: Stack, statement: sql.Composed) -> None:
    async with await psycopg.AsyncConnection.connect(
        stack.db.conninfo, autocommit=True, connect_timeout=5
    ) as conn:
        await conn.execute(statement)


async def test_an_api_killed_inside_an_intent_batch_acknowledges_nothing_and_doubles_nothing(
    stack: Stack,
) -> None:
    async with own_role(stack) as (role, url):
        left, bodies, account = await _kill_inside_a_batch(stack, role, url)
    assert all(status == "queued" for status, _ in left.values()), left

    await asyncio.to_thread(stack.redis.flushall)
    again = await stack.api()
    await again.webhook(account, webhook_body(account), simulation=True)  # the worker again
    replies = [await again.webhook(account, body) for body in bodies]

    after = await _orders(stack, account.trading_account_id)
    refused = [r for r in replies if r.status == 409]
    executed = [r for r in replies if r.status == 200]
    assert len(refused) + len(executed) == ALERTS, [str(r) for r in replies]
    assert len(refused) == len(left), (left, [str(r) for r in replies])
    assert all(r.body["status"] == "filled" for r in executed), [str(r) for r in executed]
    assert len(after) == ALERTS  # one row per alert
    assert len(await stack.db.broker_orders(account.trading_account_id)) == len(executed)


async def _kill_inside_a_batch(
    stack: Stack, role: str, url: str
) -> tuple[dict[str, tuple[str, str]], list[bytes], Account]:
    """Send the alerts to an API connected as ``role``, kill it while its intent batches wait
    inside their transactions; the account's orders once the server ended its sessions."""
    api, _, account = await asyncio.gather(
        stack.api(DATABASE_URL=url),
        stack.worker(**NO_RECOVERY_DURING_THE_TEST),
        stack.new_account(),
    )
    warm = await api.webhook(account, webhook_body(account), simulation=True)
    assert warm.status == 200, warm  # the user's worker runs
    bodies = [webhook_body(account, quantity=f"0.0{n + 1}") for n in range(ALERTS)]

    async with await psycopg.AsyncConnection.connect(stack.db.conninfo) as holder:
        await holder.execute("LOCK TABLE order_history IN EXCLUSIVE MODE")
        sends = [asyncio.ensure_future(api.webhook(account, body)) for body in bodies]

        async def batch_inside() -> bool:
            [(waiting,)] = await stack.db.rows(_WAITING_WRITERS, role)
            return int(waiting) >= 1

        await eventually(batch_inside, "an intent batch waiting inside its transaction")
        assert api.process is not None
        await api.process.kill()
        await holder.rollback()  # the lock goes; the server finishes what it was sent

    answers = await asyncio.gather(*sends, return_exceptions=True)
    acknowledged = [a for a in answers if isinstance(a, Reply)]
    assert acknowledged == [], [str(a) for a in acknowledged]

    async def ended() -> bool:
        [(sessions,)] = await stack.db.rows(_SESSIONS, role)
        return int(sessions) == 0

    await eventually(ended, "the server to end the killed process's sessions")
    return await _orders(stack, account.trading_account_id), bodies, account


async def _orders(stack: Stack, account_id: str) -> dict[str, tuple[str, str]]:
    """The account's real (not simulated) orders: id to (status, quantity)."""
    rows = await stack.db.rows(
        "SELECT id, status, quantity::text FROM order_history"
        " WHERE trading_account_id = %s AND NOT simulation",
        account_id,
    )
    return {str(i): (str(s), str(q)) for i, s, q in rows}
