"""Paper prices that move: the static source is today's catalogue, a paper order fills at its
source's price, and the ccxt ticker source reads the local Binance emulator (cached for its
TTL, static for what the venue lacks, the last known price when the venue is down); the
PAPER_PRICES setting chooses the source."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from tradecore.orders import Side
from tradecore.ports.broker import BrokerAccount, BrokerOrderStatus
from tradecore.ports.prices import PriceSource
from tradecore.testing.clock import FakeClock
from tradecore_adapters.brokers.catalogue import default_catalogue
from tradecore_adapters.brokers.paper import PaperBroker, PaperExchange
from tradecore_adapters.brokers.persistent import PersistentPaperBrokerFactory
from tradecore_adapters.brokers.prices import CcxtTickerPrices, StaticPrices
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_adapters.memory.documents import MemoryDocumentStore
from tradecore_entrypoints.adapter_sets import make_paper_prices
from tradecore_entrypoints.container import build_container
from tradecore_entrypoints.settings import ConfigError, Settings
from venues.base import Delay, Refuse
from venues.binance import BinanceVenue

D = Decimal
ACCOUNT = "acct-1"
TICKER = "/fapi/v1/ticker/24hr"
MARKETS = "/fapi/v1/exchangeInfo"
FAST = {"rateLimit": 1, "timeout_on_exit": 0}  # ccxt's pacing off: the emulator is local


class Ticks:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FixedPrices:
    """A source with set prices, counting what it is asked."""

    def __init__(self, prices: dict[str, Decimal]) -> None:
        self.prices = prices
        self.asked: list[str] = []

    async def price(self, symbol: str) -> Decimal | None:
        self.asked.append(symbol)
        return self.prices.get(symbol)


@pytest.fixture
async def venue() -> AsyncIterator[BinanceVenue]:
    venue = BinanceVenue()
    await venue.start()
    yield venue
    await venue.close()


@pytest.fixture
def ticks() -> Ticks:
    return Ticks()


@pytest.fixture
async def ticker(venue: BinanceVenue, ticks: Ticks) -> AsyncIterator[CcxtTickerPrices]:
    source = CcxtTickerPrices(endpoint=venue.origin, timeout_ms=2000, config=FAST, clock=ticks)
    yield source
    await source.close()


async def paper_broker(source: PriceSource | None, exchange: PaperExchange) -> PaperBroker:
    broker = PaperBroker(exchange, ACCOUNT, FakeClock(), prices=source)
    await broker.connect()
    return broker


async def buy(broker: Any, symbol: str, client_order_id: str = "o-1") -> Decimal | None:
    order = await broker.place_order(client_order_id, symbol, Side.BUY, D(1))
    assert order.status is BrokerOrderStatus.FILLED, order
    price: Decimal | None = order.average_price
    return price


# --- the static source and the paper exchange ----------------------------------------------


async def test_static_prices_are_the_catalogues_reference_prices() -> None:
    source = StaticPrices()

    assert isinstance(source, PriceSource)
    for symbol, instrument in default_catalogue().items():
        assert await source.price(symbol) == instrument.reference_price
    assert await source.price("DOGEUSDT") is None


async def test_a_paper_order_fills_at_the_sources_price() -> None:
    exchange = PaperExchange()
    source = FixedPrices({"BTCUSDT": D("61234.5")})
    broker = await paper_broker(source, exchange)

    assert await buy(broker, "BTCUSDT") == D("61234.5")
    assert exchange.price("BTCUSDT") == D("61234.5")  # margin and later fills use it too


async def test_the_static_source_fills_where_no_source_does() -> None:
    with_static = await paper_broker(StaticPrices(), PaperExchange())
    without = await paper_broker(None, PaperExchange())

    assert await buy(with_static, "BTCUSDT") == await buy(without, "BTCUSDT") == D(60000)


async def test_a_symbol_the_source_lacks_keeps_the_exchanges_last_price() -> None:
    exchange = PaperExchange()
    exchange.set_price("BTCUSDT", D(58000))
    broker = await paper_broker(FixedPrices({}), exchange)

    assert await buy(broker, "BTCUSDT") == D(58000)


async def test_an_order_placed_again_asks_no_price() -> None:
    source = FixedPrices({"BTCUSDT": D(61000)})
    broker = await paper_broker(source, PaperExchange())
    await buy(broker, "BTCUSDT")
    source.prices["BTCUSDT"] = D(1)

    assert await buy(broker, "BTCUSDT") == D(61000)  # the recorded order, unchanged
    assert source.asked == ["BTCUSDT"]


async def test_an_unknown_symbol_is_refused_without_asking_a_price() -> None:
    source = FixedPrices({"DOGEUSDT": D("0.1")})
    broker = await paper_broker(source, PaperExchange())

    order = await broker.place_order("o-1", "DOGEUSDT", Side.BUY, D(1))

    assert order.status is BrokerOrderStatus.REJECTED
    assert source.asked == []


@pytest.mark.parametrize("simulation", [False, True], ids=["live", "simulation"])
async def test_both_paper_factories_hand_their_source_to_every_connection(
    simulation: bool,
) -> None:
    source = FixedPrices({"BTCUSDT": D(62000)})
    account = BrokerAccount(ACCOUNT, "paper")
    factories = [
        PaperBrokerFactory(PaperExchange(), PaperExchange(), FakeClock(), prices=source),
        PersistentPaperBrokerFactory(
            PaperExchange(), PaperExchange(), MemoryDocumentStore(), FakeClock(), prices=source
        ),
    ]
    for factory in factories:
        broker = factory.open(account, simulation=simulation)
        await broker.connect()
        assert await buy(broker, "BTCUSDT") == D(62000)


# --- the ccxt ticker source against the local Binance emulator -----------------------------


async def test_the_ticker_source_gives_the_venues_price(
    venue: BinanceVenue, ticker: CcxtTickerPrices
) -> None:
    venue.set_price("BTCUSDT", D("64321.5"))
    venue.set_price("ETHUSDT", D("3456.78"))

    assert isinstance(ticker, PriceSource)
    both = await asyncio.gather(ticker.price("BTCUSDT"), ticker.price("ETHUSDT"))

    assert both == [D("64321.5"), D("3456.78")]
    assert venue.count("GET", MARKETS) == 1  # loaded once for both


async def test_a_paper_order_fills_at_the_venues_price(
    venue: BinanceVenue, ticker: CcxtTickerPrices
) -> None:
    venue.set_price("BTCUSDT", D("65000.1"))
    broker = await paper_broker(ticker, PaperExchange())

    assert await buy(broker, "BTCUSDT") == D("65000.1")


async def test_a_price_is_kept_for_the_ttl_then_read_again(
    venue: BinanceVenue, ticker: CcxtTickerPrices, ticks: Ticks
) -> None:
    venue.set_price("BTCUSDT", D(61000))
    assert await ticker.price("BTCUSDT") == D(61000)
    venue.set_price("BTCUSDT", D(62000))

    ticks.advance(1.9)
    assert await ticker.price("BTCUSDT") == D(61000)
    assert venue.count("GET", TICKER) == 1

    ticks.advance(0.2)
    assert await ticker.price("BTCUSDT") == D(62000)
    assert venue.count("GET", TICKER) == 2
    assert venue.count("GET", MARKETS) == 1  # the market list is loaded once


async def test_a_burst_of_orders_makes_one_ticker_request(
    venue: BinanceVenue, ticker: CcxtTickerPrices
) -> None:
    venue.set_price("BTCUSDT", D(63000))
    exchange = PaperExchange()
    brokers = [
        await paper_broker(ticker, exchange),
        await paper_broker(ticker, exchange),
    ]

    prices = await asyncio.gather(*(buy(brokers[i % 2], "BTCUSDT", f"o-{i}") for i in range(6)))

    assert prices == [D(63000)] * 6
    assert venue.count("GET", TICKER) == 1


async def test_symbols_the_venue_lacks_keep_their_static_price(
    venue: BinanceVenue, ticker: CcxtTickerPrices
) -> None:
    exchange = PaperExchange()
    exchange.set_market_open("ES", True)
    exchange.set_market_open("AAPL", True)
    broker = await paper_broker(ticker, exchange)

    assert await ticker.price("ES") is None
    assert await ticker.price("AAPL") is None
    assert await buy(broker, "ES", "o-es") == D(6000)
    assert await buy(broker, "AAPL", "o-aapl") == D(230)
    assert venue.requests == []  # nothing asked of the venue for them


async def test_a_down_venue_leaves_the_last_known_price_and_is_asked_again_after_the_ttl(
    venue: BinanceVenue,
    ticker: CcxtTickerPrices,
    ticks: Ticks,
    caplog: pytest.LogCaptureFixture,
) -> None:
    venue.set_price("BTCUSDT", D(61000))
    assert await ticker.price("BTCUSDT") == D(61000)
    venue.set_price("BTCUSDT", D(62000))
    venue.fault("GET", TICKER, Refuse(503, {"code": -1001, "msg": "Internal error."}), times=2)
    ticks.advance(3)

    with caplog.at_level(logging.WARNING):
        assert await ticker.price("BTCUSDT") == D(61000)
        assert await ticker.price("BTCUSDT") == D(61000)  # not asked again within the TTL
    assert venue.count("GET", TICKER) == 2
    assert "binanceusdm ticker of BTCUSDT unavailable" in caplog.text
    assert "keeping 61000" in caplog.text

    ticks.advance(3)
    assert await ticker.price("BTCUSDT") == D(61000)  # the second refusal
    ticks.advance(3)
    assert await ticker.price("BTCUSDT") == D(62000)  # back


async def test_a_venue_down_from_the_start_leaves_the_exchanges_price(
    venue: BinanceVenue, ticker: CcxtTickerPrices
) -> None:
    venue.fault("GET", MARKETS, Refuse(503, {"code": -1001, "msg": "Internal error."}))
    broker = await paper_broker(ticker, PaperExchange())

    assert await buy(broker, "BTCUSDT") == D(60000)  # the catalogue's


async def test_a_slow_venue_times_out_to_the_last_known_price(
    venue: BinanceVenue, ticks: Ticks
) -> None:
    source = CcxtTickerPrices(endpoint=venue.origin, timeout_ms=100, config=FAST, clock=ticks)
    assert await source.price("BTCUSDT") == D(50000)
    venue.fault("GET", TICKER, Delay(0.5))
    ticks.advance(3)

    assert await source.price("BTCUSDT") == D(50000)


def test_an_unknown_ccxt_venue_is_refused() -> None:
    with pytest.raises(ValueError, match="no ccxt venue 'kraken'"):
        CcxtTickerPrices("kraken")


# --- the setting ------------------------------------------------------------------------------


def test_paper_prices_are_static_by_default() -> None:
    settings = Settings.from_env({})

    assert settings.paper_prices == "static"
    assert settings.paper_price_venue is None
    assert isinstance(make_paper_prices(settings), StaticPrices)


@pytest.mark.parametrize(
    ("value", "venue"),
    [("ccxt:binanceusdm", "binanceusdm"), (" CCXT:Bybit ", "bybit"), ("ccxt:binance", "binance")],
)
def test_paper_prices_name_a_ccxt_venue(value: str, venue: str) -> None:
    settings = Settings.from_env({"PAPER_PRICES": value})

    assert settings.paper_prices == f"ccxt:{venue}"
    assert settings.paper_price_venue == venue


@pytest.mark.parametrize("value", ["ccxt", "ccxt:", "ccxt:kraken", "binanceusdm", "live"])
def test_a_bad_paper_prices_value_is_refused_with_the_choices(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"PAPER_PRICES": value})

    assert str(refused.value) == (
        "PAPER_PRICES must be static or one of ccxt:binanceusdm, ccxt:binance, ccxt:bybit, "
        f"got {value!r}"
    )


async def test_the_ticker_source_uses_the_venues_endpoint_and_serves_both_paper_factories(
    venue: BinanceVenue,
) -> None:
    settings = Settings.from_env(
        {
            "PAPER_PRICES": "ccxt:binanceusdm",
            "BROKER_ENDPOINTS": f"binanceusdm={venue.origin}",
            "BROKER_TIMEOUT_MS": "2000",
        }
    )
    venue.set_price("BTCUSDT", D(66000))
    adapters = build_container(settings).adapters
    source = adapters.paper_prices()

    assert isinstance(source, CcxtTickerPrices)
    assert adapters.paper_brokers()._prices is source
    assert adapters.api_paper_brokers()._prices is source
    assert await source.price("BTCUSDT") == D(66000)
    await source.close()
