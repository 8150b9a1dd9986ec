"""The Bybit V5 emulator driven by the real ``ccxt.async_support.bybit`` (4.5.90): what ccxt
sends, what it makes of the answers, and which ccxt exception each refusal becomes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

import ccxt.async_support as ccxt
import pytest

from venues.base import Delay, LoseAnswer, Refuse
from venues.bybit import BybitVenue, ip_rate_limited, system_busy, too_many_visits

KEY, SECRET = "bybit-key-1", "bybit-secret-1"
BTC = "BTC/USDT:USDT"
ETH = "ETH/USDT:USDT"
#: what tradecore sets: only linear markets, and the account type known up front (no
#: /v5/user/query-api + /v5/account/info round trip before the first order or balance).
OPTIONS = {
    "fetchMarkets": {"types": ["linear"]},
    "enableUnifiedAccount": True,
    "enableUnifiedMargin": False,
}

MakeExchange = Callable[..., Awaitable[ccxt.bybit]]


@pytest.fixture
async def venue() -> AsyncIterator[BybitVenue]:
    venue = BybitVenue()
    venue.add_account(KEY, SECRET)
    venue.set_price("BTCUSDT", Decimal(60000))
    venue.set_price("ETHUSDT", Decimal(3000))
    await venue.start()
    yield venue
    await venue.close()


@pytest.fixture
async def make_exchange(venue: BybitVenue) -> AsyncIterator[MakeExchange]:
    created: list[ccxt.bybit] = []

    async def make(
        *, key: str = KEY, secret: str = SECRET, options: dict[str, Any] | None = None
    ) -> ccxt.bybit:
        exchange = ccxt.bybit(
            {
                "apiKey": key,
                "secret": secret,
                "enableRateLimit": True,
                "rateLimit": 1,  # ms per cost unit (Bybit's 20 would pace each test to seconds)
                "options": OPTIONS if options is None else options,
            }
        )
        exchange.timeout_on_exit = 0  # ms; close() waits 250 ms for TLS shutdowns by default
        exchange.urls["api"] = {name: venue.origin for name in exchange.urls["api"]}
        created.append(exchange)
        return exchange

    yield make
    for exchange in created:
        await exchange.close()


@pytest.fixture
async def exchange(make_exchange: MakeExchange) -> ccxt.bybit:
    exchange = await make_exchange()
    await exchange.load_markets()
    return exchange


# ----------------------------------------------------------------- markets


async def test_load_markets_asks_only_for_linear_instruments(
    venue: BybitVenue, make_exchange: MakeExchange
) -> None:
    exchange = await make_exchange()

    markets = await exchange.load_markets()

    assert sorted(markets) == [BTC, ETH]
    btc = markets[BTC]
    assert (btc["id"], btc["type"], btc["linear"], btc["settle"]) == (
        "BTCUSDT",
        "swap",
        True,
        "USDT",
    )
    assert btc["precision"] == {"amount": 0.001, "price": 0.1}
    assert btc["limits"]["amount"] == {"min": 0.001, "max": 1190.0}
    assert btc["limits"]["leverage"]["max"] == 100.0
    # the coin list (fetchCurrencies) and two instruments-info calls: Trading and PreLaunch
    assert venue.requests == [
        ("GET", "/v5/asset/coin/query-info"),
        ("GET", "/v5/market/instruments-info"),
        ("GET", "/v5/market/instruments-info"),
    ]


async def test_without_fetch_currencies_load_markets_skips_the_coin_list(
    venue: BybitVenue, make_exchange: MakeExchange
) -> None:
    exchange = await make_exchange()
    exchange.has["fetchCurrencies"] = False

    await exchange.load_markets()

    assert venue.count("GET", "/v5/asset/coin/query-info") == 0
    assert venue.count("GET", "/v5/market/instruments-info") == 2


async def test_sandbox_mode_replaces_the_override_with_the_testnet_host(
    venue: BybitVenue, make_exchange: MakeExchange
) -> None:
    exchange = await make_exchange()

    exchange.set_sandbox_mode(True)

    # so set_sandbox_mode(True) must come before pointing the URLs at the emulator
    assert set(exchange.urls["api"].values()) == {"https://api-testnet.{hostname}"}
    assert exchange.hostname == "bybit.com"


async def test_default_options_load_every_category_and_ask_the_account_type(
    venue: BybitVenue, make_exchange: MakeExchange
) -> None:
    exchange = await make_exchange(options={})

    await exchange.load_markets()
    balance = await exchange.fetch_balance()

    assert sorted(exchange.markets) == [BTC, ETH]
    assert balance["USDT"]["total"] == 100_000
    paths = [path for _, path in venue.requests]
    assert paths.count("/v5/market/instruments-info") == 11  # spot, 2 linear, 2 inverse, 6 option
    assert {"/v5/user/query-api", "/v5/account/info"} <= set(paths)


async def test_instruments_info_paginates_with_a_cursor(exchange: ccxt.bybit) -> None:
    first = await exchange.public_get_v5_market_instruments_info({"category": "linear", "limit": 1})
    second = await exchange.public_get_v5_market_instruments_info(
        {"category": "linear", "limit": 1, "cursor": first["result"]["nextPageCursor"]}
    )

    assert [row["symbol"] for row in first["result"]["list"]] == ["BTCUSDT"]
    assert first["result"]["nextPageCursor"] != ""
    assert [row["symbol"] for row in second["result"]["list"]] == ["ETHUSDT"]
    assert second["result"]["nextPageCursor"] == ""
    lots = first["result"]["list"][0]["lotSizeFilter"]
    assert (lots["minOrderQty"], lots["qtyStep"]) == ("0.001", "0.001")


async def test_time_and_ticker(venue: BybitVenue, exchange: ccxt.bybit) -> None:
    venue.set_price("BTCUSDT", Decimal("61234.5"))

    server_time = await exchange.fetch_time()
    ticker = await exchange.fetch_ticker(BTC)

    assert abs(server_time - time.time() * 1000) < 5000
    assert ticker["last"] == 61234.5


# ----------------------------------------------------------------- account


async def test_fetch_balance_reads_the_unified_wallet(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    balance = await exchange.fetch_balance()

    assert balance["USDT"] == {"free": 100_000, "used": 0, "total": 100_000, "debt": 0}
    assert ("GET", "/v5/account/wallet-balance") in venue.requests


async def test_wrong_secret_raises_authentication_error(
    venue: BybitVenue, make_exchange: MakeExchange
) -> None:
    exchange = await make_exchange(secret="not-the-secret")

    with pytest.raises(ccxt.AuthenticationError, match="10004"):
        await exchange.fetch_balance()


async def test_unknown_key_raises_authentication_error(make_exchange: MakeExchange) -> None:
    exchange = await make_exchange(key="nobody")

    with pytest.raises(ccxt.AuthenticationError, match="10003"):
        await exchange.fetch_balance()


async def test_a_timestamp_outside_the_recv_window_raises_invalid_nonce(
    make_exchange: MakeExchange,
) -> None:
    exchange = await make_exchange()
    await exchange.load_markets()
    exchange.options["timeDifference"] = 6000  # the client clock runs 6 s behind

    with pytest.raises(ccxt.InvalidNonce, match="10002"):
        await exchange.fetch_balance()


# ----------------------------------------------------------------- orders


async def test_market_order_with_client_id_fills_at_the_set_price(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    created = await exchange.create_order(
        BTC, "market", "buy", 0.01, None, {"clientOrderId": "c-1"}
    )

    by_id = await exchange.fetch_open_order(created["id"], BTC)
    closed = await exchange.fetch_closed_order(created["id"], BTC)
    acknowledged = await exchange.fetch_order(created["id"], BTC, {"acknowledged": True})
    by_client_id = await exchange.fetch_open_orders(BTC, None, None, {"orderLinkId": "c-1"})
    history = await exchange.fetch_closed_orders(BTC, None, None, {"orderLinkId": "c-1"})

    assert (created["id"], created["clientOrderId"]) == (by_id["id"], "c-1")
    for order in (by_id, closed, acknowledged, by_client_id[0], history[0]):
        assert (order["clientOrderId"], order["status"]) == ("c-1", "closed")
        assert (order["filled"], order["remaining"], order["average"]) == (0.01, 0, 60000)
    assert len(by_client_id) == len(history) == 1
    assert venue.position(KEY, "BTCUSDT") == Decimal("0.01")


async def test_an_order_cannot_be_fetched_by_client_id_alone_through_the_id_argument(
    exchange: ccxt.bybit,
) -> None:
    await exchange.create_order(BTC, "market", "buy", 0.01, None, {"clientOrderId": "c-2"})

    # ccxt always sends orderId=<id>, and Bybit looks up orderId before orderLinkId
    with pytest.raises(ccxt.OrderNotFound):
        await exchange.fetch_open_order(None, BTC, {"orderLinkId": "c-2"})


async def test_a_duplicate_client_id_is_refused(venue: BybitVenue, exchange: ccxt.bybit) -> None:
    await exchange.create_order(BTC, "market", "buy", 0.01, None, {"clientOrderId": "dup"})

    with pytest.raises(ccxt.InvalidOrder, match="110072"):
        await exchange.create_order(BTC, "market", "buy", 0.01, None, {"clientOrderId": "dup"})

    assert [order.client_order_id for order in venue.placed(KEY)] == ["dup"]


async def test_insufficient_balance_raises_insufficient_funds(
    venue: BybitVenue, make_exchange: MakeExchange
) -> None:
    venue.add_account("poor", "poor-secret", cash=Decimal(100))
    exchange = await make_exchange(key="poor", secret="poor-secret")

    with pytest.raises(ccxt.InsufficientFunds, match="110007"):
        await exchange.create_order(BTC, "market", "buy", 0.1)  # margin 600 USDT > 100

    assert venue.placed("poor") == []


async def test_a_partial_fill_stays_open_until_fill_resting(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    venue.fill_next_partially(Decimal("0.5"))
    created = await exchange.create_order(BTC, "market", "buy", 0.01, None, {"clientOrderId": "p"})

    partial = await exchange.fetch_open_order(created["id"], BTC)
    venue.fill_resting()
    full = await exchange.fetch_open_order(created["id"], BTC)

    assert (partial["status"], partial["filled"], partial["remaining"]) == ("open", 0.005, 0.005)
    assert (full["status"], full["filled"]) == ("closed", 0.01)
    assert venue.placed(KEY)[0].status == "Filled"
    assert venue.position(KEY, "BTCUSDT") == Decimal("0.01")


async def test_fetch_positions_shows_the_signed_position(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    await exchange.create_order(BTC, "market", "sell", 0.02)
    venue.set_position(KEY, "ETHUSDT", Decimal("1.5"))

    (btc,) = await exchange.fetch_positions([BTC])
    everything = await exchange.fetch_positions()

    assert (btc["side"], btc["contracts"], btc["entryPrice"]) == ("short", 0.02, 60000)
    assert {(p["symbol"], p["side"], p["contracts"]) for p in everything} == {
        (BTC, "short", 0.02),
        (ETH, "long", 1.5),
    }
    assert venue.position(KEY, "BTCUSDT") == Decimal("-0.02")


async def test_reduce_only_needs_a_position_and_is_cut_to_it(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    with pytest.raises(ccxt.InvalidOrder, match="110017"):
        await exchange.create_order(BTC, "market", "sell", 0.01, None, {"reduceOnly": True})

    venue.set_position(KEY, "BTCUSDT", Decimal("0.01"))
    await exchange.create_order(BTC, "market", "sell", 0.05, None, {"reduceOnly": True})

    (order,) = venue.placed(KEY)
    assert (order.quantity, order.filled, order.reduce_only) == (Decimal("0.01"),) * 2 + (True,)
    assert venue.position(KEY, "BTCUSDT") == 0


async def test_closing_realises_pnl_into_the_wallet(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    await exchange.create_order(BTC, "market", "buy", 0.1)
    venue.set_price("BTCUSDT", Decimal(61000))
    await exchange.create_order(BTC, "market", "sell", 0.1, None, {"reduceOnly": True})

    balance = await exchange.fetch_balance()

    assert balance["USDT"]["total"] == 100_100


async def test_hedge_mode_needs_the_position_idx(venue: BybitVenue, exchange: ccxt.bybit) -> None:
    venue.set_position(KEY, "ETHUSDT", Decimal(-1))
    venue.set_hedge_mode(KEY, True)

    with pytest.raises(ccxt.BadRequest, match="position idx not match position mode"):
        await exchange.create_order(BTC, "market", "buy", 0.01)  # ccxt sends no positionIdx

    await exchange.create_order(BTC, "market", "buy", 0.01, None, {"hedged": True})
    await exchange.create_order(BTC, "market", "sell", 0.01, None, {"hedged": True})
    positions = await exchange.fetch_positions([BTC])

    assert {(p["side"], p["contracts"], p["hedged"]) for p in positions} == {
        ("long", 0.01, True),
        ("short", 0.01, True),
    }
    assert venue.position(KEY, "BTCUSDT") == 0
    eth = [p for p in await exchange.fetch_positions([ETH]) if p["contracts"]]
    assert [(p["side"], p["contracts"], p["hedged"]) for p in eth] == [("short", 1, True)]


async def test_one_way_mode_refuses_a_hedge_position_idx(exchange: ccxt.bybit) -> None:
    with pytest.raises(ccxt.BadRequest, match="position idx not match position mode"):
        await exchange.create_order(BTC, "market", "buy", 0.01, None, {"hedged": True})


async def test_set_position_mode_switches_once(venue: BybitVenue, exchange: ccxt.bybit) -> None:
    await exchange.set_position_mode(True)

    with pytest.raises(ccxt.NoChange, match="110025"):
        await exchange.set_position_mode(True)
    await exchange.create_order(BTC, "market", "buy", 0.01, None, {"hedged": True})
    with pytest.raises(ccxt.ExchangeError, match="110024"):
        await exchange.set_position_mode(False)


@pytest.mark.parametrize(
    ("qty", "symbol", "error", "code"),
    [
        ("0.0005", "BTCUSDT", ccxt.BadRequest, "minimum limit allowed"),
        ("0.0015", "BTCUSDT", ccxt.BadRequest, "Qty invalid"),
        ("600", "BTCUSDT", ccxt.BadRequest, "maximum limit allowed"),
        ("0.01", "DOGEUSDT", ccxt.BadRequest, "symbol is invalid"),
    ],
)
async def test_order_parameters_are_checked(
    venue: BybitVenue,
    exchange: ccxt.bybit,
    qty: str,
    symbol: str,
    error: type[Exception],
    code: str,
) -> None:
    request = {"category": "linear", "symbol": symbol, "side": "Buy", "orderType": "Market"}

    with pytest.raises(error, match=code):
        await exchange.private_post_v5_order_create({**request, "qty": qty})

    assert venue.placed(KEY) == []


async def test_a_notional_below_the_minimum_is_refused(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    venue.set_price("BTCUSDT", Decimal(1000))

    with pytest.raises(ccxt.InvalidOrder, match="110094"):
        await exchange.create_order(BTC, "market", "buy", 0.001)  # 1 USDT < 5 USDT


async def test_a_resting_limit_order_can_be_cancelled_by_client_id(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    await exchange.create_order(BTC, "limit", "buy", 0.01, 50000, {"clientOrderId": "lim"})

    (resting,) = await exchange.fetch_open_orders(BTC)
    await exchange.cancel_order(None, BTC, {"orderLinkId": "lim"})
    (cancelled,) = await exchange.fetch_open_orders(BTC, None, None, {"orderLinkId": "lim"})

    assert (resting["status"], resting["price"], resting["filled"]) == ("open", 50000, 0)
    assert cancelled["status"] == "canceled"
    assert await exchange.fetch_open_orders(BTC) == []
    with pytest.raises(ccxt.OrderNotFound, match="110001"):
        await exchange.cancel_order(None, BTC, {"orderLinkId": "lim"})


async def test_a_limit_order_fills_when_the_price_reaches_it(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    created = await exchange.create_order(BTC, "limit", "sell", 0.01, 62000)
    venue.set_price("BTCUSDT", Decimal(62500))

    order = await exchange.fetch_open_order(created["id"], BTC)

    assert (order["status"], order["average"]) == ("closed", 62500)
    assert venue.position(KEY, "BTCUSDT") == Decimal("-0.01")


async def test_a_rejected_order_is_acknowledged_then_rejected(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    venue.reject_next()
    created = await exchange.create_order(BTC, "market", "buy", 0.01)

    order = await exchange.fetch_open_order(created["id"], BTC)

    assert (order["status"], order["filled"]) == ("rejected", 0)
    assert venue.position(KEY, "BTCUSDT") == 0


# ----------------------------------------------------------------- faults


@pytest.mark.parametrize(
    "refusal",
    [too_many_visits(), system_busy(), ip_rate_limited()],
    ids=["retCode-10006", "http-429", "http-403-ip-ban"],
)
async def test_rate_limit_answers_raise_rate_limit_exceeded(
    venue: BybitVenue, exchange: ccxt.bybit, refusal: Refuse
) -> None:
    venue.fault("POST", "/v5/order/create", refusal)

    with pytest.raises(ccxt.RateLimitExceeded):
        await exchange.create_order(BTC, "market", "buy", 0.01)

    assert venue.placed(KEY) == []


async def test_a_slow_answer_raises_request_timeout(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    exchange.timeout = 100  # ms
    venue.fault("GET", "/v5/account/wallet-balance", Delay(0.4))

    with pytest.raises(ccxt.RequestTimeout):
        await exchange.fetch_balance()


async def test_a_lost_answer_raises_a_network_error_after_the_order_was_placed(
    venue: BybitVenue, exchange: ccxt.bybit
) -> None:
    venue.fault("POST", "/v5/order/create", LoseAnswer())

    with pytest.raises(ccxt.NetworkError) as raised:
        await exchange.create_order(BTC, "market", "buy", 0.01, None, {"clientOrderId": "lost"})

    assert type(raised.value) is ccxt.ExchangeNotAvailable
    assert [order.client_order_id for order in venue.placed(KEY)] == ["lost"]
    (found,) = await exchange.fetch_open_orders(BTC, None, None, {"orderLinkId": "lost"})
    assert found["status"] == "closed"
