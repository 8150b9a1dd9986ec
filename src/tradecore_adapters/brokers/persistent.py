"""A paper broker whose books outlive the process: real mode, several worker hosts.

Each account's book (cash, holdings, open orders) is a document ``paper:{book}:{account}``,
and each order a document ``paper:{book}:{account}:order:{client order id}``. A connection
loads the book on ``connect``; an order the process has not seen is looked up before it is
placed again, so a client order id stays idempotent across restarts and hosts. A placement
the caller declares ``fresh`` (never placed before anywhere, see ``Broker.place_order``) skips
that look-up: there is nothing stored to find. Every call that changes state saves what it
changed (the order and the book, in one atomic write) before it returns; a call that changes
nothing (an order placed again, the status of a settled order) writes nothing. A save that
failed is retried by the next call to the same account, changed or not and through whichever
connection, so the store catches up with what this process holds.

Given ``with_order`` (``SavesWithOrder``, real mode: the order history in the same
database), a placement does not save on its own: its save is handed to the order's outcome,
which the worker writes right after, and both commit in one transaction (one commit fewer
on the order's way to its answer). A crash before that commit leaves neither the broker
order nor the outcome stored; the row stays ``queued`` or ``submitted`` and the next
execution places the order afresh, exactly once. Until that commit the placement counts as
unsaved: a call to the same account that comes first (a fill check, the next step of a
reversal) saves it in a commit of its own, and one whose outcome failed to commit is saved
by the next call, as above. Such a broker's placements wait for the outcome
(``placements_wait_for_outcome``): the worker places a one-step order unclaimed, and when
that outcome does not take (another execution recorded the order, the API withdrew it) or
its write fails, the order history says so (``discarded``): the account's state in memory
is dropped, unsaved changes with it, and loaded from the store again by the next call of any
connection to the account (``SharedAccount``).

Memory stays bounded however long the process runs: once everything is saved, an account
keeps in memory its open orders and its last ``FINISHED_IN_MEMORY`` to twice that many
finished ones (a fill check comes seconds after its placement and finds its order there);
an older finished order is recalled from the store when asked for again. Before this, every
order a worker host had ever placed stayed in memory, and each save scanned them all for the
open ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import attrs

from tradecore.orders import Side
from tradecore.ports.broker import BrokerAccount, BrokerOrder
from tradecore.ports.documents import DocumentStore, SavesWithOrder
from tradecore.ports.prices import PriceSource
from tradecore.ports.runtime import Clock, Sleeper
from tradecore.reversal import order_of
from tradecore_adapters.brokers.paper import PaperBroker, PaperConditions, PaperExchange
from tradecore_adapters.brokers.registry import PAPER


@attrs.define
class SharedAccount:
    """What every connection of one book and account in this process shares (the factory
    gives them one): the orders whose save failed, saved with the next call through any of
    them, and how many times a placement of the account was dropped (``discarded``): the
    exchange then forgot the account, so a connection that loaded it before loads it again."""

    unsaved: set[str] = attrs.Factory(set)
    drops: int = 0


FINISHED_IN_MEMORY = 32
"""Finished orders per account kept in memory after they were saved, at least (module doc):
the scan that forgets older ones runs once the account holds twice as many orders."""


class PersistentPaperBroker:
    """A PaperBroker on ``exchange`` whose account state lives in ``store``."""

    def __init__(
        self,
        exchange: PaperExchange,
        store: DocumentStore,
        account_id: str,
        clock: Clock,
        *,
        book: str,
        conditions: PaperConditions | None = None,
        sleeper: Sleeper | None = None,
        prices: PriceSource | None = None,
        shared: SharedAccount,
        with_order: SavesWithOrder | None = None,
    ) -> None:
        self._exchange = exchange
        self._store = store
        self._account_id = account_id
        self._inner = PaperBroker(
            exchange, account_id, clock, conditions=conditions, sleeper=sleeper, prices=prices
        )
        self._prefix = f"paper:{book}:{account_id}"
        self._shared = shared
        self._unsaved = shared.unsaved  # saved with the next call, through any connection
        self._loaded_at: int | None = None  # ``shared.drops`` when this connection loaded
        self._with_order = with_order

    @property
    def name(self) -> str:
        return PAPER

    @property
    def placements_wait_for_outcome(self) -> bool:
        return self._with_order is not None

    async def close(self) -> None:
        """Nothing to release: the exchange lives in this process."""

    async def connect(self) -> None:
        await self._inner.connect()
        await self._load()

    async def _load(self) -> None:
        """Load the account's stored book, once, and again after a placement of the account
        was dropped (through this connection or another)."""
        if self._loaded_at == self._shared.drops:
            return
        drops = self._shared.drops
        book = await self._store.load(self._prefix)
        if book is not None:
            self._exchange.import_book(self._account_id, book)
        self._loaded_at = drops

    async def instruments(self) -> frozenset[str]:
        return await self._inner.instruments()

    async def positions(self) -> Mapping[str, Decimal]:
        await self._load()
        return await self._inner.positions()

    async def place_order(
        self,
        client_order_id: str,
        symbol: str,
        side: Side,
        quantity: Decimal,
        *,
        reduce_only: bool = False,
        fresh: bool = False,
    ) -> BrokerOrder:
        await self._load()
        if not fresh:
            await self._recall(client_order_id)
        if self._unsaved and self._with_order is not None:
            # Changes left unsaved (an earlier step of this order, a save that failed) are
            # stored first, in a commit of their own: what is stored never holds an order
            # without those placed before it.
            await self._persist()
        known = self._exchange.knows_order(self._account_id, client_order_id)
        order = await self._inner.place_order(
            client_order_id, symbol, side, quantity, reduce_only=reduce_only
        )
        if not known or self._unsaved:
            order_id = order_of(client_order_id)
            if self._with_order is not None and order_id is not None:
                self._save_with_order(self._with_order, order_id, client_order_id)
            else:
                await self._persist(client_order_id)
        return order

    async def order_status(self, client_order_id: str, symbol: str) -> BrokerOrder | None:
        await self._load()
        await self._recall(client_order_id)
        before = self._exchange.export_order(self._account_id, client_order_id)
        order = await self._inner.order_status(client_order_id, symbol)
        if order is not None and (
            self._unsaved
            or self._exchange.export_order(self._account_id, client_order_id) != before
        ):
            await self._persist(client_order_id)
        return order

    async def _recall(self, client_order_id: str) -> None:
        if self._exchange.knows_order(self._account_id, client_order_id):
            return
        stored = await self._store.load(self._order_key(client_order_id))
        if stored is not None:
            self._exchange.import_order(self._account_id, stored)

    async def _persist(self, client_order_id: str | None = None) -> None:
        """Save the order (if named), every order left unsaved, and the book, atomically."""
        pending = {*self._unsaved}
        if client_order_id is not None:
            pending.add(client_order_id)
        try:
            await self._store.save_many(self._documents(pending))
        except BaseException:
            self._unsaved.update(pending)
            raise
        self._saved(pending)

    def _save_with_order(
        self, with_order: SavesWithOrder, order_id: str, client_order_id: str
    ) -> None:
        """Leave the placement unsaved, its save handed to the order's outcome (module doc):
        the order, every order left unsaved and the book, as they are when that write is
        built."""
        self._unsaved.add(client_order_id)
        exported: set[str] = set()

        def documents() -> dict[str, dict[str, Any]]:
            exported.update(self._unsaved)
            return self._documents(exported)

        with_order.save_with_order(
            order_id, documents, lambda: self._saved(exported), self._discard
        )

    def _documents(self, client_order_ids: set[str]) -> dict[str, dict[str, Any]]:
        """The documents of these orders (those the exchange holds) and of the book."""
        documents: dict[str, dict[str, Any]] = {}
        for cid in sorted(client_order_ids):
            order = self._exchange.export_order(self._account_id, cid)
            if order is not None:
                documents[self._order_key(cid)] = order
        documents[self._prefix] = self._exchange.export_book(self._account_id)
        return documents

    def _discard(self) -> None:
        """The placement handed to an outcome that did not take (module doc): drop the
        account's state in memory, unsaved changes too, and load it again when next used.
        The worker places an unclaimed order only when nothing is left unsaved before it
        (``place_order`` saves that first), so what is dropped is that placement alone."""
        self._unsaved.clear()
        self._exchange.forget_account(self._account_id)
        self._shared.drops += 1

    def _saved(self, client_order_ids: set[str]) -> None:
        self._unsaved.difference_update(client_order_ids)
        if not self._unsaved:  # all this process changed is saved: finished orders recallable
            self._exchange.forget_finished(self._account_id, FINISHED_IN_MEMORY)

    def _order_key(self, client_order_id: str) -> str:
        return f"{self._prefix}:order:{client_order_id}"


class PersistentPaperBrokerFactory:
    """BrokerFactory for real mode: paper books kept in a DocumentStore; simulated orders on
    their own book. ``prices`` as for ``PaperBrokerFactory``."""

    def __init__(
        self,
        exchange: PaperExchange,
        simulation_exchange: PaperExchange,
        store: DocumentStore,
        clock: Clock,
        *,
        conditions: PaperConditions | None = None,
        sleeper: Sleeper | None = None,
        prices: PriceSource | None = None,
        with_order: SavesWithOrder | None = None,
    ) -> None:
        self._exchange = exchange
        self._simulation_exchange = simulation_exchange
        self._store = store
        self._clock = clock
        self._conditions = conditions
        self._sleeper = sleeper
        self._prices = prices
        self._with_order = with_order
        self._accounts: dict[tuple[str, str], SharedAccount] = {}

    def open(self, account: BrokerAccount, *, simulation: bool) -> PersistentPaperBroker:
        if not simulation and account.broker_name != PAPER:
            raise ValueError(f"unknown broker {account.broker_name!r}")
        book = "simulation" if simulation else "live"
        return PersistentPaperBroker(
            self._simulation_exchange if simulation else self._exchange,
            self._store,
            account.trading_account_id,
            self._clock,
            book=book,
            conditions=self._conditions,
            sleeper=self._sleeper,
            prices=self._prices,
            shared=self._accounts.setdefault((book, account.trading_account_id), SharedAccount()),
            with_order=self._with_order,
        )

    def venues(self) -> frozenset[str]:
        return frozenset({PAPER})
