"""The paper broker: fills, margin, reduce-only, market hours, scripted behaviour, persistence."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from tradecore.errors import BrokerDisconnected
from tradecore.orders import RejectionCode, Side
from tradecore.ports.broker import Broker, BrokerAccount, BrokerOrderStatus
from tradecore.testing.clock import FakeClock
from tradecore_adapters.brokers.catalogue import (
    CME_HOURS,
    CRYPTO_HOURS,
    FX_HOURS,
    US_EQUITY_HOURS,
    InstrumentKind,
    PositionMode,
    TradingHours,
    default_catalogue,
)
from tradecore_adapters.brokers.paper import PaperBroker, PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory, PaperInstrumentDirectory

ACCOUNT = "acct-1"
D = Decimal
CHICAGO = ZoneInfo("America/Chicago")
NEW_YORK = ZoneInfo("America/New_York")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def exchange() -> PaperExchange:
    return PaperExchange()


@pytest.fixture
async def broker(exchange: PaperExchange, clock: FakeClock) -> PaperBroker:
    broker = PaperBroker(exchange, ACCOUNT, clock)
    await broker.connect()
    return broker


async def test_is_a_broker_named_paper_listing_the_catalogue(broker: PaperBroker) -> None:
    assert isinstance(broker, Broker)
    assert broker.name == "paper"
    symbols = await broker.instruments()
    assert {"BTCUSDT", "ETHUSDT", "ES", "MES", "EURUSD", "AAPL"} <= symbols


def test_catalogue_kinds_and_position_modes() -> None:
    catalogue = default_catalogue()
    assert catalogue["BTCUSDT"].kind is InstrumentKind.CRYPTO_PERP
    assert catalogue["BTCUSDT"].position_mode is PositionMode.ONE_WAY
    assert catalogue["ETHUSDT"].position_mode is PositionMode.HEDGE
    assert catalogue["ES"].kind is InstrumentKind.FUTURE
    assert catalogue["MES"].hours == catalogue["ES"].hours == CME_HOURS
    assert catalogue["EURUSD"].kind is InstrumentKind.FX
    assert catalogue["AAPL"].kind is InstrumentKind.EQUITY


async def test_market_order_fills_at_the_reference_price(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    order = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(2))
    assert order.status is BrokerOrderStatus.FILLED
    assert order.filled_quantity == 2 and order.average_price == D(60000)
    assert order.broker_order_id
    exchange.set_price("BTCUSDT", D(61000))
    sold = await broker.place_order("c2", "BTCUSDT", Side.SELL, D(1))
    assert sold.average_price == D(61000)
    assert await broker.positions() == {"BTCUSDT": D(1)}
    assert exchange.balance(ACCOUNT) == D(101000)  # 1 closed at +1000


async def test_flat_symbols_are_omitted_from_positions(broker: PaperBroker) -> None:
    await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    await broker.place_order("c2", "BTCUSDT", Side.SELL, D(1))
    assert await broker.positions() == {}


async def test_same_client_order_id_returns_the_recorded_order(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    first = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    again = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    different = await broker.place_order("c1", "ES", Side.SELL, D(3))
    assert again == first and different == first
    assert exchange.position(ACCOUNT, "BTCUSDT") == 1
    assert len(exchange.orders(ACCOUNT)) == 1
    assert await broker.order_status("c1", "BTCUSDT") == first
    assert await broker.order_status("never-sent", "BTCUSDT") is None


async def test_client_order_ids_are_per_account(exchange: PaperExchange, clock: FakeClock) -> None:
    a, b = PaperBroker(exchange, "a", clock), PaperBroker(exchange, "b", clock)
    await a.connect()
    await b.connect()
    await a.place_order("same", "BTCUSDT", Side.BUY, D(1))
    await b.place_order("same", "BTCUSDT", Side.SELL, D(1))
    assert exchange.position("a", "BTCUSDT") == 1 and exchange.position("b", "BTCUSDT") == -1


async def test_order_crossing_zero_closes_then_opens_at_the_fill_price(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    exchange.set_position(ACCOUNT, "BTCUSDT", D(1), price=D(50000))
    order = await broker.place_order("c1", "BTCUSDT", Side.SELL, D(3))
    assert order.status is BrokerOrderStatus.FILLED
    assert exchange.position(ACCOUNT, "BTCUSDT") == -2
    assert exchange.balance(ACCOUNT) == D(110000)  # the long closed at +10000
    exchange.set_price("BTCUSDT", D(59000))
    await broker.place_order("c2", "BTCUSDT", Side.BUY, D(2))
    assert exchange.balance(ACCOUNT) == D(112000)  # the short entered at 60000 closed at 59000


# -- margin ---------------------------------------------------------------------------------


async def test_opening_needs_margin(exchange: PaperExchange, broker: PaperBroker) -> None:
    # ES: 50 x 6000 x 5% = 15000 per contract; 100000 covers 6 contracts.
    ok = await broker.place_order("c1", "ES", Side.BUY, D(6))
    refused = await broker.place_order("c2", "ES", Side.BUY, D(1))
    assert ok.status is BrokerOrderStatus.FILLED
    assert refused.status is BrokerOrderStatus.REJECTED
    assert refused.rejection is not None
    assert refused.rejection.code is RejectionCode.INSUFFICIENT_MARGIN
    assert "15000" in refused.rejection.message and "10000" in refused.rejection.message
    assert exchange.position(ACCOUNT, "ES") == 6
    assert exchange.available(ACCOUNT) == D(10000)


async def test_closing_part_frees_margin_for_the_opening_part(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    await broker.place_order("c1", "ES", Side.BUY, D(6))
    flipped = await broker.place_order("c2", "ES", Side.SELL, D(12))
    assert flipped.status is BrokerOrderStatus.FILLED
    assert exchange.position(ACCOUNT, "ES") == -6


async def test_reduce_only_needs_no_margin_and_is_capped_at_the_position(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    exchange.set_position(ACCOUNT, "ES", D(3))
    exchange.fund(ACCOUNT, D(0))
    order = await broker.place_order("c1", "ES", Side.SELL, D(5), reduce_only=True)
    assert order.status is BrokerOrderStatus.FILLED
    assert order.filled_quantity == 3 and order.quantity == 3
    assert exchange.position(ACCOUNT, "ES") == 0


@pytest.mark.parametrize("position", [D(0), D(2)])
async def test_reduce_only_with_nothing_against_it_is_cancelled(
    exchange: PaperExchange, broker: PaperBroker, position: Decimal
) -> None:
    exchange.set_position(ACCOUNT, "BTCUSDT", position)
    order = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1), reduce_only=True)
    assert order.status is BrokerOrderStatus.CANCELLED and order.filled_quantity == 0
    assert exchange.position(ACCOUNT, "BTCUSDT") == position


async def test_rest_that_no_longer_fits_the_margin_is_cancelled(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    exchange.delay_next_fill(1)
    pending = await broker.place_order("c1", "ES", Side.BUY, D(6))
    assert pending.status is BrokerOrderStatus.PENDING  # fits now: 90000 of 100000
    await broker.place_order("c2", "ES", Side.BUY, D(6))  # takes the margin first
    order = await broker.order_status("c1", "BTCUSDT")
    assert order is not None and order.status is BrokerOrderStatus.CANCELLED
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.INSUFFICIENT_MARGIN
    assert exchange.position(ACCOUNT, "ES") == 6
    assert exchange.available(ACCOUNT) == D(10000)


# -- rejections -----------------------------------------------------------------------------


async def test_unknown_symbol_is_rejected_and_recorded(broker: PaperBroker) -> None:
    order = await broker.place_order("c1", "NOPE", Side.BUY, D(1))
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.INVALID_SYMBOL
    assert "symbol not found in broker contracts" in order.rejection.message
    assert await broker.order_status("c1", "BTCUSDT") == order


async def test_hedge_mode_instrument_is_refused_with_the_fix(broker: PaperBroker) -> None:
    order = await broker.place_order("c1", "ETHUSDT", Side.SELL, D(1))
    assert order.rejection is not None
    assert order.rejection.code is RejectionCode.POSITION_MODE_MISMATCH
    assert "one-way mode" in order.rejection.message


async def test_market_closed_rejection_carries_the_hours(
    exchange: PaperExchange, broker: PaperBroker, clock: FakeClock
) -> None:
    clock.set(datetime(2026, 1, 10, 12, tzinfo=UTC))  # Saturday
    futures = await broker.place_order("c1", "MES", Side.BUY, D(1))
    crypto = await broker.place_order("c2", "BTCUSDT", Side.BUY, D(1))
    assert futures.rejection is not None
    assert futures.rejection.code is RejectionCode.MARKET_CLOSED
    assert CME_HOURS.text in futures.rejection.message
    assert crypto.status is BrokerOrderStatus.FILLED  # crypto trades 24/7


async def test_market_override_opens_and_closes_a_symbol(
    exchange: PaperExchange, broker: PaperBroker, clock: FakeClock
) -> None:
    exchange.set_market_open("BTCUSDT", False)
    closed = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    assert closed.rejection is not None
    assert closed.rejection.code is RejectionCode.MARKET_CLOSED
    clock.set(datetime(2026, 1, 10, 12, tzinfo=UTC))  # Saturday
    exchange.set_market_open("AAPL", True)
    assert (await broker.place_order("c2", "AAPL", Side.BUY, D(1))).filled_quantity == 1
    exchange.set_market_open("AAPL", None)
    refused = await broker.place_order("c3", "AAPL", Side.BUY, D(1))
    assert refused.status is BrokerOrderStatus.REJECTED


def local(zone: ZoneInfo, *args: int) -> datetime:
    return datetime(*args, tzinfo=zone)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("hours", "when", "is_open"),
    [
        # CME: Sunday 17:00 to Friday 16:00 Chicago, daily break 16:00-17:00.
        (CME_HOURS, local(CHICAGO, 2026, 1, 4, 16, 59), False),  # Sunday before the open
        (CME_HOURS, local(CHICAGO, 2026, 1, 4, 17, 0), True),
        (CME_HOURS, local(CHICAGO, 2026, 1, 5, 15, 59), True),  # Monday
        (CME_HOURS, local(CHICAGO, 2026, 1, 5, 16, 0), False),  # the daily break
        (CME_HOURS, local(CHICAGO, 2026, 1, 5, 16, 59), False),
        (CME_HOURS, local(CHICAGO, 2026, 1, 5, 17, 0), True),
        (CME_HOURS, local(CHICAGO, 2026, 1, 9, 15, 59), True),  # Friday
        (CME_HOURS, local(CHICAGO, 2026, 1, 9, 17, 30), False),  # no Friday evening session
        (CME_HOURS, local(CHICAGO, 2026, 1, 10, 12, 0), False),  # Saturday
        (CME_HOURS, local(CHICAGO, 2026, 7, 5, 17, 0), True),  # summer time follows Chicago
        (CME_HOURS, datetime(2026, 7, 5, 21, 30, tzinfo=UTC), False),  # 16:30 CDT Sunday
        # FX: Sunday 17:00 to Friday 17:00 New York.
        (FX_HOURS, local(NEW_YORK, 2026, 1, 4, 16, 59), False),
        (FX_HOURS, local(NEW_YORK, 2026, 1, 4, 17, 0), True),
        (FX_HOURS, local(NEW_YORK, 2026, 1, 7, 3, 0), True),  # Wednesday night: no break
        (FX_HOURS, local(NEW_YORK, 2026, 1, 9, 16, 59), True),
        (FX_HOURS, local(NEW_YORK, 2026, 1, 9, 17, 0), False),
        (FX_HOURS, local(NEW_YORK, 2026, 1, 10, 12, 0), False),
        # US equities: 09:30-16:00 New York, Monday to Friday.
        (US_EQUITY_HOURS, local(NEW_YORK, 2026, 1, 5, 9, 29), False),
        (US_EQUITY_HOURS, local(NEW_YORK, 2026, 1, 5, 9, 30), True),
        (US_EQUITY_HOURS, local(NEW_YORK, 2026, 1, 9, 15, 59), True),
        (US_EQUITY_HOURS, local(NEW_YORK, 2026, 1, 9, 16, 0), False),
        (US_EQUITY_HOURS, local(NEW_YORK, 2026, 1, 10, 10, 0), False),  # Saturday
        (CRYPTO_HOURS, local(NEW_YORK, 2026, 1, 10, 3, 0), True),
    ],
)
def test_trading_hours(hours: TradingHours, when: datetime, is_open: bool) -> None:
    assert hours.is_open(when) is is_open


def test_test_epoch_is_inside_every_markets_hours() -> None:
    epoch = FakeClock().now()
    for instrument in default_catalogue().values():
        assert instrument.hours.is_open(epoch), instrument.symbol


# -- scripted behaviour ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        RejectionCode.INSUFFICIENT_MARGIN,
        RejectionCode.MARKET_CLOSED,
        RejectionCode.INVALID_SYMBOL,
        RejectionCode.POSITION_MODE_MISMATCH,
    ],
)
async def test_scripted_rejection_is_recorded_under_its_client_order_id(
    exchange: PaperExchange, broker: PaperBroker, code: RejectionCode
) -> None:
    exchange.reject_next(code)
    refused = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    assert refused.rejection is not None and refused.rejection.code is code
    assert await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1)) == refused
    assert exchange.position(ACCOUNT, "BTCUSDT") == 0
    assert (await broker.place_order("c2", "BTCUSDT", Side.BUY, D(1))).filled_quantity == 1


async def test_rate_limited_request_is_not_recorded(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    exchange.reject_next(RejectionCode.BROKER_RATE_LIMITED, retry_after=3.0)
    refused = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    assert refused.rejection is not None
    assert refused.rejection.code is RejectionCode.BROKER_RATE_LIMITED
    assert refused.rejection.retry_after == 3.0
    assert await broker.order_status("c1", "BTCUSDT") is None
    retried = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    assert retried.status is BrokerOrderStatus.FILLED


async def test_scripted_rejection_is_not_spent_on_an_idempotent_repeat(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    placed = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    exchange.reject_next(RejectionCode.MARKET_CLOSED)
    assert await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1)) == placed
    refused = await broker.place_order("c2", "BTCUSDT", Side.BUY, D(1))
    assert refused.status is BrokerOrderStatus.REJECTED


async def test_delayed_fill_waits_for_status_polls(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    exchange.delay_next_fill(3)
    order = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    assert order.status is BrokerOrderStatus.PENDING
    statuses = [(await broker.order_status("c1", "BTCUSDT")) for _ in range(3)]
    assert [s.status if s else None for s in statuses] == [
        BrokerOrderStatus.PENDING,
        BrokerOrderStatus.PENDING,
        BrokerOrderStatus.FILLED,
    ]
    assert exchange.position(ACCOUNT, "BTCUSDT") == 1


async def test_order_that_never_fills_stays_pending(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    exchange.delay_next_fill(None)
    await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    for _ in range(20):
        status = await broker.order_status("c1", "BTCUSDT")
        assert status is not None and status.status is BrokerOrderStatus.PENDING
    assert exchange.position(ACCOUNT, "BTCUSDT") == 0


async def test_partial_fill_now_and_the_rest_later_or_never(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    exchange.partially_fill_next(D("0.25"), rest_after_polls=2)
    exchange.partially_fill_next(D("0.5"))
    later = await broker.place_order("c1", "BTCUSDT", Side.BUY, D(4))
    never = await broker.place_order("c2", "BTCUSDT", Side.BUY, D(2))
    assert later.status is BrokerOrderStatus.PARTIALLY_FILLED and later.filled_quantity == 1
    assert never.status is BrokerOrderStatus.PARTIALLY_FILLED and never.filled_quantity == 1
    assert exchange.position(ACCOUNT, "BTCUSDT") == 2
    await broker.order_status("c1", "BTCUSDT")
    done = await broker.order_status("c1", "BTCUSDT")
    assert done is not None and done.status is BrokerOrderStatus.FILLED
    assert done.filled_quantity == 4 and done.average_price == D(60000)
    for _ in range(5):
        still = await broker.order_status("c2", "BTCUSDT")
        assert still is not None and still.filled_quantity == 1
    assert exchange.position(ACCOUNT, "BTCUSDT") == 5


async def test_delayed_reduce_only_order_fills_at_most_what_is_still_held(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    exchange.set_position(ACCOUNT, "BTCUSDT", D(3))
    exchange.delay_next_fill(1)
    await broker.place_order("c1", "BTCUSDT", Side.SELL, D(3), reduce_only=True)
    exchange.set_position(ACCOUNT, "BTCUSDT", D(1))  # reduced elsewhere meanwhile
    order = await broker.order_status("c1", "BTCUSDT")
    assert order is not None and order.filled_quantity == 1
    assert order.status is BrokerOrderStatus.CANCELLED  # the rest had nothing to reduce
    assert exchange.position(ACCOUNT, "BTCUSDT") == 0


# -- connection -----------------------------------------------------------------------------


async def test_calls_need_a_connection(exchange: PaperExchange, clock: FakeClock) -> None:
    broker = PaperBroker(exchange, ACCOUNT, clock)
    with pytest.raises(BrokerDisconnected):
        await broker.positions()
    await broker.connect()
    await broker.connect()  # safe when already connected
    assert await broker.positions() == {}


async def test_disconnect_after_some_calls_until_reconnected(
    exchange: PaperExchange, broker: PaperBroker
) -> None:
    exchange.disconnect(ACCOUNT, after_calls=1)
    await broker.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    for _ in range(3):
        with pytest.raises(BrokerDisconnected):
            await broker.order_status("c1", "BTCUSDT")
    await broker.connect()
    assert await broker.order_status("c1", "BTCUSDT") is not None


async def test_reconnect_may_be_refused(exchange: PaperExchange, broker: PaperBroker) -> None:
    exchange.disconnect(ACCOUNT, refuse_reconnects=2)
    for _ in range(2):
        with pytest.raises(BrokerDisconnected):
            await broker.connect()
    await broker.connect()
    assert await broker.positions() == {}


async def test_disconnecting_everyone(exchange: PaperExchange, clock: FakeClock) -> None:
    a, b = PaperBroker(exchange, "a", clock), PaperBroker(exchange, "b", clock)
    await a.connect()
    await b.connect()
    exchange.disconnect()
    for broker in (a, b):
        with pytest.raises(BrokerDisconnected):
            await broker.positions()
    await a.connect()
    with pytest.raises(BrokerDisconnected):
        await b.positions()  # each connection must be re-opened on its own
    await b.connect()
    assert await b.positions() == {}


# -- persistence ----------------------------------------------------------------------------


async def test_snapshot_restores_books_orders_and_scripts_through_json(
    exchange: PaperExchange, broker: PaperBroker, clock: FakeClock
) -> None:
    await broker.place_order("c1", "ES", Side.SELL, D(2))
    exchange.delay_next_fill(2)
    await broker.place_order("c2", "BTCUSDT", Side.BUY, D(1))
    exchange.set_price("EURUSD", D("1.1"))
    exchange.set_market_open("AAPL", False)
    exchange.reject_next(RejectionCode.BROKER_RATE_LIMITED, retry_after=2.0)
    data = json.loads(json.dumps(exchange.snapshot()))

    revived = PaperExchange()
    revived.restore(data)
    assert revived.snapshot() == data
    again = PaperBroker(revived, ACCOUNT, clock)
    await again.connect()
    assert revived.positions(ACCOUNT) == {"ES": D(-2)}
    assert revived.price("EURUSD") == D("1.1")
    assert (await again.place_order("c1", "ES", Side.SELL, D(2))).broker_order_id == (
        exchange.orders(ACCOUNT)[0].broker_order_id
    )  # still idempotent
    await again.order_status("c2", "BTCUSDT")
    filled = await again.order_status("c2", "BTCUSDT")
    assert filled is not None and filled.status is BrokerOrderStatus.FILLED
    limited = await again.place_order("c3", "MES", Side.BUY, D(1))
    assert limited.rejection is not None and limited.rejection.retry_after == 2.0
    closed = await again.place_order("c4", "AAPL", Side.BUY, D(1))
    assert closed.rejection is not None
    assert closed.rejection.code is RejectionCode.MARKET_CLOSED
    fresh = await again.place_order("c5", "MES", Side.BUY, D(1))
    assert fresh.broker_order_id not in {o.broker_order_id for o in exchange.orders(ACCOUNT)}


def test_restore_refuses_a_malformed_snapshot(exchange: PaperExchange) -> None:
    data = exchange.snapshot()
    data["prices"]["BTCUSDT"] = 1.5  # floats would lose precision
    revived = PaperExchange()
    with pytest.raises(ValueError, match=r"Decimal @ \$.prices"):
        revived.restore(data)
    assert revived.price("BTCUSDT") == D(60000)  # left as it was


# -- registry -------------------------------------------------------------------------------


async def test_factory_keeps_simulation_on_its_own_exchange(clock: FakeClock) -> None:
    real, simulated = PaperExchange(), PaperExchange()
    factory = PaperBrokerFactory(real, simulated, clock)
    sim = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=True)
    await sim.connect()
    await sim.place_order("c1", "BTCUSDT", Side.BUY, D(1))
    assert simulated.position(ACCOUNT, "BTCUSDT") == 1
    assert real.position(ACCOUNT, "BTCUSDT") == 0
    live = factory.open(BrokerAccount(ACCOUNT, "paper"), simulation=False)
    assert live.exchange is real
    with pytest.raises(ValueError, match="unknown broker"):
        factory.open(BrokerAccount(ACCOUNT, "some-bank"), simulation=False)
    directory = PaperInstrumentDirectory(real)
    assert "BTCUSDT" in await directory.symbols("paper")
    assert await directory.symbols("some-bank") == frozenset()
