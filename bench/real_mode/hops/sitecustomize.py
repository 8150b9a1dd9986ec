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

    def mark(step: str, order_id: str, user_id: str = "-", at: float | None = None) -> None:
        out.write(f"{time.time() if at is None else at:.6f} {step} {order_id} {user_id}\n")

    Hook = Callable[..., None] | None

    def wrap(cls: type, name: str, on_entry: Hook = None, on_exit: Hook = None) -> None:
        """``cls.name`` calling ``on_entry`` and ``on_exit`` with the call's arguments."""
        original = getattr(cls, name)

        @functools.wraps(original)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            if on_entry is not None:
                on_entry(*args, **kwargs)
            result = await original(*args, **kwargs)
            if on_exit is not None:
                on_exit(*args, **kwargs)
            return result

        setattr(cls, name, wrapped)

    # API: the webhook's arrival and admission (no order id yet: kept in the request's
    # context and written with the intent's mark), the intent's commit, the push, the reply
    early: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
        "bench_hops", default=None
    )

    def admitted(*_: Any, **__: Any) -> None:
        times = early.get()
        if times is not None:
            times["admitted"] = time.time()

    def adding(_: Any, record: Any, *__: Any, **___: Any) -> None:
        for step, at in (early.get() or {}).items():
            mark(step, record.id, record.user_id, at)
        mark("add", record.id, record.user_id)

    wrap(WebhookIntake, "handle", lambda *_, **__: early.set({"received": time.time()}))
    wrap(RedisWebhookAdmission, "admit", on_exit=admitted)
    wrap(
        PostgresOrderHistory,
        "add",
        adding,
        lambda _, record, *__, **___: mark("intent", record.id, record.user_id),
    )
    wrap(RedisOrderQueue, "push", on_exit=lambda _, r: mark("pushed", r.order_id, r.user_id))
    wrap(OrderDispatcher, "_reply", on_exit=lambda _, order_id, *__: mark("replied", order_id))
    # worker host: the take, the position read, the placement's result with its claim (a
    # one-step paper order is placed unclaimed), the fill check, the completion
    wrap(
        WorkerHost,
        "_execute",
        lambda _, user, __, r: mark("taken", r.order_id, user),
        lambda _, user, __, r: mark("completed", r.order_id, user),
    )
    wrap(UserWorker, "_execute_unclaimed", lambda _, r, *__: mark("positioned", r.order_id))
    steps = {"ClaimedAndExecuted": ("placed", "result")}

    def transition_mark(index: int) -> Callable[[Any, str, Any], None]:
        def hook(_: Any, order_id: str, change: Any) -> None:
            names = steps.get(type(change).__name__)
            if names is not None:
                mark(names[index], order_id)

        return hook

    wrap(PostgresOrderHistory, "transition", transition_mark(0), transition_mark(1))
    wrap(UserWorker, "_send_fill_check", on_exit=lambda _, task: mark("fill", task.order_id))


if _DIR:
    _install()
