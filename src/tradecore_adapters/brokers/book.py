"""One paper account's book: cash, signed holdings, orders by client order id, margin and fills.

A fill that crosses zero is a close of the held quantity (realising its profit or loss into
cash) followed by an open of the rest at the fill price, never one mutation. Margin is
``quantity * contract_size * price * margin_rate`` at the instrument's current price and is
checked for every fill that opens exposure: when the rest of an order comes to fill and no
longer fits, the rest is cancelled with ``insufficient_margin``. At fixed prices the available
balance therefore never goes negative.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

import attrs

from tradecore.orders import OrderError, RejectionCode, Side
from tradecore.ports.broker import BrokerOrder, BrokerOrderStatus
from tradecore_adapters.brokers.catalogue import Instrument

ZERO = Decimal(0)


@attrs.define
class Holding:
    """A signed position (positive long) and its average entry price."""

    quantity: Decimal = ZERO
    average_price: Decimal = ZERO


@attrs.define
class PaperOrder:
    """A recorded order. ``rest_after_polls``: the unfilled rest fills once the order has been
    polled that many times (None: it never fills by itself)."""

    broker_order_id: str
    client_order_id: str
    symbol: str
    side: Side
    quantity: Decimal
    reduce_only: bool
    status: BrokerOrderStatus
    filled_quantity: Decimal = ZERO
    average_price: Decimal | None = None
    rejection: OrderError | None = None
    polls: int = 0
    rest_after_polls: int | None = None

    @property
    def remaining(self) -> Decimal:
        return self.quantity - self.filled_quantity

    @property
    def is_open(self) -> bool:
        return not self.status.is_final

    def view(self) -> BrokerOrder:
        return BrokerOrder(
            broker_order_id=self.broker_order_id,
            client_order_id=self.client_order_id,
            symbol=self.symbol,
            side=self.side,
            quantity=self.quantity,
            status=self.status,
            filled_quantity=self.filled_quantity,
            average_price=self.average_price,
            reduce_only=self.reduce_only,
            rejection=self.rejection,
        )


def reducible(position: Decimal, side: Side) -> Decimal:
    """How much an order on ``side`` can reduce ``position`` (0 when it would only add)."""
    return abs(position) if position * side.sign < 0 else ZERO


@attrs.define
class Account:
    """Cash (starting balance plus realised profit and loss), holdings and orders."""

    cash: Decimal
    holdings: dict[str, Holding] = attrs.field(factory=dict)
    orders: dict[str, PaperOrder] = attrs.field(factory=dict)

    def position(self, symbol: str) -> Decimal:
        holding = self.holdings.get(symbol)
        return holding.quantity if holding is not None else ZERO

    def used_margin(
        self, catalogue: Mapping[str, Instrument], prices: Mapping[str, Decimal]
    ) -> Decimal:
        """Margin held by the positions at current prices."""
        return sum(
            (
                catalogue[symbol].margin(abs(h.quantity), prices[symbol])
                for symbol, h in self.holdings.items()
            ),
            ZERO,
        )

    def available(
        self, catalogue: Mapping[str, Instrument], prices: Mapping[str, Decimal]
    ) -> Decimal:
        return self.cash - self.used_margin(catalogue, prices)

    def margin_refusal(
        self,
        instrument: Instrument,
        side: Side,
        quantity: Decimal,
        catalogue: Mapping[str, Instrument],
        prices: Mapping[str, Decimal],
    ) -> OrderError | None:
        """``insufficient_margin`` when the opening part of ``quantity`` on ``side`` does not
        fit the available balance, else None. The closing part is credited first: it frees
        its margin and realises its profit or loss."""
        price = prices[instrument.symbol]
        holding = self.holdings.get(instrument.symbol, Holding())
        closing = min(quantity, reducible(holding.quantity, side))
        opening = quantity - closing
        if opening <= 0:
            return None
        realised = _pnl(instrument, holding, closing, price)
        freed = instrument.margin(closing, price)
        available = self.available(catalogue, prices) + freed + realised
        required = instrument.margin(opening, price)
        if required <= available:
            return None
        return OrderError(
            RejectionCode.INSUFFICIENT_MARGIN,
            f"insufficient margin: {required:f} needed, {max(available, ZERO):f} available",
        )

    def fill(
        self,
        instrument: Instrument,
        order: PaperOrder,
        quantity: Decimal,
        catalogue: Mapping[str, Instrument],
        prices: Mapping[str, Decimal],
    ) -> None:
        """Fill up to ``quantity`` of ``order`` at the current price.

        A reduce-only order fills at most what is held against it and is cancelled when
        nothing is left to reduce; any other fill whose opening part does not fit the
        available balance cancels the order's rest with ``insufficient_margin``.
        """
        if order.reduce_only:
            quantity = min(quantity, reducible(self.position(order.symbol), order.side))
        elif quantity > 0:
            refusal = self.margin_refusal(instrument, order.side, quantity, catalogue, prices)
            if refusal is not None:
                order.status, order.rejection = BrokerOrderStatus.CANCELLED, refusal
                return
        if quantity > 0:
            price = prices[order.symbol]
            holding = self.holdings.setdefault(order.symbol, Holding())
            self._apply(instrument, holding, order.side, quantity, price)
            if holding.quantity == 0:
                del self.holdings[order.symbol]
            previous = order.filled_quantity * (order.average_price or ZERO)
            order.filled_quantity += quantity
            order.average_price = (previous + quantity * price) / order.filled_quantity
        if order.remaining <= 0:
            order.status = BrokerOrderStatus.FILLED
        elif order.reduce_only and reducible(self.position(order.symbol), order.side) == 0:
            order.status = BrokerOrderStatus.CANCELLED  # nothing left to reduce
        elif order.filled_quantity > 0:
            order.status = BrokerOrderStatus.PARTIALLY_FILLED

    def _apply(
        self,
        instrument: Instrument,
        holding: Holding,
        side: Side,
        quantity: Decimal,
        price: Decimal,
    ) -> None:
        closing = min(quantity, reducible(holding.quantity, side))
        if closing:
            self.cash += _pnl(instrument, holding, closing, price)
            holding.quantity += side.sign * closing
        opening = quantity - closing
        if opening:
            size = abs(holding.quantity)
            holding.average_price = (size * holding.average_price + opening * price) / (
                size + opening
            )
            holding.quantity += side.sign * opening


def _pnl(instrument: Instrument, holding: Holding, closing: Decimal, price: Decimal) -> Decimal:
    if closing <= 0:
        return ZERO
    direction = 1 if holding.quantity > 0 else -1
    return closing * instrument.contract_size * (price - holding.average_price) * direction
