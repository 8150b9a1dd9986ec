"""Timestamps around each step of an order, for ``steps.py --hops`` (a benchmark's probe).

``steps.py --hops`` puts this directory first on the ``PYTHONPATH`` of the processes it
starts and names a directory in ``BENCH_HOPS_DIR``; Python imports this module at start-up,
and it wraps the methods an order goes through in the API and the worker host so that each
writes ``<wall clock> <step> <order id> <user id>`` to ``BENCH_HOPS_DIR/<pid>.log`` on entry
or exit. The product's code is unchanged; a method renamed there makes this fail at
start-up (the process exits), never measure something else.

Without ``BENCH_HOPS_DIR`` (any other process that inherits the path) it does nothing.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

_DIR = os.environ.get("BENCH_HOPS_DIR")


def _install() -> None:
    from tradecore.services.execution.worker import UserWorker
    from tradecore.services.execution.worker_host import WorkerHost
    from tradecore.services.orders.dispatch import OrderDispatcher
    from tradecore_adapters.postgres.orders import PostgresOrderHistory
    from tradecore_adapters.redis.messaging import RedisOrderQueue

    out = open(os.path.join(_DIR, f"{os.getpid()}.log"), "a", buffering=1)  # noqa: SIM115

    def mark(step: str, order_id: str, user_id: str = "-") -> None:
        out.write(f"{time.time():.6f} {step} {order_id} {user_id}\n")

    Key = Callable[..., tuple[str, str]]

    def around(cls: type, name: str, before: str | None, after: str | None, key: Key) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            ids = key(*args, **kwargs)
            if before:
                mark(before, *ids)
            result = await original(*args, **kwargs)
            if after:
                mark(after, *ids)
            return result

        setattr(cls, name, wrapped)

    # API: the intent's commit, the push, the reply
    around(PostgresOrderHistory, "add", "add", "intent", lambda s, r, **_: (r.id, r.user_id))
    around(RedisOrderQueue, "push", None, "pushed", lambda s, r: (r.order_id, r.user_id))
    around(OrderDispatcher, "_reply", None, "replied", lambda s, order_id, *a: (order_id, "-"))
    # worker host: the take, the claim, the placement's result, the completion
    around(WorkerHost, "_execute", "taken", "completed", lambda s, u, slot, r: (r.order_id, u))
    steps = {"Submitted": ("claim", "claimed"), "Executed": ("placed", "result")}
    transition = PostgresOrderHistory.transition

    @functools.wraps(transition)
    async def marked_transition(self: Any, order_id: str, change: Any) -> Any:
        before, after = steps.get(type(change).__name__, (None, None))
        if before:
            mark(before, order_id)
        row = await transition(self, order_id, change)
        if after:
            mark(after, order_id)
        return row

    PostgresOrderHistory.transition = marked_transition  # type: ignore[method-assign]
    around(UserWorker, "_schedule_fill_check", None, "fill", lambda s, row: (row.id, "-"))


if _DIR:
    _install()
