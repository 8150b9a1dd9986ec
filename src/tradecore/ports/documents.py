"""Named JSON documents: state read and written as one piece (the paper broker's books), and
saves of them that commit with an order's outcome."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class DocumentStore(Protocol):
    async def load(self, name: str) -> dict[str, Any] | None:
        """The document last saved under ``name``, or None."""
        ...

    async def save(self, name: str, document: dict[str, Any]) -> None:
        """Store ``document`` under ``name``, replacing any earlier one, durably."""
        ...

    async def save_many(self, documents: Mapping[str, dict[str, Any]]) -> None:
        """Store each document under its name, replacing earlier ones, durably and
        atomically: after a failure either all of them or none of them are stored."""
        ...


class SavesWithOrder(Protocol):
    """Saves of documents that may wait for an order's outcome and commit with it.

    A venue whose state lives in the service's own database (the paper broker in real mode)
    changes that state when it places an order; the order's outcome is written to the order
    history right after. Saving both in one transaction spares the order a commit of its own
    on its way to the answer, and leaves a crash nothing in between: either the venue's
    order and the row's outcome are stored, or neither is (the row stays ``queued`` or
    ``submitted`` and is executed again, placing the order afresh). Where nothing is kept
    before the outcome, the order needs no claim ahead of its placement either: the
    outcome's compare-and-set from ``queued`` decides whether the placement is kept.
    """

    def save_with_order(
        self,
        order_id: str,
        documents: Callable[[], Mapping[str, dict[str, Any]]],
        saved: Callable[[], None],
        discarded: Callable[[], None],
    ) -> None:
        """Save ``documents()`` (called when that write is built, so it holds the state of
        then) in the same transaction as the next ``OrderHistory.transition`` of order
        ``order_id``, then call ``saved()``. A later call for the same order replaces this
        one. Nothing is saved before that transition. Which transition keeps them
        (``order_lifecycle.placement_kept`` decides it from the change):

        * One that leaves a status other than ``queued``: the order was claimed before the
          venue placed it, so what the venue did is saved whether or not the
          compare-and-set takes (another process may be the one that records the outcome).
          If the transition fails, nothing is saved and neither callback is called: the
          caller still holds the changes and saves them on its own later.
        * One that leaves ``queued``: the venue placed the order unclaimed
          (``Broker.placements_wait_for_outcome``), so only the transition that records
          that execution (``ClaimedAndExecuted``) and takes may keep it. When it does not
          take, when it is another change, and when it fails (what was stored is then
          unknown), ``discarded()`` is called instead of ``saved()``: the changes belong to
          no recorded order, and the caller drops them and reads its stored state again.
        """
        ...
