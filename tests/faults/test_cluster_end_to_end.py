"""The production runtime on a Redis Cluster: two API processes and two worker hosts, wired
to a private three-master cluster by ``REDIS_URL=redis+cluster://...``, carry out orders.

The user's lease, request lists and replies live in the user's slot; the start requests and
fill checks in the shards of the shared queues; the wake-ups and reply notifications cross
the nodes by pub/sub. Each order is answered 200 filled (or 202 and filled soon after) and
executed once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from harness import Stack, webhook_body

from contract.redis_cluster import ThreeMasterCluster, cluster_for_tests
from tradecore_adapters.redis.messaging import mark_key

pytestmark = pytest.mark.faults


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ThreeMasterCluster]:
    with cluster_for_tests(tmp_path / "cluster") as started:
        yield started


def _lease_holder(cluster: ThreeMasterCluster, user_id: str) -> str | None:
    """The user's lease as stored on whichever master holds its slot."""
    client = redis.RedisCluster(
        host="127.0.0.1", port=cluster.ports[0], decode_responses=True, socket_timeout=2.0
    )
    try:
        value = client.get(mark_key(user_id))
        return None if value is None else str(value)
    finally:
        client.close()


async def test_apis_and_workers_on_a_cluster_execute_orders_once(
    stack: Stack, cluster: ThreeMasterCluster
) -> None:
    on_cluster = {"REDIS_URL": cluster.url}
    # Two at a time, as the other fault tests start theirs: four interpreters starting at
    # once on a small machine can outlast the harness's start timeout.
    api_a, _, account = await asyncio.gather(
        stack.api(**on_cluster), stack.worker(**on_cluster), stack.new_account()
    )
    api_b, _ = await asyncio.gather(stack.api(**on_cluster), stack.worker(**on_cluster))
    order_ids = []
    for n, (api, action) in enumerate(
        [(api_a, "buy"), (api_b, "sell"), (api_b, "buy"), (api_a, "sell")]
    ):
        reply = await api.webhook(account, webhook_body(account, action=action, quantity="0.1"))
        await stack.executed(reply)
        order_ids.append(reply.body["order_id"])
        assert len(set(order_ids)) == n + 1
    # Each order placed its broker orders once (named by client order id: a double would
    # be a second name): the first opens, each reversal closes and opens.
    names = await stack.db.broker_orders(account.trading_account_id)
    legs = {
        order_id: sorted(n.rpartition("-")[2] for n in names if f":order:{order_id}-" in n)
        for order_id in order_ids
    }
    assert legs == {
        order_id: ["entry"] if n == 0 else ["close", "entry"]
        for n, order_id in enumerate(order_ids)
    }
    assert len(names) == 1 + 2 * (len(order_ids) - 1)
    holder = await asyncio.to_thread(_lease_holder, cluster, stack.trader.user_id)
    assert holder is not None and holder.rpartition(":")[2].isdigit()
