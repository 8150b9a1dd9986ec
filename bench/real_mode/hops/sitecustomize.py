"""Timestamps around each step of an order, for ``steps.py --hops`` (a benchmark's probe).

``steps.py --hops`` puts this directory first on the ``PYTHONPATH`` of the processes it
starts and names a directory in ``BENCH_HOPS_DIR``; Python imports this module at start-up,
and it wraps the methods an order goes through in the API and the worker host so that each
writes ``<wall clock> <step> <order id> <user id>`` to ``BENCH_HOPS_DIR/<pid>.log`` on entry
or exit (the webhook's arrival and admission come before the order has an id: their times
wait in the request's context and are written with the intent's). The product's code is
unchanged. A method renamed there fails this at start-up (Python reports the error and the
process runs without marks, so ``steps.py`` stops and names the hop that has none): it
never measures something else.

Without ``BENCH_HOPS_DIR`` (any other process that inherits the path) it does nothing.
"""

from __future__ import annotations

import contextvars
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
    from tradecore.services.orders.webhook_intake import WebhookIntake
    from tradecore_adapters.postgres.orders import PostgresOrderHistory
    from tradecore_adapters.redis.messaging import RedisOrderQueue
    from tradecore_adapters.redis.protection import RedisWebhookAdmission

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

    # API: the webhook's arrival and admission (no order id yet: kept in the request's
    # context and written with the intent's mark), the intent's commit, the push, the reply
    early: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
        "bench_hops", default=None
    )
    handle = WebhookIntake.handle

    @functools.wraps(handle)
    async def marked_handle(self: Any, *args: Any, **kwargs: Any) -> Any:
        early.set({"received": time.time()})
        return await handle(self, *args, **kwargs)

    WebhookIntake.handle = marked_handle  # type: ignore[method-assign]
    admit = RedisWebhookAdmission.admit

    @functools.wraps(admit)
    async def marked_admit(self: Any, *args: Any, **kwargs: Any) -> Any:
        admission = await admit(self, *args, **kwargs)
        times = early.get()
        if times is not None:
            times["admitted"] = time.time()
        return admission

    RedisWebhookAdmission.admit = marked_admit  # type: ignore[method-assign]
    add = PostgresOrderHistory.add

    @functools.wraps(add)
    async def marked_add(self: Any, record: Any, *args: Any, **kwargs: Any) -> Any:
        for step, at in (early.get() or {}).items():
            out.write(f"{at:.6f} {step} {record.id} {record.user_id}\n")
        mark("add", record.id, record.user_id)
        result = await add(self, record, *args, **kwargs)
        mark("intent", record.id, record.user_id)
        return result

    PostgresOrderHistory.add = marked_add  # type: ignore[method-assign]
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
