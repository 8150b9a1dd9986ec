"""The Alpaca adapter (``tradecore_adapters.brokers.alpaca_venue``) against the local Alpaca
emulator (``venues.alpaca``), through the real alpaca-py client."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest
from alpaca.trading.client import TradingClient
from alpaca.trading.models import Clock

from tradecore.errors import BrokerDisconnected, CredentialsRejected
from tradecore.orders import RejectionCode, Side
from tradecore.ports.broker import Broker, BrokerAccount, BrokerOrder, BrokerOrderStatus
from tradecore_adapters.brokers.alpaca_venue import (
    NOT_LOADED,
    AlpacaBroker,
    AlpacaVenue,
    broker_status,
)
from tradecore_adapters.brokers.client_ids import venue_client_id
from venues.alpaca import AlpacaVenue as AlpacaEmulator
from venues.alpaca import rate_limited
from venues.base import Delay, LoseAnswer, Refuse

KEY = "PKTESTKEY"
SECRET = "alpaca-test-secret"
ORDER_ID = "0b9a3c1e-5d7f-4a2b-9c8d-1e2f3a4b5c6d"
ORDERS = "/v2/orders"


@pytest.fixture
async def emulator() -> AsyncIterator[AlpacaEmulator]:
    venue = AlpacaEmulator()
    venue.add_account(KEY, SECRET)
    await venue.start()
    yield venue
    await venue.close()


def account(secret: str = SECRET) -> BrokerAccount:
    return BrokerAccount(
        "acct-1", "alpaca", testnet=True, credentials={"api_key": KEY, "api_secret": secret}
    )


@pytest.fixture
def connector(emulator: AlpacaEmulator) -> AlpacaVenue:
    return AlpacaVenue(endpoint=emulator.origin, timeout_s=2.0)


@pytest.fixture
async def broker(connector: AlpacaVenue) -> AsyncIterator[AlpacaBroker]:
    opened = connector.open(account())
    await opened.connect()
    yield opened
    await opened.close()


def cid(role: str = "entry") -> str:
    return f"{ORDER_ID}-{role}"


async def buy(broker: AlpacaBroker, symbol: str, quantity: str, **kw: bool) -> BrokerOrder:
    return await broker.place_order(cid(), symbol, Side.BUY, Decimal(quantity), **kw)


def emulator_clock(emulator: AlpacaEmulator) -> Clock:
    clock = TradingClient(KEY, SECRET, paper=True, url_override=emulator.origin).get_clock()
    assert isinstance(clock, Clock)
    return clock


async def test_connect_loads_the_tradable_assets(
    connector: AlpacaVenue, broker: AlpacaBroker
) -> None:
    assert isinstance(broker, Broker)
    assert broker.name == connector.name == "alpaca"
    assert await broker.instruments() == {"AAPL", "MSFT", "SPY"}
    assert await connector.symbols(testnet=True) == {"AAPL", "MSFT", "SPY"}
    with pytest.raises(BrokerDisconnected, match="verify an account first"):
        await connector.symbols(testnet=False)


async def test_symbols_need_a_connection_first(connector: AlpacaVenue) -> None:
    with pytest.raises(BrokerDisconnected) as caught:
        await connector.symbols(testnet=True)
    assert str(caught.value) == NOT_LOADED


async def test_connect_reads_the_account_every_time_and_the_assets_once(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    await broker.connect()
    assert emulator.count("GET", "/v2/account") == 2
    assert emulator.count("GET", "/v2/assets") == 1


async def test_a_wrong_secret_is_refused_with_alpacas_reason(connector: AlpacaVenue) -> None:
    broker = connector.open(account(secret="not-the-secret"))
    with pytest.raises(CredentialsRejected) as caught:
        await broker.connect()
    assert str(caught.value) == "request is not authorized"
    for text in (str(caught.value), repr(broker), repr(account("not-the-secret"))):
        assert "not-the-secret" not in text
        assert KEY not in text
    await broker.close()


async def test_missing_credentials_are_refused_without_a_request(
    emulator: AlpacaEmulator, connector: AlpacaVenue
) -> None:
    broker = connector.open(BrokerAccount("acct-1", "alpaca", credentials={"api_key": KEY}))
    with pytest.raises(CredentialsRejected, match="secret key"):
        await broker.connect()
    assert emulator.requests == []


async def test_a_failing_venue_is_a_disconnect(
    emulator: AlpacaEmulator, connector: AlpacaVenue
) -> None:
    emulator.fault("GET", "/v2/account", Refuse(503, {"code": 50310000, "message": "down"}))
    broker = connector.open(account())
    with pytest.raises(BrokerDisconnected, match="503"):
        await broker.connect()
    await broker.connect()  # the next attempt goes through
    await broker.close()


async def test_positions_are_signed_by_side(emulator: AlpacaEmulator, broker: AlpacaBroker) -> None:
    emulator.set_position(KEY, "AAPL", Decimal(10))
    emulator.set_position(KEY, "MSFT", Decimal(-5))
    assert await broker.positions() == {"AAPL": Decimal(10), "MSFT": Decimal(-5)}


async def test_a_market_order_fills_at_the_set_price(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    emulator.set_price("AAPL", Decimal("150.5"))
    order = await buy(broker, "AAPL", "10", fresh=True)
    assert (order.status, order.filled_quantity, order.average_price) == (
        BrokerOrderStatus.FILLED,
        Decimal(10),
        Decimal("150.5"),
    )
    assert (order.client_order_id, order.symbol, order.side, order.quantity) == (
        cid(),
        "AAPL",
        Side.BUY,
        Decimal(10),
    )
    assert order.broker_order_id and order.rejection is None and not order.reduce_only
    assert emulator.position(KEY, "AAPL") == 10
    assert await broker.order_status(cid(), "AAPL") == order


async def test_a_repeated_placement_returns_the_first_order(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    first = await buy(broker, "SPY", "2")
    again = await buy(broker, "SPY", "2")
    assert again == first
    assert len(emulator.placed(KEY)) == 1
    assert emulator.count("POST", ORDERS) == 1  # the lookup found it: nothing sent again


async def test_alpacas_duplicate_refusal_returns_the_order_it_holds(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    first = await buy(broker, "SPY", "2", fresh=True)
    again = await buy(broker, "SPY", "2", fresh=True)  # a wrong hint: Alpaca deduplicates
    assert again == first
    assert emulator.count("POST", ORDERS) == 2
    assert len(emulator.placed(KEY)) == 1


async def test_a_lost_answer_is_resolved_by_the_client_id(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    emulator.fault("POST", ORDERS, LoseAnswer())
    order = await buy(broker, "AAPL", "3", fresh=True)
    assert (order.status, order.client_order_id, order.filled_quantity) == (
        BrokerOrderStatus.FILLED,
        cid(),
        Decimal(3),
    )
    assert [o.client_order_id for o in emulator.placed(KEY)] == [cid()]


async def test_a_timed_out_placement_is_never_sent_twice(emulator: AlpacaEmulator) -> None:
    broker = AlpacaVenue(endpoint=emulator.origin, timeout_s=0.1).open(account())
    await broker.connect()
    emulator.fault("POST", ORDERS, Delay(0.5))
    with pytest.raises(BrokerDisconnected, match="unconfirmed"):
        await buy(broker, "AAPL", "1", fresh=True)  # the venue has not acted yet
    for _ in range(200):
        if emulator.placed(KEY):
            break
        await asyncio.sleep(0.01)
    order = await buy(broker, "AAPL", "1")  # the worker's retry, after its reconnect
    assert order.status is BrokerOrderStatus.FILLED
    assert len(emulator.placed(KEY)) == 1
    assert emulator.count("POST", ORDERS) == 1
    await broker.close()


async def test_a_closed_market_is_refused_with_the_next_open(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    emulator.set_market_open(False)
    order = await buy(broker, "AAPL", "1")
    assert order.status is BrokerOrderStatus.REJECTED
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.MARKET_CLOSED
    next_open = (await asyncio.to_thread(emulator_clock, emulator)).next_open
    assert order.rejection.message.endswith(f"opens next at {next_open.isoformat()}")
    assert order.rejection.broker_message is None
    assert emulator.count("POST", ORDERS) == 0


async def test_an_open_market_costs_one_clock_read(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    await buy(broker, "AAPL", "1", fresh=True)
    await broker.place_order(cid("exit"), "AAPL", Side.SELL, Decimal(1), fresh=True)
    assert emulator.count("GET", "/v2/clock") == 1
    assert emulator.count("POST", ORDERS) == 2


async def test_fractions_of_a_non_fractionable_asset_are_refused_here(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    order = await buy(broker, "MSFT", "0.5", fresh=True)
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.INVALID_QUANTITY
    assert "MSFT" in order.rejection.message
    assert emulator.count("POST", ORDERS) == 0
    fractional = await broker.place_order(cid("x"), "AAPL", Side.BUY, Decimal("0.5"), fresh=True)
    assert fractional.filled_quantity == Decimal("0.5")


async def test_insufficient_buying_power_keeps_alpacas_words(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    emulator.set_price("SPY", Decimal(500))
    order = await buy(broker, "SPY", "201", fresh=True)
    assert (order.status, order.broker_order_id) == (BrokerOrderStatus.REJECTED, "")
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.INSUFFICIENT_MARGIN
    assert order.rejection.broker_message == "insufficient buying power"
    assert emulator.placed(KEY) == []


async def test_a_reduce_only_order_crossing_zero_is_refused_by_alpaca(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    emulator.set_position(KEY, "AAPL", Decimal(5))
    order = await broker.place_order(
        cid("close"), "AAPL", Side.SELL, Decimal(10), reduce_only=True, fresh=True
    )
    assert order.reduce_only
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.INSUFFICIENT_MARGIN
    assert order.rejection.broker_message == (
        "insufficient qty available for order (requested: 10, available: 5)"
    )
    assert emulator.position(KEY, "AAPL") == 5


@pytest.mark.parametrize(
    ("headers", "low", "high"),
    [({}, 55.0, 60.0), ({"Retry-After": "7"}, 7.0, 7.0)],
    ids=["ratelimit-reset", "retry-after"],
)
async def test_a_rate_limit_carries_the_wait(
    emulator: AlpacaEmulator,
    broker: AlpacaBroker,
    headers: dict[str, str],
    low: float,
    high: float,
) -> None:
    answer = rate_limited()
    emulator.fault("POST", ORDERS, Refuse(429, answer.body, {**answer.headers, **headers}))
    started = time.monotonic()
    order = await buy(broker, "AAPL", "1", fresh=True)
    assert time.monotonic() - started < 1.0  # alpaca-py's own 3 s retry is off
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.BROKER_RATE_LIMITED
    assert order.rejection.retry_after is not None
    assert low <= order.rejection.retry_after <= high
    assert order.rejection.broker_message == "rate limit exceeded"
    assert emulator.placed(KEY) == []


async def test_unknown_symbols_are_invalid(emulator: AlpacaEmulator, broker: AlpacaBroker) -> None:
    order = await buy(broker, "ZZZZ", "1")
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.INVALID_SYMBOL
    assert emulator.count("POST", ORDERS) == 0
    delisted = {"code": 42210000, "message": 'asset "AAPL" not found'}
    emulator.fault("POST", ORDERS, Refuse(422, delisted))  # delisted since the assets loaded
    order = await buy(broker, "AAPL", "1", fresh=True)
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.INVALID_SYMBOL
    assert order.rejection.broker_message == 'asset "AAPL" not found'


async def test_a_partial_fill_completes_through_order_status(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    emulator.set_price("AAPL", Decimal(100))
    emulator.fill_next_partially(Decimal("0.4"))
    order = await buy(broker, "AAPL", "10", fresh=True)
    assert (order.status, order.filled_quantity, order.average_price) == (
        BrokerOrderStatus.PARTIALLY_FILLED,
        Decimal(4),
        Decimal(100),
    )
    emulator.set_price("AAPL", Decimal(110))
    emulator.fill_resting()
    done = await broker.order_status(cid(), "AAPL")
    assert done is not None
    assert (done.status, done.filled_quantity, done.average_price, done.quantity) == (
        BrokerOrderStatus.FILLED,
        Decimal(10),
        Decimal(106),
        Decimal(10),
    )


async def test_an_unknown_order_has_no_status(broker: AlpacaBroker) -> None:
    assert await broker.order_status(cid("never"), "AAPL") is None


async def test_an_unreachable_venue_is_a_disconnect(
    emulator: AlpacaEmulator, connector: AlpacaVenue, broker: AlpacaBroker
) -> None:
    await emulator.close()
    with pytest.raises(BrokerDisconnected):
        await broker.positions()
    with pytest.raises(BrokerDisconnected):
        await buy(broker, "AAPL", "1")
    with pytest.raises(BrokerDisconnected):
        await connector.open(account()).connect()
    await broker.close()
    with pytest.raises(BrokerDisconnected, match="not connected"):
        await broker.positions()


async def test_client_ids_are_sent_as_alpaca_takes_them(
    emulator: AlpacaEmulator, broker: AlpacaBroker
) -> None:
    await buy(broker, "SPY", "1", fresh=True)  # UUID-role: 42 safe characters, under 128
    unsafe = "webhook:42/entry"  # ':' and '/' are not client-id characters at Alpaca
    order = await broker.place_order(unsafe, "SPY", Side.BUY, Decimal(1), fresh=True)
    sent = [o.client_order_id for o in emulator.placed(KEY)]
    assert sent == [venue_client_id(cid(), 128), venue_client_id(unsafe, 128)]
    assert sent[0] == cid()
    assert re.fullmatch(r"t[0-9a-f]{64}", sent[1])
    assert order.client_order_id == unsafe
    assert await broker.order_status(unsafe, "SPY") == order


@pytest.mark.parametrize(
    ("alpaca", "filled", "expected"),
    [
        ("filled", "1", BrokerOrderStatus.FILLED),
        ("partially_filled", "1", BrokerOrderStatus.PARTIALLY_FILLED),
        ("accepted", "0", BrokerOrderStatus.PENDING),
        ("held", "0", BrokerOrderStatus.PENDING),
        ("pending_cancel", "2", BrokerOrderStatus.PARTIALLY_FILLED),
        ("done_for_day", "2", BrokerOrderStatus.CANCELLED),
        ("replaced", "0", BrokerOrderStatus.CANCELLED),
        ("suspended", "0", BrokerOrderStatus.REJECTED),
        ("rejected", "0", BrokerOrderStatus.REJECTED),
    ],
)
def test_alpaca_statuses(alpaca: str, filled: str, expected: BrokerOrderStatus) -> None:
    assert broker_status(alpaca, Decimal(filled)) is expected
