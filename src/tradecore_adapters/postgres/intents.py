"""An order request's intent and its success audit entry, in one Postgres statement.

``PostgresIntentLog`` is the ``OrderIntentLog`` port on the audit log's batches
(``PostgresAuditLog.append_with_intent``): the intents and entries that arrive together are
written with the chain head's compare-and-set in one statement and one commit.
"""

from __future__ import annotations

from tradecore.audit import AuditEntry
from tradecore.errors import DuplicateOrder
from tradecore.orders import OrderHistoryRecord
from tradecore_adapters.postgres.audit import PostgresAuditLog
from tradecore_adapters.postgres.orders import order_params


class PostgresIntentLog:
    """OrderIntentLog on ``order_history`` and ``audit_logs``, through ``audit``'s batches
    (so the same process's other entries share them and the chain stays in one order)."""

    def __init__(self, audit: PostgresAuditLog) -> None:
        self._audit = audit

    async def add(self, record: OrderHistoryRecord, entry: AuditEntry) -> None:
        if await self._audit.append_with_intent(entry, order_params(record)) is None:
            raise DuplicateOrder(record.fingerprint)
