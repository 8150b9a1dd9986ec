"""Queues between the API and the per-user workers.

Names follow the specification's "Internal messages": ``worker:active:{user_id}``,
``trading:user:{id}:requests``, ``trading:response:{req_id}``, ``worker-control.fifo`` and
``order-tasks.fifo``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import attrs

from tradecore.orders import OrderRequest, OrderResult


@attrs.frozen
class QueueDepth:
    """One user's order queue: requests waiting to be taken and requests taken but not yet
    completed."""

    user_id: str
    waiting: int
    in_flight: int


@attrs.frozen
class WorkerLease:
    """A live ``worker:active`` mark: the worker host (``holder``) serving the user, and the
    lease's fencing token."""

    user_id: str
    holder: str
    token: int


@runtime_checkable
class OrderQueue(Protocol):
    """The per-user request list and the per-request reply list.

    Delivery is reliable: ``take`` moves a request to the user's in-flight list, and only
    ``complete`` removes it, so a worker that dies mid-request leaves it for ``in_flight``.
    Requests of one user are taken in push order.

    A request pushed while nothing of its user waits and nothing is in flight (the worker is
    idle) may be *handed over*: it is put in the in-flight list at once, so the adapter can
    deliver it to a waiting take without another round trip. Until a take returns it, it
    counts as waiting: the next ``take`` returns it first, ``in_flight`` leaves it out and
    ``retire`` refuses.
    """

    async def push(self, request: OrderRequest) -> bool:
        """Append ``request`` to its user's request list if, atomically with the append, the
        user's ``worker:active`` mark exists (whoever holds the lease); False (nothing
        appended) when it does not. Raises KeyValueStoreUnavailable."""
        ...

    async def park(self, request: OrderRequest) -> None:
        """Append ``request`` to its user's request list whether or not a worker holds the
        user's lease: for an order made durable while no worker could be started in time. The
        list is then non-empty with no lease, which any worker host's orphan sweep
        (``WorkerDirectory.orphaned_users``) finds and serves; a worker that starts meanwhile
        takes it like any pushed request. Raises KeyValueStoreUnavailable."""
        ...

    async def wait_result(self, request_id: str, timeout_s: float) -> OrderResult | None:
        """The worker's reply to ``request_id``, or None when none came within ``timeout_s``.
        Called on the queue that pushed or parked the request (the API process that handed
        it over): an adapter may keep a reply where only the request's user says (Redis
        keeps it in the user's cluster slot) and answer None for a request it never saw."""
        ...

    async def take(self, user_id: str, timeout_s: float) -> OrderRequest | None:
        """The user's request handed over at its push, if no take has returned it yet, else
        the user's oldest request, moved to the in-flight list; None after ``timeout_s``."""
        ...

    async def complete(self, request: OrderRequest, result: OrderResult) -> None:
        """Publish ``result`` on the reply list and drop ``request`` from the in-flight list."""
        ...

    async def in_flight(self, user_id: str) -> list[OrderRequest]:
        """Requests taken but never completed (a crashed worker's), oldest first; not a
        request handed over that no take has returned yet (the next take returns it)."""
        ...

    async def depths(self, limit: int = 1000) -> list[QueueDepth]:
        """(Operators) the users whose request or in-flight list is not empty, with both
        lengths (a request handed over that no take returned counts as waiting), ordered by
        user id; at most ``limit``. A snapshot taken without stopping the
        queue: counts may be a moment apart. Raises KeyValueStoreUnavailable."""
        ...


@runtime_checkable
class WorkerDirectory(Protocol):
    """Which users have an active worker, the lease behind that, and the worker-control FIFO
    queue of start requests.

    The mark ``worker:active:{user_id}`` is a lease: its value is ``"{holder}:{token}"`` and it
    expires with a time to live unless its holder renews it. ``token`` is the lease's fencing
    token: strictly increasing per user across the whole system (every host, every restart of
    a host), so a larger token always names a later lease. At most one lease per user exists
    at a time; the calls that change or end a lease succeed only with its token, so a holder
    whose lease ran out can never touch its successor's. Every call raises
    KeyValueStoreUnavailable when the store cannot be reached.
    """

    async def is_active(self, user_id: str) -> bool:
        """True while the mark ``worker:active:{user_id}`` exists, whoever holds it."""
        ...

    async def request_start(self, user_id: str) -> None:
        """Put a start request for ``user_id`` on worker-control (deduplicated per user)."""
        ...

    async def wait_active(self, user_id: str, timeout_s: float) -> bool:
        """True as soon as the mark exists; False when ``timeout_s`` passed without it."""
        ...

    async def next_start_request(self, timeout_s: float) -> str | None:
        """(Worker host) the user id of the oldest start request, or None after the timeout."""
        ...

    async def acquire(self, user_id: str, holder: str, ttl_s: float) -> int | None:
        """(Worker host) take the user's lease for ``holder``, atomically.

        No mark: set it to a new lease of ``holder`` living ``ttl_s``, with the next fencing
        token, and return that token. A mark of ``holder`` itself: refresh its time to live to
        ``ttl_s`` and return its token unchanged (re-acquiring is idempotent). A mark of
        another holder: change nothing and return None.
        """
        ...

    async def renew(self, user_id: str, token: int, ttl_s: float) -> bool:
        """(Worker host) reset the lease's time to live to ``ttl_s`` if, atomically, the mark
        still carries ``token``; False (nothing changed) when it does not: the lease expired
        or another holder took it, and the caller must stop serving the user."""
        ...

    async def renew_many(self, leases: Mapping[str, int], ttl_s: float) -> set[str]:
        """(Worker host) ``renew`` each lease of ``leases`` (user id -> token), as that call
        would, in few round trips (a host renews all its leases at once); the users whose
        lease was not renewed: each of them must no longer be served by the caller."""
        ...

    async def release(self, user_id: str, token: int) -> None:
        """(Worker host) delete the mark if, atomically, it carries ``token``; otherwise do
        nothing (a successor's lease is never removed). Idempotent."""
        ...

    async def orphaned_users(self, limit: int = 100) -> list[str]:
        """(Worker host) users with requests waiting or in flight whose lease is absent:
        their host died, or their lease lapsed between requests. At most ``limit``; a host
        that finds one starts a worker for it, which recovers the requests. Its cost grows
        with everything the store holds (a scan), so hosts call it when a host died
        (``lapsed_hosts``), when they start, and rarely otherwise."""
        ...

    async def host_alive(self, holder: str, ttl_s: float) -> None:
        """(Worker host) record that the host ``holder`` lives for ``ttl_s`` more seconds
        (its heartbeat, renewed before it runs out). Time is the store's, so hosts whose
        clocks differ agree on when a record lapsed."""
        ...

    async def lapsed_hosts(self) -> list[str]:
        """(Worker host) the hosts whose record ran out without ``host_gone``: they died or
        lost the store. Each is returned once, to one caller, and its record removed, so one
        host looks for the orphans it left. A host that comes back records itself again."""
        ...

    async def host_gone(self, holder: str) -> None:
        """(Worker host) remove the record of ``holder``: it stops and releases its leases
        itself. Idempotent."""
        ...

    async def leases(self, limit: int = 1000) -> list[WorkerLease]:
        """(Operators) the live leases, ordered by user id; at most ``limit``. A snapshot: a
        lease may end or start right after it is read."""
        ...

    async def retire(self, user_id: str, token: int) -> bool:
        """(Worker host) delete the mark only if, atomically, it carries ``token`` and the
        user's request list is empty with no request handed over that no take returned;
        False (nothing changed) otherwise - a request is waiting, or the lease is no longer
        the caller's. Together with ``OrderQueue.push``
        this means no request is ever left in a list that no worker serves."""
        ...


@attrs.frozen
class FillTask:
    """A fill-verification message: check this order through the user's worker."""

    order_id: str
    user_id: str
    trading_account_id: str


@attrs.frozen
class FillDelivery:
    """One receipt of a FillTask. ``receive_count`` is 1 on the first delivery."""

    task: FillTask
    receipt: str
    receive_count: int


@runtime_checkable
class FillTaskQueue(Protocol):
    """The order-tasks FIFO queue with message groups (group = user id).

    A received message is invisible for the visibility timeout (180 s) unless acknowledged or
    re-scheduled; a group with an invisible message delivers nothing else until it is settled,
    so the checks of one user run in sequence.

    Sends are deduplicated by order id, as an SQS FIFO queue deduplicates by
    MessageDeduplicationId: within the deduplication window (5 minutes) after a send of an
    order's task, another send of a task of that order is accepted and does nothing, whether
    the first message is still queued, in flight or already settled. ``retry`` and
    redeliveries after the visibility timeout are not sends and are never deduplicated.
    """

    async def send(self, task: FillTask, delay_s: float) -> None:
        """Enqueue ``task``, visible after ``delay_s`` seconds; do nothing (and succeed) when a
        task of the same ``order_id`` was sent within the deduplication window. A send whose
        answer was lost may be repeated safely."""
        ...

    async def receive(self, timeout_s: float) -> FillDelivery | None:
        """The next visible message of a group with nothing in flight, or None."""
        ...

    async def receive_many(self, limit: int, timeout_s: float) -> list[FillDelivery]:
        """Up to ``limit`` (at least 1, ValueError otherwise) deliveries taken in one look,
        in the order successive ``receive`` calls would have given them. Each is exactly what
        ``receive`` gives: a visible message of a group with nothing in flight, now in flight
        for the visibility timeout, with its ``receive_count``; as a delivered group has a
        message in flight, no two are of the same group. Nothing is delivered twice, and
        every delivery is settled on its own (``ack``, ``retry``, ``dead_letter``).

        Waits, as ``receive`` does (up to ``timeout_s``; a ``timeout_s`` of zero or less
        looks once), only while nothing is deliverable; once something is, returns what the
        look delivered without waiting for more. At least one message when any was
        deliverable at the look; an adapter may deliver fewer than were deliverable up to
        ``limit`` (the rest come with the next call). [] when nothing came in time."""
        ...

    async def ack(self, delivery: FillDelivery) -> None:
        """Delete the message: its check reached a final outcome."""
        ...

    async def retry(self, delivery: FillDelivery, delay_s: float) -> None:
        """Make the message visible again after ``delay_s`` (a re-queue)."""
        ...

    async def dead_letter(self, delivery: FillDelivery, reason: str) -> None:
        """Move the message to the dead-letter queue, where operators see it."""
        ...

    async def dead_letters(self) -> list[tuple[FillTask, str]]:
        """Dead-lettered tasks with their reasons, oldest first."""
        ...

    async def pending_count(self) -> int:
        """(Operators) messages sent and not yet settled: delayed, visible or in flight
        (dead letters not included). A snapshot."""
        ...
