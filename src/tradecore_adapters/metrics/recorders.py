"""Recording decorators: ports that pass every call through to the real adapter and count
what they see. The composition root puts them in place of the adapters when metrics are on,
so the core never learns that it is measured.

* ``RecordingOrderHistory`` sees every change of an order row: the durable intent
  (``add``: the admission stage, timed from the HTTP request's arrival) and each
  ``transition`` (the queue, execution and fill stages from the row's own timestamps, the
  final statuses, the broker's errors).
* ``RecordingAuditLog`` sees every security event (``append``): refused logins and attacks.

Both forward any other attribute to the adapter they wrap (a store's own helpers, such as
the memory audit log's ``all()``, keep working behind them).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from tradecore.audit import AuditAction, AuditEntry, AuditSummary, StoredAuditEntry
from tradecore.audit_chain import SealedEntry
from tradecore.order_lifecycle import (
    ClaimedAndExecuted,
    ClaimFailed,
    Executed,
    Expired,
    FillChecked,
    Interrupted,
    OrderChange,
    Submitted,
    Withdrawn,
)
from tradecore.orders import OrderHistoryRecord, RejectionCode
from tradecore.ports.repositories import AuditLog, OrderHistory
from tradecore.ports.runtime import Clock
from tradecore_adapters.metrics.registry import ProcessMetrics

REQUEST_STARTED: contextvars.ContextVar[float] = contextvars.ContextVar("request_started")
"""``time.perf_counter()`` when the HTTP request being handled arrived (set by the metrics
middleware); an intent stored outside a request (a script, a test) has no admission time."""

_NOT_BROKER = frozenset({RejectionCode.ORDER_EXPIRED})
"""Errors of ours, not of the broker: an order that waited past its age never reached it."""
_BROKER_ANSWERS = (Executed, ClaimedAndExecuted, ClaimFailed, Interrupted)
"""The changes that carry what the broker side answered (or that it could not be reached)."""
_SETTLING = (
    Executed,
    ClaimedAndExecuted,
    FillChecked,
    Expired,
    ClaimFailed,
    Interrupted,
    Withdrawn,
)
"""The changes that may give a row its final status (``FillRecorded`` keeps the status)."""


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


class RecordingOrderHistory:
    """An ``OrderHistory`` that records the stages and outcomes of the rows it writes.

    A change is recorded once, when the store applied it (``transition`` returned the row):
    a lost compare-and-set records nothing, so a re-executed request never counts twice.
    ``clock`` dates the end of the execution stage, which the row does not record.
    """

    def __init__(self, inner: OrderHistory, metrics: ProcessMetrics, clock: Clock) -> None:
        self._inner = inner
        self._metrics = metrics
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def add(self, record: OrderHistoryRecord) -> None:
        await self._inner.add(record)
        started = REQUEST_STARTED.get(None)
        if started is not None:
            self._metrics.stage("admission", time.perf_counter() - started)

    async def get(self, order_id: str) -> OrderHistoryRecord | None:
        return await self._inner.get(order_id)

    async def get_many(self, order_ids: Sequence[str]) -> dict[str, OrderHistoryRecord]:
        return await self._inner.get_many(order_ids)

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        row = await self._inner.transition(order_id, change)
        if row is not None:
            self._record(change, row)
        return row

    async def list_for_user(
        self,
        user_id: str,
        *,
        trading_account_id: str | None = None,
        before: datetime | None = None,
        limit: int = 50,
    ) -> Sequence[OrderHistoryRecord]:
        return await self._inner.list_for_user(
            user_id, trading_account_id=trading_account_id, before=before, limit=limit
        )

    async def count_since(self, user_id: str, since: datetime) -> int:
        return await self._inner.count_since(user_id, since)

    def _record(self, change: OrderChange, row: OrderHistoryRecord) -> None:
        if isinstance(change, Submitted | ClaimedAndExecuted):
            self._stage("queue", row.created_at, row.submitted_at)
        if isinstance(change, Executed | ClaimedAndExecuted):
            self._stage("execution", row.submitted_at, self._clock.now())
            self._stage("fill", row.submitted_at, row.filled_at)
        elif isinstance(change, FillChecked) and change.filled_at is not None:
            self._stage("fill", row.submitted_at, row.filled_at)
        error = row.error
        broker_failed = error is not None and error.code not in _NOT_BROKER
        if isinstance(change, _BROKER_ANSWERS) and error is not None and broker_failed:
            self._metrics.broker_error(row.broker_name, error)
        if isinstance(change, _SETTLING) and row.status.is_terminal:
            self._metrics.order_settled(row.source.value, row.status, error)

    def _stage(self, stage: str, start: datetime | None, end: datetime | None) -> None:
        seconds = _seconds(start, end)
        if seconds is not None:
            self._metrics.stage(stage, seconds)


class RecordingAuditLog:
    """An ``AuditLog`` that counts refused logins and attacks as they are stored."""

    def __init__(self, inner: AuditLog, metrics: ProcessMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, entry: AuditEntry) -> int:
        entry_id = await self._inner.append(entry)
        self._metrics.security_event(entry.action, entry.success)
        return entry_id

    async def chain(self, *, after_id: int = 0, limit: int = 1000) -> list[SealedEntry]:
        return await self._inner.chain(after_id=after_id, limit=limit)

    async def summary(
        self, user_id: str, *, actions: Collection[AuditAction], since: datetime | None
    ) -> AuditSummary:
        return await self._inner.summary(user_id, actions=actions, since=since)

    async def list_for_user(
        self,
        user_id: str,
        *,
        actions: Collection[AuditAction] | None = None,
        since: datetime | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[StoredAuditEntry], int]:
        return await self._inner.list_for_user(
            user_id, actions=actions, since=since, limit=limit, offset=offset
        )
