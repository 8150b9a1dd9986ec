"""The paper broker: a simulated exchange and the ``Broker`` connections to it.

``PaperExchange`` holds the shared state (catalogue, prices, one book per account, scripted
behaviour); ``PaperBroker`` is one account's connection (``tradecore.ports.broker.Broker``).
Orders are market orders filled at the instrument's current price: its reference price until
``set_price``; a ``PaperBroker`` with a price source (``tradecore.ports.prices``) sets the
source's price before placing each new order (without one, or when the source has none, the
exchange keeps its last known price). Checks, in order: a known client order id returns the
recorded order; the next scripted step (``script``) may refuse it; unknown symbol
(``invalid_symbol``); hedge position mode (``position_mode_mismatch``); market hours
(``market_closed``, the message carries the hours); a reduce-only order is capped at what is
held against it (cancelled when nothing is); the opening part must fit the available balance
(``insufficient_margin``).

The exchange's state is JSON-compatible through ``snapshot`` and ``restore``; connections and
scheduled disconnects are not part of it (a restart drops them anyway).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import attrs
import cattrs

from tradecore.orders import OrderError, RejectionCode, Side
from tradecore.ports.broker import BrokerOrder, BrokerOrderStatus
from tradecore.ports.prices import PriceSource
from tradecore.ports.runtime import Clock, Sleeper
from tradecore_adapters.brokers.book import Account, Holding, PaperOrder, reducible
from tradecore_adapters.brokers.catalogue import Instrument, PositionMode, default_catalogue
from tradecore_adapters.brokers.links import Links
from tradecore_adapters.brokers.script import Fill, Reject, Step
from tradecore_adapters.brokers.state import ExchangeState, converter

DEFAULT_CASH = Decimal(100000)


class PaperExchange:
    """The simulated exchange shared by every paper account (see the module doc)."""

    def __init__(
        self,
        catalogue: Mapping[str, Instrument] | None = None,
        *,
        default_cash: Decimal = DEFAULT_CASH,
    ) -> None:
        self.catalogue: Mapping[str, Instrument] = dict(catalogue or default_catalogue())
        self._state = ExchangeState(
            prices={s: i.reference_price for s, i in self.catalogue.items()},
            default_cash=default_cash,
        )
        self.links = Links()
        self.calls_made = 0  # counted only under PaperConditions.disconnect_every

    # -- reading -----------------------------------------------------------------------------

    def symbols(self) -> frozenset[str]:
        return frozenset(self.catalogue)

    def price(self, symbol: str) -> Decimal:
        return self._state.prices[symbol]

    def position(self, account_id: str, symbol: str) -> Decimal:
        """The signed position (0 when flat)."""
        return self._account(account_id).position(symbol)

    def positions(self, account_id: str) -> dict[str, Decimal]:
        """Signed positions by symbol; flat symbols omitted."""
        return {s: h.quantity for s, h in self._account(account_id).holdings.items()}

    def balance(self, account_id: str) -> Decimal:
        """Cash: the starting balance plus realised profit and loss."""
        return self._account(account_id).cash

    def available(self, account_id: str) -> Decimal:
        """Cash less the margin held by positions."""
        return self._account(account_id).available(self.catalogue, self._state.prices)

    def orders(self, account_id: str) -> list[BrokerOrder]:
        """Every recorded order of the account, in placement order."""
        return [o.view() for o in self._account(account_id).orders.values()]

    def is_market_open(self, symbol: str, now: datetime) -> bool:
        override = self._state.market_open.get(symbol)
        if override is not None:
            return override
        return self.catalogue[symbol].hours.is_open(now)

    # -- arranging ---------------------------------------------------------------------------

    def fund(self, account_id: str, cash: Decimal) -> None:
        self._account(account_id).cash = cash

    def set_position(
        self, account_id: str, symbol: str, quantity: Decimal, price: Decimal | None = None
    ) -> None:
        """Put a position on the book directly (test setup), entered at ``price``."""
        account = self._account(account_id)
        if quantity == 0:
            account.holdings.pop(symbol, None)
        else:
            entry = price if price is not None else self._state.prices[symbol]
            account.holdings[symbol] = Holding(quantity, entry)

    def set_price(self, symbol: str, price: Decimal) -> None:
        self._state.prices[symbol] = price

    def set_market_open(self, symbol: str, is_open: bool | None) -> None:
        """Force the market of ``symbol`` open or closed; None goes back to its hours."""
        if is_open is None:
            self._state.market_open.pop(symbol, None)
        else:
            self._state.market_open[symbol] = is_open

    def script(self, *steps: Step) -> None:
        """Append steps for the next new placements (see ``script.py``)."""
        self._state.script.extend(steps)

    def reject_next(
        self,
        code: RejectionCode,
        *,
        count: int = 1,
        message: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.script(*[Reject(code, message, retry_after)] * count)

    def delay_next_fill(self, polls: int | None, *, count: int = 1) -> None:
        """The next order stays pending until polled ``polls`` times (None: forever)."""
        self.script(*[Fill.delayed(polls)] * count)

    def partially_fill_next(
        self, fraction: Decimal, *, rest_after_polls: int | None = None, count: int = 1
    ) -> None:
        self.script(*[Fill.partial(fraction, rest_after_polls)] * count)

    def disconnect(
        self, account_id: str | None = None, *, after_calls: int = 0, refuse_reconnects: int = 0
    ) -> None:
        """Drop the connection of ``account_id`` (None: every account) once ``after_calls``
        more calls have gone through. From then on every call raises ``BrokerDisconnected``
        until ``connect`` succeeds; the first ``refuse_reconnects`` connects fail too."""
        self.links.disconnect(account_id, after_calls, refuse_reconnects)

    # -- the broker side ---------------------------------------------------------------------

    def place(
        self,
        account_id: str,
        client_order_id: str,
        symbol: str,
        side: Side,
        quantity: Decimal,
        *,
        reduce_only: bool,
        now: datetime,
    ) -> BrokerOrder:
        """Place a market order (see the module doc for the checks, in order)."""
        if not quantity.is_finite() or quantity <= 0:
            raise ValueError("order quantity must be a positive, finite number")
        account = self._account(account_id)
        known = account.orders.get(client_order_id)
        if known is not None:
            return known.view()
        step = self._state.script.pop(0) if self._state.script else None
        order = PaperOrder(
            broker_order_id="",
            client_order_id=client_order_id,
            symbol=symbol,
            side=side,
            quantity=quantity,
            reduce_only=reduce_only,
            status=BrokerOrderStatus.PENDING,
        )
        if isinstance(step, Reject):
            if step.code is RejectionCode.BROKER_RATE_LIMITED:
                order.status, order.rejection = BrokerOrderStatus.REJECTED, step.error()
                return order.view()  # refused before the broker recorded anything
            return self._reject(account, order, step.error())
        refusal = self._check(account, order, now)
        if refusal is not None:
            return self._reject(account, order, refusal)
        self._record(account, order)
        if reduce_only:
            order.quantity = min(quantity, reducible(account.position(symbol), side))
            if order.quantity == 0:
                order.quantity = quantity
                order.status = BrokerOrderStatus.CANCELLED  # nothing held to reduce
                return order.view()
        fill = step if isinstance(step, Fill) else Fill()
        order.rest_after_polls = fill.rest_after_polls
        self._fill(account, order, order.quantity * fill.now)
        return order.view()

    def order_status(self, account_id: str, client_order_id: str) -> BrokerOrder | None:
        """The recorded order; each poll of an open order counts towards its scripted fill."""
        account = self._account(account_id)
        order = account.orders.get(client_order_id)
        if order is None:
            return None
        if order.is_open:
            order.polls += 1
            if order.rest_after_polls is not None and order.polls >= order.rest_after_polls:
                self._fill(account, order, order.remaining)
        return order.view()

    # -- persistence -------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole mutable state as JSON-compatible data."""
        data: dict[str, Any] = converter.unstructure(self._state)
        return data

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the state with one taken by ``snapshot`` (same catalogue); raises
        ValueError, leaving the state as it was, when ``data`` is not such a snapshot."""
        try:
            state = converter.structure(dict(data), ExchangeState)
        except cattrs.BaseValidationError as e:
            reasons = "; ".join(cattrs.transform_error(e))
            raise ValueError(f"not a paper exchange snapshot: {reasons}") from e
        unknown = (set(state.prices) | set(state.market_open)) - set(self.catalogue)
        if unknown:
            raise ValueError(f"snapshot names symbols outside the catalogue: {sorted(unknown)}")
        self._state = state

    def export_book(self, account_id: str) -> dict[str, Any]:
        """One account's cash, holdings and open orders (finished orders travel one by one
        with ``export_order``), as JSON-compatible data."""
        account = self._account(account_id)
        open_orders = {cid: o for cid, o in account.orders.items() if o.is_open}
        book = Account(cash=account.cash, holdings=account.holdings, orders=open_orders)
        data: dict[str, Any] = converter.unstructure(book)
        return data

    def import_book(self, account_id: str, data: Mapping[str, Any]) -> None:
        """Replace one account's cash, holdings and open orders with an exported book; the
        finished orders already known here stay."""
        book = converter.structure(dict(data), Account)
        account = self._account(account_id)
        account.cash, account.holdings = book.cash, book.holdings
        account.orders.update(book.orders)

    def export_order(self, account_id: str, client_order_id: str) -> dict[str, Any] | None:
        """One recorded order as JSON-compatible data, or None when unknown."""
        order = self._account(account_id).orders.get(client_order_id)
        if order is None:
            return None
        data: dict[str, Any] = converter.unstructure(order)
        return data

    def import_order(self, account_id: str, data: Mapping[str, Any]) -> None:
        """Record an exported order again (an order placed by an earlier process)."""
        order = converter.structure(dict(data), PaperOrder)
        self._account(account_id).orders[order.client_order_id] = order

    def forget_finished(self, account_id: str, keep: int) -> None:
        """Once the account holds more than twice ``keep`` orders, drop its finished ones but
        the ``keep`` placed last: the account then holds between ``keep`` and twice ``keep``
        finished orders, and the scan runs about once every ``keep`` calls. For a caller that
        has saved them elsewhere and recalls them from there when asked again
        (``PersistentPaperBroker``): a finished order never changes, and open orders, cash
        and holdings are untouched."""
        orders = self._account(account_id).orders
        if len(orders) <= 2 * keep:
            return
        finished = [cid for cid, order in orders.items() if not order.is_open]
        for cid in finished[: max(0, len(finished) - keep)]:
            del orders[cid]

    def forget_account(self, account_id: str) -> None:
        """Drop everything held of one account (cash, holdings, orders): for a caller that
        keeps the account elsewhere and loads it from there again (``import_book``)."""
        self._state.accounts.pop(account_id, None)

    def knows_order(self, account_id: str, client_order_id: str) -> bool:
        return client_order_id in self._account(account_id).orders

    # -- internals ---------------------------------------------------------------------------

    def _account(self, account_id: str) -> Account:
        account = self._state.accounts.get(account_id)
        if account is None:
            account = Account(cash=self._state.default_cash)
            self._state.accounts[account_id] = account
        return account

    def _record(self, account: Account, order: PaperOrder) -> None:
        self._state.order_sequence += 1
        # unique across processes that each hold part of the accounts: derived from the
        # client order id, which is unique per account, and the account's own order count
        digest = hashlib.sha256(order.client_order_id.encode()).hexdigest()[:12]
        order.broker_order_id = f"paper-{digest}-{len(account.orders) + 1}"
        account.orders[order.client_order_id] = order

    def _fill(self, account: Account, order: PaperOrder, quantity: Decimal) -> None:
        instrument = self.catalogue[order.symbol]
        account.fill(instrument, order, quantity, self.catalogue, self._state.prices)

    def _reject(self, account: Account, order: PaperOrder, error: OrderError) -> BrokerOrder:
        order.status, order.rejection = BrokerOrderStatus.REJECTED, error
        self._record(account, order)
        return order.view()

    def _check(self, account: Account, order: PaperOrder, now: datetime) -> OrderError | None:
        instrument = self.catalogue.get(order.symbol)
        if instrument is None:
            return OrderError(
                RejectionCode.INVALID_SYMBOL,
                f"symbol not found in broker contracts: {order.symbol}",
            )
        if instrument.position_mode is not PositionMode.ONE_WAY:
            return OrderError(
                RejectionCode.POSITION_MODE_MISMATCH,
                f"{order.symbol}: the account is in hedge position mode; "
                "switch it to one-way mode to trade",
            )
        if not self.is_market_open(order.symbol, now):
            return OrderError(
                RejectionCode.MARKET_CLOSED,
                f"market closed for {order.symbol}; trading hours: {instrument.hours.text}",
            )
        if order.reduce_only:
            return None
        return account.margin_refusal(
            instrument, order.side, order.quantity, self.catalogue, self._state.prices
        )


@attrs.frozen
class PaperConditions:
    """Simulated network conditions of a paper exchange: ``latency_s`` before every call, and
    a dropped connection on every ``disconnect_every``-th call (0: never). Operators set them
    (PAPER_BROKER_LATENCY_MS, PAPER_BROKER_DISCONNECT_EVERY) to rehearse slow or flaky
    brokers; the defaults are a perfect broker."""

    latency_s: float = 0.0
    disconnect_every: int = 0


class PaperBroker:
    """One account's connection to a ``PaperExchange`` (``tradecore.ports.broker.Broker``).

    Calls raise ``BrokerDisconnected`` until ``connect`` has been called, and after the
    exchange drops the connection (``PaperExchange.disconnect``). With ``conditions`` and a
    ``sleeper`` every call first waits the simulated latency and may find the line dropped.
    With ``prices`` a new order first moves its symbol to the source's price (None: the
    exchange's prices stay as they are).
    """

    def __init__(
        self,
        exchange: PaperExchange,
        account_id: str,
        clock: Clock,
        *,
        conditions: PaperConditions | None = None,
        sleeper: Sleeper | None = None,
        prices: PriceSource | None = None,
    ) -> None:
        self.exchange = exchange
        self.account_id = account_id
        self._clock = clock
        self._conditions = conditions or PaperConditions()
        self._sleeper = sleeper
        self._prices = prices

    @property
    def name(self) -> str:
        return "paper"

    @property
    def placements_wait_for_outcome(self) -> bool:
        return False

    async def close(self) -> None:
        """Nothing to release: the exchange lives in this process."""

    async def connect(self) -> None:
        await self._travel()
        self.exchange.links.connect(self.account_id)

    async def instruments(self) -> frozenset[str]:
        await self._arrive()
        return self.exchange.symbols()

    async def positions(self) -> Mapping[str, Decimal]:
        await self._arrive()
        return self.exchange.positions(self.account_id)

    async def place_order(
        self,
        client_order_id: str,
        symbol: str,
        side: Side,
        quantity: Decimal,
        *,
        reduce_only: bool = False,
        fresh: bool = False,  # nothing to skip: the exchange in memory holds every order
    ) -> BrokerOrder:
        await self._arrive()
        await self._mark(client_order_id, symbol)
        return self.exchange.place(
            self.account_id,
            client_order_id,
            symbol,
            side,
            quantity,
            reduce_only=reduce_only,
            now=self._clock.now(),
        )

    async def order_status(self, client_order_id: str, symbol: str) -> BrokerOrder | None:
        await self._arrive()
        return self.exchange.order_status(self.account_id, client_order_id)

    async def _mark(self, client_order_id: str, symbol: str) -> None:
        """Set the source's price of ``symbol`` before a new order fills at it (an order
        placed again fills at nothing: no price is asked)."""
        if (
            self._prices is None
            or symbol not in self.exchange.catalogue
            or self.exchange.knows_order(self.account_id, client_order_id)
        ):
            return
        price = await self._prices.price(symbol)
        if price is not None:
            self.exchange.set_price(symbol, price)

    async def _travel(self) -> None:
        if self._conditions.latency_s > 0 and self._sleeper is not None:
            await self._sleeper.sleep(self._conditions.latency_s)

    async def _arrive(self) -> None:
        """The simulated trip to the exchange; raises BrokerDisconnected on a dropped line."""
        await self._travel()
        every = self._conditions.disconnect_every
        if every > 0:
            self.exchange.calls_made += 1
            if self.exchange.calls_made % every == 0:
                self.exchange.disconnect(self.account_id)
        self.exchange.links.check(self.account_id)
