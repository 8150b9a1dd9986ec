"""The paper exchange run side by side with a simple model of what it must do.

The model knows only the rules: a known client order id returns the recorded order; a
reduce-only order fills at most what is held against it; any other order must fit the opening
part of each fill into the cash left after the positions' margin (a rest that no longer fits
is cancelled); a delayed order fills once polled enough. Prices stay fixed, so cash never
moves and the margin arithmetic is exact.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tradecore.orders import RejectionCode, Side
from tradecore.ports.broker import BrokerOrder, BrokerOrderStatus
from tradecore.testing.clock import FakeClock
from tradecore_adapters.brokers.catalogue import default_catalogue
from tradecore_adapters.brokers.paper import PaperBroker, PaperExchange

ACCOUNT = "acct-1"
CASH = Decimal(100000)
SYMBOLS = ("BTCUSDT", "ES", "MES", "EURUSD")
CATALOGUE = default_catalogue()
MARGIN = {s: CATALOGUE[s].margin(Decimal(1), CATALOGUE[s].reference_price) for s in SYMBOLS}
CLIENT_IDS = tuple(f"c{n}" for n in range(12))
ZERO = Decimal(0)


@attrs.define
class ModelOrder:
    symbol: str
    side: Side
    quantity: Decimal
    reduce_only: bool
    rejected: bool
    filled: Decimal = ZERO
    polls: int = 0
    fill_after: int | None = None
    done: bool = False
    margin_cancelled: bool = False
    broker_order_id: str = ""


def against(position: Decimal, side: Side) -> Decimal:
    return abs(position) if position * side.sign < 0 else ZERO


class PaperBrokerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.exchange = PaperExchange()
        self.broker = self._connect(self.exchange)
        self.positions: dict[str, Decimal] = dict.fromkeys(SYMBOLS, ZERO)
        self.orders: dict[str, ModelOrder] = {}

    def teardown(self) -> None:
        self.loop.close()

    def _connect(self, exchange: PaperExchange) -> PaperBroker:
        broker = PaperBroker(exchange, ACCOUNT, self.clock)
        self.loop.run_until_complete(broker.connect())
        return broker

    def _available(self) -> Decimal:
        return CASH - sum((abs(q) * MARGIN[s] for s, q in self.positions.items()), ZERO)

    def _fits(self, symbol: str, side: Side, quantity: Decimal) -> bool:
        closing = min(quantity, against(self.positions[symbol], side))
        opening = quantity - closing
        return opening * MARGIN[symbol] <= self._available() + closing * MARGIN[symbol]

    def _fill(self, order: ModelOrder, quantity: Decimal) -> None:
        before = self.positions[order.symbol]
        if order.reduce_only:
            quantity = min(quantity, against(before, order.side))
        elif not self._fits(order.symbol, order.side, quantity):
            order.done = order.margin_cancelled = True
            return
        after = before + order.side.sign * quantity
        if order.reduce_only:
            assert abs(after) <= abs(before)  # reduce-only never increases exposure
        self.positions[order.symbol] = after
        order.filled += quantity
        nothing_left = order.reduce_only and against(after, order.side) == 0
        order.done = order.filled == order.quantity or nothing_left

    @rule(
        cid=st.sampled_from(CLIENT_IDS),
        symbol=st.sampled_from(SYMBOLS),
        side=st.sampled_from(Side),
        quantity=st.integers(min_value=1, max_value=8).map(Decimal),
        reduce_only=st.booleans(),
        delay=st.none() | st.integers(min_value=1, max_value=3),
    )
    def place(
        self,
        cid: str,
        symbol: str,
        side: Side,
        quantity: Decimal,
        reduce_only: bool,
        delay: int | None,
    ) -> None:
        known = self.orders.get(cid)
        if known is None and delay is not None:
            self.exchange.delay_next_fill(delay)
        positions_before = dict(self.positions)
        order = self.loop.run_until_complete(
            self.broker.place_order(cid, symbol, side, quantity, reduce_only=reduce_only)
        )
        if known is not None:
            assert order.broker_order_id == known.broker_order_id
            assert order.filled_quantity == known.filled
            assert self.exchange.positions(ACCOUNT) == _nonzero(positions_before)
            return
        held = self.positions[symbol]
        if reduce_only:
            model = ModelOrder(symbol, side, min(quantity, against(held, side)), True, False)
            if model.quantity == 0:
                model.quantity, model.done = quantity, True
                assert order.status is BrokerOrderStatus.CANCELLED
        else:
            fits = self._fits(symbol, side, quantity)
            model = ModelOrder(symbol, side, quantity, False, rejected=not fits)
            if not fits:
                assert order.rejection is not None
                assert order.rejection.code is RejectionCode.INSUFFICIENT_MARGIN
                model.done = True
        model.broker_order_id = order.broker_order_id
        self.orders[cid] = model
        if not model.done:
            if delay is None:
                self._fill(model, model.quantity)
            else:
                model.fill_after = delay
        self._check(order, model)

    @precondition(lambda self: bool(self.orders))
    @rule(data=st.data())
    def poll(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.orders)))
        model = self.orders[cid]
        if not model.done:
            model.polls += 1
            if model.fill_after is not None and model.polls >= model.fill_after:
                self._fill(model, model.quantity - model.filled)
        order = self.loop.run_until_complete(self.broker.order_status(cid, model.symbol))
        assert order is not None
        self._check(order, model)

    @rule()
    def restart(self) -> None:
        """Persist the exchange through JSON and carry on with a fresh one and a new connection."""
        data = json.loads(json.dumps(self.exchange.snapshot()))
        self.exchange = PaperExchange()
        self.exchange.restore(data)
        self.broker = self._connect(self.exchange)

    def _check(self, order: BrokerOrder, model: ModelOrder) -> None:
        assert order.broker_order_id == model.broker_order_id
        assert order.filled_quantity == model.filled
        assert order.status.is_final == (model.done or model.rejected)
        if model.filled == model.quantity:
            assert order.status is BrokerOrderStatus.FILLED
        if model.margin_cancelled:
            assert order.status is BrokerOrderStatus.CANCELLED
            assert order.rejection is not None
            assert order.rejection.code is RejectionCode.INSUFFICIENT_MARGIN

    @invariant()
    def positions_match_the_model(self) -> None:
        assert self.exchange.positions(ACCOUNT) == _nonzero(self.positions)

    @invariant()
    def positions_are_the_sum_of_reported_fills(self) -> None:
        totals = dict.fromkeys(SYMBOLS, ZERO)
        for order in self.exchange.orders(ACCOUNT):
            totals[order.symbol] += order.side.sign * order.filled_quantity
        assert self.exchange.positions(ACCOUNT) == _nonzero(totals)

    @invariant()
    def balance_is_never_negative(self) -> None:
        assert self.exchange.balance(ACCOUNT) == CASH  # prices are fixed: no profit or loss
        assert self.exchange.available(ACCOUNT) == self._available()
        assert self.exchange.available(ACCOUNT) >= 0


def _nonzero(positions: dict[str, Decimal]) -> dict[str, Decimal]:
    return {s: q for s, q in positions.items() if q != 0}


TestPaperBroker = PaperBrokerMachine.TestCase
