"""An API process killed after it made an order durable and before it pushed the request.

The intent (an order-history row, ``queued``, with the alert's fingerprint) is committed, and
the push onto the user's request list never happens: the test pauses the key-value store's
writes (``CLIENT PAUSE ... WRITE``) once the intent's insert waits on a table lock it holds,
releases the lock so the insert commits, kills the API with SIGKILL while its push is held by
the pause, and lifts the pause only after the server has dropped every connection of the
killed process (so its push can never run). Then:

* the worker host's recovery finds the row, ``queued`` for longer than its grace period
  (``QUEUED_ORDER_GRACE_S``, made short here) with nothing waiting for its user, and hands it
  over: the order is executed exactly once (one broker order, status ``filled``);
* the alert sent again is still refused as a replay (409): one order, not two.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import psycopg
import pytest
from harness import Account, Reply, Stack, eventually, webhook_body

pytestmark = pytest.mark.faults

GRACE_S = "1"
PAUSE_MS = 20_000  # a ceiling only: the test lifts the pause as soon as the API is gone

_WAITING_INSERTS = (
    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'order_history'::regclass"
)


async def test_an_intent_whose_api_died_before_the_push_is_executed_once(stack: Stack) -> None:
    worker, api, account = await asyncio.gather(
        stack.worker(QUEUED_ORDER_GRACE_S=GRACE_S), stack.api(), stack.new_account()
    )
    warm = await api.webhook(account, webhook_body(account), simulation=True)
    assert warm.status == 200, warm  # the user's worker runs
    body = webhook_body(account, quantity="0.02")

    async with await psycopg.AsyncConnection.connect(stack.db.conninfo) as holder:
        await holder.execute("LOCK TABLE order_history IN EXCLUSIVE MODE")
        send = asyncio.ensure_future(api.webhook(account, body))

        async def insert_waits() -> bool:
            [(waiting,)] = await stack.db.rows(_WAITING_INSERTS)
            return int(waiting) >= 1

        await eventually(insert_waits, "the intent's insert waiting on the lock")
        await asyncio.to_thread(_redis, stack, "CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        await holder.rollback()  # the insert goes on and commits; the push waits on the pause

    try:
        [order_id] = await _committed(stack, account)
        assert api.process is not None
        connections = _redis_connections(api.process.pid, stack.redis.port)
        await api.process.kill()

        async def dropped() -> bool:
            return not (connections & await asyncio.to_thread(_client_ports, stack))

        await eventually(dropped, "the key-value store to drop the killed API's connections")
    finally:
        await asyncio.to_thread(_redis, stack, "CLIENT", "UNPAUSE")
    answered = await asyncio.gather(send, return_exceptions=True)
    assert not any(isinstance(a, Reply) for a in answered), answered

    await stack.order_reaches(order_id, "filled")
    assert f"order {order_id} of user" in worker.output()  # handed over by the recovery
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 1

    again = await (await stack.api()).webhook(account, body)
    assert again.status == 409, again
    assert [order_id] == await _real_orders(stack, account)
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 1


async def _committed(stack: Stack, account: Account) -> list[str]:
    """The account's real order ids, once one is committed."""
    found: list[str] = []

    async def one() -> bool:
        found[:] = await _real_orders(stack, account)
        return bool(found)

    await eventually(one, "the intent to be committed")
    return found


async def _real_orders(stack: Stack, account: Account) -> list[str]:
    rows = await stack.db.rows(
        "SELECT id FROM order_history WHERE trading_account_id = %s AND NOT simulation",
        account.trading_account_id,
    )
    return [str(i) for (i,) in rows]


def _redis(stack: Stack, *command: object) -> object:
    client = stack.redis.client()
    try:
        return client.execute_command(*command)
    finally:
        client.close()


def _client_ports(stack: Stack) -> set[int]:
    """The client-side ports of every connection the key-value store serves now."""
    clients = _redis(stack, "CLIENT", "LIST")
    text = clients.decode() if isinstance(clients, bytes) else str(clients)
    ports = set()
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        ports.add(int(fields["addr"].rsplit(":", 1)[1]))
    return ports


def _redis_connections(pid: int, redis_port: int) -> set[int]:
    """The local ports of the process's TCP connections to ``redis_port`` (from /proc: the
    process's socket inodes, matched in the kernel's TCP tables)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            columns = line.split()
            local, remote, inode = columns[1], columns[2], columns[9]
            if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == redis_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    assert ports, "the API has no connection to the key-value store"
    return ports
