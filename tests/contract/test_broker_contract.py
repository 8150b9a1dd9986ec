"""The broker contract (``tradecore.ports.broker.Broker``), one suite for every broker: the paper
broker, and the real adapters (ccxt for Binance USDⓈ-M, Binance spot and Bybit linear; alpaca-py
for Alpaca) against local venue emulators that speak each venue's documented wire format.

Each ``Harness`` arranges its venue (prices, partial fills, faults) and reads what the venue
holds; the tests only use the port. Where a case cannot arise for a broker (the paper broker
needs no credentials and answers in process), the harness says so and the case is skipped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any, Protocol

import pytest

from tradecore.errors import BrokerDisconnected, CredentialsRejected
from tradecore.orders import RejectionCode, Side
from tradecore.ports.broker import Broker, BrokerAccount, BrokerOrderStatus
from tradecore.testing.clock import FakeClock
from tradecore_adapters.brokers.alpaca_venue import AlpacaVenue
from tradecore_adapters.brokers.ccxt_venue import DIALECTS, CcxtVenue
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_adapters.brokers.script import Fill
from venues.alpaca import AlpacaVenue as AlpacaEmulator
from venues.base import LocalVenue, LoseAnswer, Refuse
from venues.binance import BinanceVenue
from venues.bybit import BybitVenue

KEY, SECRET = "test-key-0001", "test-secret-0001"
ACCOUNT = "acct-contract"
TIMEOUT_MS = 800
# ccxt's pacing shortened for a local venue: its rate limiter stays on, with a 1 ms interval.
FAST_CCXT = {"rateLimit": 1, "timeout_on_exit": 0}
# A core client order id as the worker makes them: the order-history id and the step.
CID = "3f2a9c1e-4b5d-4e6f-8a7b-9c0d1e2f3a4b-entry"


class Harness(Protocol):
    name: str
    symbol: str
    quantity: Decimal
    price: Decimal

    async def broker(self, *, secret: str = SECRET) -> Broker: ...
    def placed(self) -> int: ...
    def position(self) -> Decimal: ...
    def partial_next(self) -> None: ...
    def complete(self) -> None: ...
    def lose_next_placement(self) -> None: ...
    def hedge_mode(self) -> str: ...
    def rate_limit_next_placement(self) -> None: ...
    async def go_down(self) -> None: ...


class PaperHarness:
    name = "paper"
    symbol = "BTCUSDT"
    quantity = Decimal("0.5")
    price = Decimal(60000)

    def __init__(self) -> None:
        self.exchange = PaperExchange()
        self.factory = PaperBrokerFactory(self.exchange, PaperExchange(), FakeClock())

    async def broker(self, *, secret: str = SECRET) -> Broker:
        if secret != SECRET:
            pytest.skip("the paper broker takes no credentials")
        broker = self.factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
        await broker.connect()
        return broker

    def placed(self) -> int:
        """Orders the exchange took (it also records the ones it refused)."""
        taken = self.exchange.orders(ACCOUNT)
        return sum(1 for o in taken if o.status is not BrokerOrderStatus.REJECTED)

    def position(self) -> Decimal:
        return self.exchange.position(ACCOUNT, self.symbol)

    def partial_next(self) -> None:
        self.exchange.script(Fill.partial(Decimal("0.4"), rest_after_polls=2))

    def complete(self) -> None:
        """The paper exchange fills the rest after the next status polls."""

    def lose_next_placement(self) -> None:
        pytest.skip("the paper exchange answers in process: no answer can be lost")

    def hedge_mode(self) -> str:
        return "ETHUSDT"  # the paper catalogue holds it in hedge mode

    def rate_limit_next_placement(self) -> None:
        self.exchange.reject_next(RejectionCode.BROKER_RATE_LIMITED, retry_after=2)

    async def go_down(self) -> None:
        self.exchange.disconnect(ACCOUNT, refuse_reconnects=99)


class EmulatedHarness:
    """A real adapter against a local venue emulator."""

    def __init__(
        self,
        name: str,
        emulator: Any,
        order_path: str,
        rate_limit: Refuse,
        symbol: str,
        quantity: Decimal,
        price: Decimal,
    ) -> None:
        self.name = name
        self.emulator = emulator
        self.order_path = order_path
        self.rate_limit = rate_limit
        self.symbol = symbol
        self.quantity = quantity
        self.price = price
        self.brokers: list[Broker] = []
        emulator.add_account(KEY, SECRET)
        emulator.set_price(symbol, price)

    def connector(self) -> Any:
        if self.name == "alpaca":
            return AlpacaVenue(endpoint=self.emulator.origin, timeout_s=TIMEOUT_MS / 1000)
        return CcxtVenue(
            DIALECTS[self.name],
            endpoint=self.emulator.origin,
            timeout_ms=TIMEOUT_MS,
            config=FAST_CCXT,
        )

    async def broker(self, *, secret: str = SECRET) -> Broker:
        account = BrokerAccount(ACCOUNT, self.name, False, {"api_key": KEY, "api_secret": secret})
        broker = self.connector().open(account)
        self.brokers.append(broker)
        await broker.connect()
        return broker

    def placed(self) -> int:
        return len(self.emulator.placed(KEY))

    def position(self) -> Decimal:
        return Decimal(self.emulator.position(KEY, self.symbol))

    def partial_next(self) -> None:
        self.emulator.fill_next_partially(Decimal("0.4"))

    def complete(self) -> None:
        self.emulator.fill_resting()

    def lose_next_placement(self) -> None:
        self.emulator.fault("POST", self.order_path, LoseAnswer())

    def hedge_mode(self) -> str:
        if self.name in ("binance", "alpaca"):
            pytest.skip(f"{self.name} (spot, equities) has no position modes")
        self.emulator.set_hedge_mode(KEY, True)
        return self.symbol

    def rate_limit_next_placement(self) -> None:
        self.emulator.fault("POST", self.order_path, self.rate_limit)

    async def go_down(self) -> None:
        await self.emulator.close()

    async def close(self) -> None:
        for broker in self.brokers:
            await broker.close()


BROKERS = ["paper", "binanceusdm", "binance", "bybit", "alpaca"]


async def _emulated(name: str) -> tuple[LocalVenue, EmulatedHarness]:
    if name in ("binanceusdm", "binance"):
        binance = BinanceVenue(default_market="usdm" if name == "binanceusdm" else "spot")
        await binance.start()
        path = "/fapi/v1/order" if name == "binanceusdm" else "/api/v3/order"
        quantity = Decimal("0.5") if name == "binanceusdm" else Decimal("0.01")
        limited = Refuse(429, {"code": -1003, "msg": "Too many requests."}, {"Retry-After": "2"})
        return binance, EmulatedHarness(
            name, binance, path, limited, "BTCUSDT", quantity, Decimal(60000)
        )
    if name == "bybit":
        bybit = BybitVenue()
        await bybit.start()
        reset_ms = str(int((time.time() + 2) * 1000))  # Bybit's rate-limit reset header
        limited = Refuse(
            429,
            {"retCode": 10006, "retMsg": "Too many visits!", "result": {}, "time": 0},
            {"X-Bapi-Limit-Reset-Timestamp": reset_ms},
        )
        return bybit, EmulatedHarness(
            name, bybit, "/v5/order/create", limited, "BTCUSDT", Decimal("0.5"), Decimal(60000)
        )
    alpaca = AlpacaEmulator()
    await alpaca.start()
    alpaca.set_market_open(True)
    limited = Refuse(
        429, {"code": 42910000, "message": "rate limit exceeded"}, {"Retry-After": "2"}
    )
    return alpaca, EmulatedHarness(
        name, alpaca, "/v2/orders", limited, "AAPL", Decimal(3), Decimal("190.5")
    )


@pytest.fixture(params=BROKERS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "paper":
        yield PaperHarness()
        return
    venue, emulated = await _emulated(request.param)
    try:
        yield emulated
    finally:
        await emulated.close()
        await venue.close()


# --- connecting -------------------------------------------------------------------------


async def test_a_connected_broker_lists_the_symbol_and_starts_flat(harness: Harness) -> None:
    broker = await harness.broker()
    assert harness.symbol in await broker.instruments()
    assert (await broker.positions()).get(harness.symbol, Decimal(0)) == 0


async def test_refused_credentials_raise_with_the_venues_reason(harness: Harness) -> None:
    with pytest.raises(CredentialsRejected) as refused:
        await harness.broker(secret="not-the-secret")
    assert refused.value.args[0]
    assert "not-the-secret" not in str(refused.value)
    assert SECRET not in str(refused.value)


# --- placing ----------------------------------------------------------------------------


async def test_a_market_order_fills_at_the_venues_price(harness: Harness) -> None:
    broker = await harness.broker()
    order = await broker.place_order(CID, harness.symbol, Side.BUY, harness.quantity, fresh=True)
    assert order.status is BrokerOrderStatus.FILLED
    assert order.client_order_id == CID
    assert order.symbol == harness.symbol
    assert order.filled_quantity == harness.quantity
    assert order.average_price == harness.price
    assert order.broker_order_id
    assert harness.position() == harness.quantity
    assert (await broker.positions())[harness.symbol] == harness.quantity


async def test_placing_a_known_client_id_again_returns_the_same_order(harness: Harness) -> None:
    broker = await harness.broker()
    first = await broker.place_order(CID, harness.symbol, Side.BUY, harness.quantity, fresh=True)
    again = await broker.place_order(CID, harness.symbol, Side.BUY, harness.quantity)
    assert again.broker_order_id == first.broker_order_id
    assert harness.placed() == 1
    assert harness.position() == harness.quantity


async def test_a_new_connection_finds_an_order_placed_before_a_crash(harness: Harness) -> None:
    before_crash = await harness.broker()
    first = await before_crash.place_order(
        CID, harness.symbol, Side.BUY, harness.quantity, fresh=True
    )
    after_restart = await harness.broker()  # a new worker: nothing remembered locally
    again = await after_restart.place_order(CID, harness.symbol, Side.BUY, harness.quantity)
    assert again.broker_order_id == first.broker_order_id
    assert harness.placed() == 1


async def test_an_answer_lost_after_the_venue_took_the_order_is_found_not_repeated(
    harness: Harness,
) -> None:
    broker = await harness.broker()
    harness.lose_next_placement()
    order = await broker.place_order(CID, harness.symbol, Side.BUY, harness.quantity, fresh=True)
    assert order.client_order_id == CID
    assert order.status is BrokerOrderStatus.FILLED
    assert harness.placed() == 1


async def test_a_reduce_only_exit_closes_the_position(harness: Harness) -> None:
    broker = await harness.broker()
    await broker.place_order(CID, harness.symbol, Side.BUY, harness.quantity, fresh=True)
    exit_id = CID.replace("entry", "exit")
    order = await broker.place_order(
        exit_id, harness.symbol, Side.SELL, harness.quantity, reduce_only=True, fresh=True
    )
    assert order.status is BrokerOrderStatus.FILLED
    assert harness.position() == 0
    assert (await broker.positions()).get(harness.symbol, Decimal(0)) == 0


async def test_an_unknown_symbol_is_refused_without_an_order(harness: Harness) -> None:
    broker = await harness.broker()
    order = await broker.place_order(CID, "NOSUCHSYMBOL", Side.BUY, harness.quantity, fresh=True)
    assert order.status is BrokerOrderStatus.REJECTED
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.INVALID_SYMBOL
    assert harness.placed() == 0


async def test_a_venue_rate_limit_is_a_rejection_with_a_wait(harness: Harness) -> None:
    broker = await harness.broker()
    harness.rate_limit_next_placement()
    order = await broker.place_order(CID, harness.symbol, Side.BUY, harness.quantity, fresh=True)
    assert order.status is BrokerOrderStatus.REJECTED
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.BROKER_RATE_LIMITED
    assert order.rejection.retry_after is not None
    assert 1 <= order.rejection.retry_after <= 2
    assert harness.placed() == 0


async def test_a_hedge_mode_account_is_told_to_switch_to_one_way(harness: Harness) -> None:
    broker = await harness.broker()
    symbol = harness.hedge_mode()
    order = await broker.place_order(CID, symbol, Side.BUY, harness.quantity, fresh=True)
    assert order.status is BrokerOrderStatus.REJECTED
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.POSITION_MODE_MISMATCH
    assert "one-way" in order.rejection.message
    assert harness.placed() == 0


# --- following an order -----------------------------------------------------------------


async def test_order_status_follows_a_partial_fill_to_the_end(harness: Harness) -> None:
    broker = await harness.broker()
    harness.partial_next()
    order = await broker.place_order(CID, harness.symbol, Side.BUY, harness.quantity, fresh=True)
    assert order.status is BrokerOrderStatus.PARTIALLY_FILLED
    assert 0 < order.filled_quantity < harness.quantity
    harness.complete()
    polled = [await broker.order_status(CID, harness.symbol) for _ in range(2)]
    final = polled[-1]
    assert final is not None
    assert final.status is BrokerOrderStatus.FILLED
    assert final.filled_quantity == harness.quantity
    assert final.broker_order_id == order.broker_order_id


async def test_order_status_of_an_order_never_sent_is_none(harness: Harness) -> None:
    broker = await harness.broker()
    assert await broker.order_status(CID, harness.symbol) is None


async def test_an_unreachable_venue_is_a_disconnect(harness: Harness) -> None:
    broker = await harness.broker()
    await harness.go_down()
    with pytest.raises(BrokerDisconnected):
        await broker.positions()
