"""The deployment status: ``GET /deployment/status``, for administrators only.

A read-only snapshot of what an operator checks first: the version this process runs, the
schema migrations applied (and any pending), which worker host serves which users (the live
leases), the per-user order queues that are not empty, the fill-verification tasks not yet
settled and the dead letters. Each part is read on its own, without stopping anything, so the
parts may be a moment apart. Lists are capped (``LIST_LIMIT`` leases and queues,
``DEAD_LETTERS_SHOWN`` newest dead letters); ``truncated`` says a cap was reached. Nothing in
it is secret: user ids, host names, order ids and reasons only. An unreachable store is 503.
"""

from __future__ import annotations

from datetime import datetime

import attrs

from tradecore.ports.deployment import SchemaLedger, SchemaState
from tradecore.ports.messaging import FillTaskQueue, OrderQueue, QueueDepth, WorkerDirectory
from tradecore.ports.runtime import Clock
from tradecore.services.vocabulary import ADMIN_REQUIRED, Principal, Rejected, refuses_outages

LIST_LIMIT = 1000
"""Leases and order queues read at most (an operator's page, not an export)."""
DEAD_LETTERS_SHOWN = 100
"""The newest dead letters listed; ``dead_letter_count`` counts them all."""


@attrs.frozen
class WorkerHostStatus:
    """One worker host (the holder name of its leases) and the users it serves, by id."""

    holder: str
    users: tuple[str, ...]


@attrs.frozen
class DeadLetter:
    """A fill-verification task that gave up, with the reason."""

    order_id: str
    user_id: str
    trading_account_id: str
    reason: str


@attrs.frozen
class DeploymentReport:
    """The status document (see the module docstring)."""

    version: str
    checked_at: datetime
    schema: SchemaState
    worker_hosts: tuple[WorkerHostStatus, ...]
    order_queues: tuple[QueueDepth, ...]
    fill_tasks_pending: int
    dead_letter_count: int
    dead_letters: tuple[DeadLetter, ...]
    truncated: bool


class DeploymentStatus:
    """Reads the report over the ports of the running adapter set. ``version`` is the
    installed distribution's version, given by the composition root."""

    def __init__(
        self,
        schema: SchemaLedger,
        directory: WorkerDirectory,
        queue: OrderQueue,
        fill_tasks: FillTaskQueue,
        clock: Clock,
        *,
        version: str,
    ) -> None:
        self._schema = schema
        self._directory = directory
        self._queue = queue
        self._fill_tasks = fill_tasks
        self._clock = clock
        self._version = version

    @refuses_outages
    async def report(self, principal: Principal) -> DeploymentReport | Rejected:
        """The report for an administrator; 403 for anyone else."""
        if not principal.user.is_admin:
            return ADMIN_REQUIRED
        checked_at = self._clock.now()
        leases = await self._directory.leases(LIST_LIMIT + 1)
        depths = await self._queue.depths(LIST_LIMIT + 1)
        letters = await self._fill_tasks.dead_letters()
        hosts: dict[str, list[str]] = {}
        for lease in leases[:LIST_LIMIT]:
            hosts.setdefault(lease.holder, []).append(lease.user_id)
        newest = letters[::-1][:DEAD_LETTERS_SHOWN]
        return DeploymentReport(
            version=self._version,
            checked_at=checked_at,
            schema=await self._schema.state(),
            worker_hosts=tuple(WorkerHostStatus(h, tuple(u)) for h, u in sorted(hosts.items())),
            order_queues=tuple(depths[:LIST_LIMIT]),
            fill_tasks_pending=await self._fill_tasks.pending_count(),
            dead_letter_count=len(letters),
            dead_letters=tuple(
                DeadLetter(t.order_id, t.user_id, t.trading_account_id, reason)
                for t, reason in newest
            ),
            truncated=len(leases) > LIST_LIMIT or len(depths) > LIST_LIMIT,
        )
