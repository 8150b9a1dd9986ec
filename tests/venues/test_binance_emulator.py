"""The Binance emulator driven by the real ccxt.async_support ``binance`` (spot) and
``binanceusdm`` (USDⓈ-M futures) exchanges: what ccxt sends must be accepted, what the
emulator answers must reach the caller as ccxt's documented exceptions."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import aiohttp
import ccxt
import ccxt.async_support as ccxt_async
import pytest

from venues.base import Delay, LoseAnswer, Refuse
from venues.binance import BinanceVenue, point_ccxt_at

KEY, SECRET = "test-key-0001", "test-secret-0001"
FUTURES, SPOT = "BTC/USDT:USDT", "BTC/USDT"
ORDER_PATHS = r"/(api/v3|fapi/v1)/order"

# what ccxt needs to load markets without sapi calls: no currencies (both) and no margin pairs
# (spot), and for spot only its exchangeInfo (``binance`` loads spot, linear and inverse)
USDM_OPTIONS: dict[str, Any] = {"fetchCurrencies": False}
SPOT_OPTIONS: dict[str, Any] = {
    "fetchCurrencies": False,
    "fetchMargins": False,
    "fetchMarkets": {"types": ["spot"]},
}


@pytest.fixture
async def venue() -> AsyncIterator[BinanceVenue]:
    venue = BinanceVenue()
    venue.add_account(KEY, SECRET)
    await venue.start()
    yield venue
    await venue.close()


@asynccontextmanager
async def connect(
    venue: BinanceVenue,
    kind: str = "usdm",
    *,
    secret: str = SECRET,
    api_key: str = KEY,
    merge_errors: bool = True,
    **config: Any,
) -> AsyncIterator[Any]:
    cls = ccxt_async.binanceusdm if kind == "usdm" else ccxt_async.binance
    options = dict(USDM_OPTIONS if kind == "usdm" else SPOT_OPTIONS) | config.pop("options", {})
    settings = {"apiKey": api_key, "secret": secret, "enableRateLimit": True, "options": options}
    # ccxt's throttle (50 ms per weight unit) and its 250 ms pause in close() are kept short
    exchange = cls(settings | {"rateLimit": 5, "timeout_on_exit": 0} | config)
    if merge_errors:
        point_ccxt_at(exchange, venue.origin)
    else:
        exchange.urls["api"] = {
            name: venue.origin + urllib.parse.urlsplit(url).path
            for name, url in exchange.urls["api"].items()
            if isinstance(url, str)
        }
    try:
        yield exchange
    finally:
        await exchange.close()


# ----------------------------------------------------------------------- markets


async def test_load_markets_usdm_gives_the_linear_perpetual(venue: BinanceVenue) -> None:
    async with connect(venue) as ex:
        markets = await ex.load_markets()
    btc = markets[FUTURES]
    assert (btc["id"], btc["type"], btc["linear"], btc["settle"]) == (
        "BTCUSDT",
        "swap",
        True,
        "USDT",
    )
    assert btc["limits"]["amount"]["min"] == 0.001
    assert "ETH/USDT:USDT" in markets
    assert {path for _, path in venue.requests} == {"/fapi/v1/exchangeInfo"}


async def test_load_markets_spot_gives_the_spot_pair(venue: BinanceVenue) -> None:
    async with connect(venue, "spot") as ex:
        markets = await ex.load_markets()
    assert markets[SPOT]["spot"] is True
    assert markets[SPOT]["limits"]["cost"]["min"] == 5
    assert "ETH/USDT" in markets
    assert {path for _, path in venue.requests} == {"/api/v3/exchangeInfo"}


async def test_fetch_ticker_answers_the_set_price_on_both_markets(venue: BinanceVenue) -> None:
    venue.set_price("BTCUSDT", Decimal("61234.5"))
    async with connect(venue) as usdm, connect(venue, "spot") as spot:
        assert (await usdm.fetch_ticker(FUTURES))["last"] == 61234.5
        assert (await spot.fetch_ticker(SPOT))["last"] == 61234.5


# ---------------------------------------------------------------------- balances


async def test_fetch_balance_shows_both_wallets(venue: BinanceVenue) -> None:
    venue.set_position(KEY, "BTCUSDT", Decimal("0.5"), market="spot")
    async with connect(venue) as usdm, connect(venue, "spot") as spot:
        futures_balance = await usdm.fetch_balance()
        spot_balance = await spot.fetch_balance()
    assert futures_balance["USDT"]["total"] == 100_000
    assert futures_balance["USDT"]["free"] == 100_000
    assert spot_balance["USDT"]["free"] == 100_000
    assert spot_balance["BTC"]["free"] == 0.5
    assert ("GET", "/fapi/v3/account") in venue.requests


async def test_v2_endpoints_answer_like_v3(venue: BinanceVenue) -> None:
    venue.set_position(KEY, "BTCUSDT", Decimal("0.1"))
    async with connect(venue) as ex:
        balance = await ex.fetch_balance({"useV2": True})
        [position] = await ex.fetch_positions([FUTURES], {"useV2": True})
        prices = await ex.fetch_last_prices([FUTURES])
    assert balance["USDT"]["total"] == 100_000
    assert balance["USDT"]["used"] == 500
    assert (position["contracts"], position["leverage"]) == (0.1, 10)
    assert prices[FUTURES]["price"] == 50_000
    assert {("GET", "/fapi/v2/account"), ("GET", "/fapi/v2/positionRisk")} <= set(venue.requests)


# ------------------------------------------------------------------------ orders


async def test_usdm_market_order_fills_at_the_set_price_and_is_found_by_client_id(
    venue: BinanceVenue,
) -> None:
    venue.set_price("BTCUSDT", Decimal(40_000))
    async with connect(venue) as ex:
        order = await ex.create_order(
            FUTURES, "market", "buy", 0.01, None, {"clientOrderId": "c-1"}
        )
        fetched = await ex.fetch_order(None, FUTURES, {"clientOrderId": "c-1"})
        balance = await ex.fetch_balance()
    assert (order["status"], order["filled"], order["average"]) == ("closed", 0.01, 40_000)
    assert (fetched["clientOrderId"], fetched["status"], fetched["cost"]) == ("c-1", "closed", 400)
    assert fetched["id"] == order["id"]
    assert balance["USDT"]["used"] == 40  # initial margin at leverage 10
    assert venue.position(KEY, "BTCUSDT") == Decimal("0.01")
    [placed] = venue.placed(KEY)
    assert (placed.client_order_id, placed.side, placed.status) == ("c-1", "buy", "FILLED")


async def test_spot_market_order_moves_both_balances(venue: BinanceVenue) -> None:
    venue.set_price("BTCUSDT", Decimal(40_000))
    async with connect(venue, "spot") as ex:
        order = await ex.create_order(SPOT, "market", "buy", 0.25, None, {"clientOrderId": "s-1"})
        fetched = await ex.fetch_order(None, SPOT, {"clientOrderId": "s-1"})
        balance = await ex.fetch_balance()
    assert (order["status"], order["filled"], order["average"]) == ("closed", 0.25, 40_000)
    assert (fetched["status"], fetched["cost"]) == ("closed", 10_000)
    assert (balance["USDT"]["free"], balance["BTC"]["free"]) == (90_000, 0.25)
    assert venue.position(KEY, "BTCUSDT", market="spot") == Decimal("0.25")
    assert venue.placed(KEY, market="usdm") == []


async def test_reduce_only_closes_and_is_rejected_without_a_position(venue: BinanceVenue) -> None:
    venue.set_position(KEY, "BTCUSDT", Decimal("0.02"))
    async with connect(venue) as ex:
        closed = await ex.create_order(FUTURES, "market", "sell", 0.02, None, {"reduceOnly": True})
        with pytest.raises(ccxt.InvalidOrder, match="-2022"):
            await ex.create_order(FUTURES, "market", "sell", 0.02, None, {"reduceOnly": True})
    assert (closed["status"], closed["reduceOnly"]) == ("closed", True)
    assert venue.position(KEY, "BTCUSDT") == 0
    assert [o.reduce_only for o in venue.placed(KEY)] == [True]


async def test_partial_fill_is_open_until_the_rest_is_filled(venue: BinanceVenue) -> None:
    async with connect(venue) as ex:
        venue.fill_next_partially(Decimal("0.4"))
        order = await ex.create_order(
            FUTURES, "market", "buy", 0.01, None, {"clientOrderId": "p-1"}
        )
        assert venue.position(KEY, "BTCUSDT") == Decimal("0.004")
        venue.fill_resting()
        fetched = await ex.fetch_order(order["id"], FUTURES)
    assert (order["status"], order["filled"], order["remaining"]) == ("open", 0.004, 0.006)
    assert (fetched["status"], fetched["filled"]) == ("closed", 0.01)
    assert venue.position(KEY, "BTCUSDT") == Decimal("0.01")
    assert venue.placed(KEY)[0].filled == Decimal("0.01")


async def test_spot_partial_fill_locks_the_rest(venue: BinanceVenue) -> None:
    venue.set_price("BTCUSDT", Decimal(10_000))
    async with connect(venue, "spot") as ex:
        venue.fill_next_partially(Decimal("0.5"))
        order = await ex.create_order(SPOT, "market", "buy", 1, None, {"clientOrderId": "sp-1"})
        during = await ex.fetch_balance()
        venue.fill_resting()
        done = await ex.fetch_order(None, SPOT, {"clientOrderId": "sp-1"})
        after = await ex.fetch_balance()
    assert (order["status"], order["filled"]) == ("open", 0.5)
    assert (during["USDT"]["free"], during["USDT"]["used"], during["BTC"]["free"]) == (
        90_000,
        5_000,
        0.5,
    )
    assert done["status"] == "closed"
    assert (after["USDT"]["free"], after["USDT"]["used"], after["BTC"]["free"]) == (90_000, 0, 1)


async def test_duplicate_client_id_of_an_open_order_is_rejected(venue: BinanceVenue) -> None:
    async with connect(venue) as ex, connect(venue, "spot") as spot:
        venue.fill_next_partially(Decimal("0.5"))
        await ex.create_order(FUTURES, "market", "buy", 0.01, None, {"clientOrderId": "dup"})
        with pytest.raises(ccxt.InvalidOrder, match="-4116"):
            await ex.create_order(FUTURES, "market", "buy", 0.01, None, {"clientOrderId": "dup"})
        venue.fill_next_partially(Decimal("0.5"))
        await spot.create_order(SPOT, "market", "buy", 0.01, None, {"clientOrderId": "dup"})
        with pytest.raises(ccxt.InvalidOrder, match="Duplicate order sent"):
            await spot.create_order(SPOT, "market", "buy", 0.01, None, {"clientOrderId": "dup"})
    assert [o.client_order_id for o in venue.placed(KEY, market="usdm")] == ["dup"]
    assert [o.client_order_id for o in venue.placed(KEY, market="spot")] == ["dup"]
    assert len(venue.placed(KEY)) == 2


async def test_client_id_of_a_filled_order_can_be_reused_as_binance_documents(
    venue: BinanceVenue,
) -> None:
    """ "A unique id among open orders": a resent order whose first copy filled is a second
    order, so ccxt's clientOrderId is no idempotency key on Binance."""
    async with connect(venue) as ex:
        first = await ex.create_order(FUTURES, "market", "buy", 0.01, None, {"clientOrderId": "r"})
        second = await ex.create_order(FUTURES, "market", "buy", 0.01, None, {"clientOrderId": "r"})
        fetched = await ex.fetch_order(None, FUTURES, {"clientOrderId": "r"})
    assert first["id"] != second["id"]
    assert fetched["id"] == second["id"]  # the latest order with that id
    assert len(venue.placed(KEY)) == 2


async def test_unknown_order_raises_order_not_found(venue: BinanceVenue) -> None:
    async with connect(venue) as ex, connect(venue, "spot") as spot:
        with pytest.raises(ccxt.OrderNotFound):
            await ex.fetch_order(None, FUTURES, {"clientOrderId": "nope"})
        with pytest.raises(ccxt.OrderNotFound):
            await spot.fetch_order("123", SPOT)


async def test_cancel_of_a_partially_filled_order(venue: BinanceVenue) -> None:
    async with connect(venue) as ex:
        venue.fill_next_partially(Decimal("0.5"))
        order = await ex.create_order(FUTURES, "market", "buy", 0.01)
        canceled = await ex.cancel_order(order["id"], FUTURES)
        with pytest.raises(ccxt.OrderNotFound):
            await ex.cancel_order(order["id"], FUTURES)
    assert (canceled["status"], canceled["filled"]) == ("canceled", 0.005)
    assert venue.placed(KEY)[0].status == "CANCELED"


# ---------------------------------------------------------------- rejected orders


async def test_insufficient_margin_and_balance_raise_insufficient_funds(
    venue: BinanceVenue,
) -> None:
    async with connect(venue) as ex, connect(venue, "spot") as spot:
        with pytest.raises(ccxt.InsufficientFunds, match="-2019"):
            await ex.create_order(FUTURES, "market", "buy", 21)  # 1.05M notional / 10 > 100k
        with pytest.raises(ccxt.InsufficientFunds, match="insufficient balance"):
            await spot.create_order(SPOT, "market", "buy", 3)  # 150k > 100k
    assert venue.placed(KEY) == []


async def test_without_the_error_table_merge_ccxt_loses_binances_futures_codes(
    venue: BinanceVenue,
) -> None:
    """ccxt picks its futures error table by the host fapi.binance.com: a plain URL override
    turns -2019 into a bare ExchangeError, hence ``point_ccxt_at``."""
    async with connect(venue, merge_errors=False) as ex:
        with pytest.raises(ccxt.ExchangeError, match="-2019") as caught:
            await ex.create_order(FUTURES, "market", "buy", 21)
    assert type(caught.value) is ccxt.ExchangeError


async def test_filters_and_symbols_are_checked(venue: BinanceVenue) -> None:
    async with connect(venue) as ex, connect(venue, "spot") as spot:
        await ex.load_markets()
        await spot.load_markets()
        order = {"symbol": "BTCUSDT", "side": "BUY", "type": "MARKET"}
        with pytest.raises(ccxt.BadRequest, match="-1111"):
            await ex.fapiPrivatePostOrder(order | {"quantity": "0.0015"})
        with pytest.raises(ccxt.BadRequest, match="-4003"):
            await ex.fapiPrivatePostOrder(order | {"quantity": "0"})
        with pytest.raises(ccxt.InvalidOrder, match="-4164"):
            await ex.fapiPrivatePostOrder(order | {"quantity": "0.001"})  # 50 < 100 USDT
        with pytest.raises(ccxt.BadSymbol, match="-1121"):
            await ex.fapiPrivatePostOrder(order | {"symbol": "DOGEUSDT", "quantity": "1"})
        with pytest.raises(ccxt.InvalidOrder, match="LOT_SIZE"):
            await spot.privatePostOrder(order | {"quantity": "0.000015"})
        with pytest.raises(ccxt.BadRequest, match="NOTIONAL"):  # ccxt: -1013 is BadRequest
            await spot.privatePostOrder(order | {"quantity": "0.00001"})  # 0.5 < 5 USDT
    assert venue.placed(KEY) == []


# -------------------------------------------------------------------- positions


async def test_fetch_positions_shows_the_signed_position(venue: BinanceVenue) -> None:
    venue.set_position(KEY, "BTCUSDT", Decimal("-0.5"), entry_price=Decimal(52_000))
    async with connect(venue) as ex:
        [short] = await ex.fetch_positions([FUTURES])
        await ex.create_order("ETH/USDT:USDT", "market", "buy", 1)
        positions = {p["symbol"]: p for p in await ex.fetch_positions()}
    assert (short["side"], short["contracts"], short["entryPrice"]) == ("short", 0.5, 52_000)
    assert short["info"]["positionAmt"] == "-0.500"
    assert short["unrealizedPnl"] == 1_000
    assert positions["ETH/USDT:USDT"]["side"] == "long"
    assert positions["ETH/USDT:USDT"]["hedged"] is False
    assert venue.position(KEY, "ETHUSDT") == 1


async def test_hedge_mode_needs_the_position_side(venue: BinanceVenue) -> None:
    venue.set_hedge_mode(KEY, True)
    async with connect(venue) as ex:
        await ex.load_markets()  # fetch_position_mode does not load them
        assert (await ex.fetch_position_mode(FUTURES))["hedged"] is True
        with pytest.raises(ccxt.OperationRejected, match="-4061"):
            await ex.create_order(FUTURES, "market", "buy", 0.01)
        await ex.create_order(FUTURES, "market", "buy", 0.01, None, {"positionSide": "LONG"})
        await ex.create_order(FUTURES, "market", "sell", 0.02, None, {"positionSide": "SHORT"})
        positions = await ex.fetch_positions([FUTURES])
        # ccxt's unified way: hedged=True picks the position side, reduceOnly the closing one
        await ex.create_order(
            FUTURES, "market", "sell", 0.01, None, {"hedged": True, "reduceOnly": True}
        )
        [short] = await ex.fetch_positions([FUTURES])
    sides = sorted((p["info"]["positionSide"], p["info"]["positionAmt"]) for p in positions)
    assert sides == [("LONG", "0.010"), ("SHORT", "-0.020")]
    assert all(p["hedged"] for p in positions)
    assert (short["info"]["positionSide"], short["contracts"]) == ("SHORT", 0.02)
    assert venue.position(KEY, "BTCUSDT") == Decimal("-0.02")
    assert len(venue.placed(KEY)) == 3


async def test_set_position_mode_switches_when_flat(venue: BinanceVenue) -> None:
    async with connect(venue) as ex:
        await ex.load_markets()
        await ex.set_position_mode(True)
        assert (await ex.fetch_position_mode(FUTURES))["hedged"] is True
        with pytest.raises(ccxt.OperationRejected, match="-4059"):
            await ex.set_position_mode(True)


# ---------------------------------------------------------------- authentication


async def test_wrong_secret_raises_authentication_error(venue: BinanceVenue) -> None:
    async with connect(venue, secret="wrong") as ex, connect(venue, "spot", secret="x") as spot:
        with pytest.raises(ccxt.AuthenticationError, match="-1022"):
            await ex.create_order(FUTURES, "market", "buy", 0.01)
        with pytest.raises(ccxt.AuthenticationError, match="-1022"):
            await spot.fetch_balance()
    assert venue.placed(KEY) == []


async def test_unknown_key_raises_authentication_error(venue: BinanceVenue) -> None:
    async with connect(venue, api_key="other") as ex:
        with pytest.raises(ccxt.AuthenticationError, match="-2015"):
            await ex.fetch_balance()


async def test_stale_timestamp_raises_invalid_nonce_unless_ccxt_adjusts(
    venue: BinanceVenue,
) -> None:
    venue.set_clock_offset(30_000)  # the venue is 30 s ahead of the client
    async with connect(venue) as ex:
        with pytest.raises(ccxt.InvalidNonce, match="-1021"):
            await ex.fetch_balance()
    async with connect(venue, options={"adjustForTimeDifference": True}) as adjusted:
        assert (await adjusted.fetch_balance())["USDT"]["total"] == 100_000
    assert ("GET", "/fapi/v1/time") in venue.requests


async def test_signature_covers_query_string_and_body_together(venue: BinanceVenue) -> None:
    """totalParams is the query string followed by the body, without a separator."""
    query = "symbol=BTCUSDT&side=BUY&type=MARKET"
    body = f"quantity=0.01&newClientOrderId=raw-1&timestamp={int(time.time() * 1000)}"
    signature = hmac.new(SECRET.encode(), (query + body).encode(), hashlib.sha256).hexdigest()
    headers = {"X-MBX-APIKEY": KEY, "Content-Type": "application/x-www-form-urlencoded"}
    async with aiohttp.ClientSession() as session:
        url = f"{venue.origin}/fapi/v1/order?{query}"
        async with session.post(url, data=f"{body}&signature={signature}", headers=headers) as ok:
            assert ok.status == 200
        flipped = "1" if signature.endswith("0") else "0"  # always a different signature
        bad = f"{body}&signature={signature[:-1]}{flipped}"
        async with session.post(url, data=bad, headers=headers) as rejected:
            assert (rejected.status, (await rejected.json())["code"]) == (400, -1022)
    assert [o.client_order_id for o in venue.placed(KEY)] == ["raw-1"]


def test_futures_sandbox_mode_is_refused_by_ccxt() -> None:
    """ccxt 4.5.90 keeps set_sandbox_mode but refuses private futures calls on the testnet
    (it points to demo trading instead); nothing is sent."""
    ex = ccxt.binanceusdm({"apiKey": KEY, "secret": SECRET})
    ex.set_sandbox_mode(True)
    assert ex.urls["api"]["fapiPrivate"].startswith("https://testnet.binancefuture.com/")
    with pytest.raises(ccxt.NotSupported, match="demo trading"):
        ex.sign("order", ["fapiPrivate"], "POST", {"symbol": "BTCUSDT"})


# ------------------------------------------------------------------------ faults


@pytest.mark.parametrize("status", [429, 418])
async def test_rate_limit_answers_raise_ddos_protection(venue: BinanceVenue, status: int) -> None:
    body = {"code": -1003, "msg": "Too much request weight used; current limit is 2400."}
    venue.fault("POST", ORDER_PATHS, Refuse(status, body, {"Retry-After": "2"}), times=2)
    async with connect(venue) as ex, connect(venue, "spot") as spot:
        with pytest.raises(ccxt.DDoSProtection) as futures_error:
            await ex.create_order(FUTURES, "market", "buy", 0.01)
        with pytest.raises(ccxt.DDoSProtection) as spot_error:
            await spot.create_order(SPOT, "market", "buy", 0.01)
    assert type(futures_error.value) is ccxt.DDoSProtection  # not RateLimitExceeded
    assert type(spot_error.value) is ccxt.DDoSProtection
    assert venue.placed(KEY) == []


async def test_slow_answer_times_out_while_the_order_is_accepted(venue: BinanceVenue) -> None:
    async with connect(venue, timeout=300) as ex:
        await ex.load_markets()
        venue.fault("POST", ORDER_PATHS, Delay(0.5))
        with pytest.raises(ccxt.RequestTimeout):
            await ex.create_order(FUTURES, "market", "buy", 0.01, None, {"clientOrderId": "slow"})
        await _until(lambda: bool(venue.placed(KEY)))
        found = await ex.fetch_order(None, FUTURES, {"clientOrderId": "slow"})
    assert found["status"] == "closed"
    assert [o.client_order_id for o in venue.placed(KEY)] == ["slow"]


async def test_lost_answer_raises_network_error_while_the_order_is_placed(
    venue: BinanceVenue,
) -> None:
    venue.fault("POST", ORDER_PATHS, LoseAnswer(), times=2)
    async with connect(venue) as ex, connect(venue, "spot") as spot:
        with pytest.raises(ccxt.NetworkError) as futures_error:
            await ex.create_order(FUTURES, "market", "buy", 0.01, None, {"clientOrderId": "l-1"})
        with pytest.raises(ccxt.NetworkError) as spot_error:
            await spot.create_order(SPOT, "market", "buy", 0.01, None, {"clientOrderId": "l-2"})
    assert type(futures_error.value) is ccxt.ExchangeNotAvailable
    assert type(spot_error.value) is ccxt.ExchangeNotAvailable
    assert [(o.client_order_id, o.status) for o in venue.placed(KEY)] == [
        ("l-1", "FILLED"),
        ("l-2", "FILLED"),
    ]


async def _until(condition: Callable[[], bool], within: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)
