"""The ids a log line carries: the request, user, account and order it was written for.

The core knows which order it works on; the logging adapter the composition root configures
adds the bound ids to every line written while they are bound, whatever logger wrote it. Only
the standard library's ``contextvars``: each asyncio task starts with a copy of the ids of the
task that created it, so ids bound while serving one request or executing one order never
reach the lines of another.

``bind_log_fields`` adds ids for the rest of the current task (an HTTP request's task: its
later lines and its access-log line carry them). ``log_fields_bound`` replaces them for one
block and restores them after it (a worker executing one order after another in one task).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import attrs


@attrs.frozen
class LogFields:
    """The ids bound to the log lines of one unit of work; None where not known.

    ``request_id`` is the X-Request-ID of the API request (the one that queued an order, in
    the worker's lines); ``account_id`` is the trading account's id."""

    request_id: str | None = None
    user_id: str | None = None
    account_id: str | None = None
    order_id: str | None = None

    def known(self) -> dict[str, str]:
        """The ids that are set, by field name."""
        return {name: value for name, value in attrs.asdict(self).items() if value is not None}


LOG_FIELD_NAMES: tuple[str, ...] = tuple(field.name for field in attrs.fields(LogFields))
"""The names of the ids, in the order log lines show them."""

_CURRENT: contextvars.ContextVar[LogFields] = contextvars.ContextVar(
    "tradecore_log_fields",
    default=LogFields(),  # noqa: B039 - a frozen value: it cannot be changed in place
)


def current_log_fields() -> LogFields:
    """The ids bound in the current context (none bound: every field None)."""
    return _CURRENT.get()


def start_log_fields(fields: LogFields) -> None:
    """Bind exactly ``fields`` for the rest of the current task, dropping any others: the
    start of a unit of work that runs in its own task (an HTTP request)."""
    _CURRENT.set(fields)


def bind_log_fields(
    *,
    user_id: str | None = None,
    account_id: str | None = None,
    order_id: str | None = None,
) -> None:
    """Add the given ids to the bound ones for the rest of the current task; an argument left
    None keeps what is bound."""
    changes = LogFields(user_id=user_id, account_id=account_id, order_id=order_id).known()
    if changes:
        _CURRENT.set(attrs.evolve(_CURRENT.get(), **changes))


@contextmanager
def log_fields_bound(fields: LogFields) -> Iterator[None]:
    """Bind exactly ``fields`` inside the block; on leaving it, the ids bound before it are
    bound again (whatever the block bound meanwhile)."""
    token = _CURRENT.set(fields)
    try:
        yield
    finally:
        _CURRENT.reset(token)
