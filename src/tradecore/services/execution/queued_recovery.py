"""Recovery of order intents that were never handed to a worker.

The API makes an order durable (its order-history row, status ``queued``) before it pushes
the request on the user's request list (``services.orders.dispatch``, steps 1-2). An API
process that dies between the two leaves a row nothing will ever push: its sender's retry is
refused as a replay, and the order would neither execute nor expire. The worker hosts look
for such rows (``QueuedRecovery.scan``, every sweep) and hand each one over again, through
the API's own path: a push on the user's list when a worker holds the user's lease, else a
park on the list and a start of the user's worker on this host.

* A row is a candidate once it has been ``queued`` for ``grace_s``: longer than a live API
  can still be between its commit and its push (see ``HostSettings.recovery_grace_s``).
* A user whose request list or in-flight list is not empty is left for a later scan: the
  row may be waiting there, and that user's worker is running (or the orphan sweep starts
  one). Once the lists are empty, a row still ``queued`` is certainly lost, and is pushed.
* Pushing a request twice is harmless, so concurrent scans on several hosts, or a scan that
  races a slow API, double nothing: the worker claims a row with a compare-and-set
  ``queued -> submitted`` and a delivery that finds the row no longer ``queued`` only
  publishes its current result (``UserWorker`` module doc, step 2).
* A row past its ``expires_at`` (``created_at`` + ``max_queue_age_s``) is pushed all the
  same: the worker's claim marks it ``expired``, as for any order that waited too long, so
  its history shows the outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from tradecore.orders import OrderHistoryRecord, OrderRequest
from tradecore.ports.messaging import OrderQueue
from tradecore.ports.repositories import OrderHistory, TradingAccountRepository
from tradecore.ports.runtime import Clock

log = logging.getLogger(__name__)

SCAN_LIMIT = 500
"""Rows looked at per scan, oldest first; more wait for the next scan."""

DEPTHS_LIMIT = 10_000
"""Users whose lists are read per scan. A user beyond it counts as having empty lists: at
worst one of its rows is pushed a second time, which is harmless."""


class QueuedRecovery:
    """Finds order intents left ``queued`` by an API that died before its push, and hands
    them over again (see the module doc)."""

    def __init__(
        self,
        orders: OrderHistory,
        accounts: TradingAccountRepository,
        queue: OrderQueue,
        clock: Clock,
        *,
        grace_s: float,
        max_queue_age_s: float,
    ) -> None:
        if grace_s <= 0:
            raise ValueError("the recovery grace period must be positive")
        self._orders = orders
        self._accounts = accounts
        self._queue = queue
        self._clock = clock
        self._grace = timedelta(seconds=grace_s)
        self._max_queue_age = timedelta(seconds=max_queue_age_s)

    async def scan(self, start_worker: Callable[[str], None]) -> list[str]:
        """Hand over again every lost intent found now; returns their order ids.
        ``start_worker(user_id)`` starts the user's worker on this host (called after a park,
        when no worker held the user's lease). Raises ``StoreUnavailable`` when a store
        cannot be reached (nothing is lost: the next scan looks again)."""
        stale = await self._orders.stale_queued(self._clock.now() - self._grace, SCAN_LIMIT)
        if not stale:
            return []
        busy = {d.user_id for d in await self._queue.depths(DEPTHS_LIMIT)}
        recovered: list[str] = []
        for row in stale:
            if row.user_id in busy:
                continue  # it may be waiting there; a later scan looks again
            request = await self._request(row)
            log.warning(
                "order %s of user %s was never handed to a worker (queued since %s); "
                "handing it over",
                row.id,
                row.user_id,
                row.created_at.isoformat(),
            )
            if not await self._queue.push(request):
                await self._queue.park(request)
                start_worker(row.user_id)
            recovered.append(row.id)
        return recovered

    async def _request(self, row: OrderHistoryRecord) -> OrderRequest:
        """The request the API built for ``row`` (``OrderDispatcher.dispatch``), from what the
        row and the account hold now."""
        credentials_ref: str | None = None
        if not row.simulation:
            account = await self._accounts.get(row.trading_account_id)
            # a deleted account: None, and the worker opens the account as its source has it
            credentials_ref = None if account is None else account.credentials_ref
        return row.to_request(
            expires_at=row.created_at + self._max_queue_age, credentials_ref=credentials_ref
        )
