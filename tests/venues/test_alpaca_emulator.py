"""The Alpaca emulator driven by the real alpaca-py ``TradingClient``.

alpaca-py is synchronous (requests) and the emulator runs on the test's event loop, so every
client call goes through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any, TypeVar

import pytest
import requests
from alpaca.common.exceptions import APIError
from alpaca.trading.client import TradingClient
from alpaca.trading.enums import OrderSide, OrderStatus, PositionSide, TimeInForce
from alpaca.trading.models import Asset, Clock, Order, Position, TradeAccount
from alpaca.trading.requests import LimitOrderRequest, MarketOrderRequest
from pydantic import BaseModel

from venues.alpaca import AlpacaVenue, rate_limited
from venues.base import Delay, LoseAnswer

KEY = "PKTESTKEY"
SECRET = "test-secret"
M = TypeVar("M", bound=BaseModel)


@pytest.fixture
async def venue() -> AsyncIterator[AlpacaVenue]:
    emulator = AlpacaVenue()
    emulator.add_account(KEY, SECRET)
    await emulator.start()
    yield emulator
    await emulator.close()


def make_client(venue: AlpacaVenue, secret: str = SECRET) -> TradingClient:
    """A client on the emulator that does not retry (alpaca-py retries 429/504 three times,
    3 s apart; its constructor ignores ``retry_attempts=0``, so the attribute is set)."""
    client = TradingClient(KEY, secret, paper=True, url_override=venue.origin)
    client._retry = 0
    return client


@pytest.fixture
def client(venue: AlpacaVenue) -> TradingClient:
    return make_client(venue)


async def call(function: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(function, *args)


async def fetch(kind: type[M], function: Callable[..., Any], *args: Any) -> M:
    """Call alpaca-py in a thread; it answers its models (``raw_data`` is off)."""
    result = await call(function, *args)
    assert isinstance(result, kind)
    return result


async def fetch_all(kind: type[M], function: Callable[[], Any]) -> list[M]:
    results = await call(function)
    assert isinstance(results, list)
    assert all(isinstance(result, kind) for result in results)
    return results


async def refused(function: Callable[..., Any], *args: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        await call(function, *args)
    return caught.value


def market(symbol: str, qty: str, side: OrderSide, client_order_id: str) -> MarketOrderRequest:
    return MarketOrderRequest(
        symbol=symbol,
        qty=float(qty),
        side=side,
        time_in_force=TimeInForce.DAY,
        client_order_id=client_order_id,
    )


async def submit(client: TradingClient, request: MarketOrderRequest | LimitOrderRequest) -> Order:
    return await fetch(Order, client.submit_order, request)


async def test_get_account(client: TradingClient) -> None:
    account = await fetch(TradeAccount, client.get_account)
    assert account.status == "ACTIVE"
    assert account.currency == "USD"
    assert (account.cash, account.buying_power, account.equity) == ("100000", "100000", "100000")


async def test_wrong_secret_is_401(venue: AlpacaVenue) -> None:
    error = await refused(make_client(venue, secret="wrong").get_account)
    assert error.status_code == 401
    assert (error.code, error.message) == (40110000, "request is not authorized")


async def test_assets(client: TradingClient) -> None:
    assets = await fetch_all(Asset, client.get_all_assets)
    assert {a.symbol: a.fractionable for a in assets} == {
        "AAPL": True,
        "MSFT": False,
        "SPY": True,
    }
    spy = await fetch(Asset, client.get_asset, "SPY")
    assert (spy.asset_class, spy.exchange, spy.status, spy.tradable) == (
        "us_equity",
        "ARCA",
        "active",
        True,
    )
    error = await refused(client.get_asset, "ZZZZ")
    assert (error.status_code, error.code, error.message) == (
        404,
        40410000,
        "asset not found for ZZZZ",
    )


async def test_clock_follows_the_market_control(venue: AlpacaVenue, client: TradingClient) -> None:
    clock = await fetch(Clock, client.get_clock)
    assert clock.is_open
    assert clock.timestamp < clock.next_close < clock.next_open
    venue.set_market_open(False)
    clock = await fetch(Clock, client.get_clock)
    assert not clock.is_open
    assert clock.timestamp < clock.next_open < clock.next_close


async def test_market_order_fills_at_the_set_price(
    venue: AlpacaVenue, client: TradingClient
) -> None:
    venue.set_price("AAPL", Decimal(150))
    order = await submit(client, market("AAPL", "10", OrderSide.BUY, "buy-1"))
    assert order.status == OrderStatus.FILLED
    assert (order.qty, order.filled_qty, order.filled_avg_price) == ("10", "10", "150")
    assert (order.client_order_id, order.symbol, order.side) == ("buy-1", "AAPL", OrderSide.BUY)
    assert venue.position(KEY, "AAPL") == 10
    account = await fetch(TradeAccount, client.get_account)
    assert (account.cash, account.equity, account.buying_power) == ("98500", "100000", "98500")


async def test_orders_are_found_by_client_id_and_by_id(client: TradingClient) -> None:
    placed = await submit(client, market("SPY", "2", OrderSide.BUY, "find-me"))
    by_client_id = await fetch(Order, client.get_order_by_client_id, "find-me")
    by_id = await fetch(Order, client.get_order_by_id, placed.id)
    assert by_client_id.id == by_id.id == placed.id
    for lookup, argument in (
        (client.get_order_by_client_id, "never-sent"),
        (client.get_order_by_id, uuid.uuid4()),
    ):
        error = await refused(lookup, argument)
        assert (error.status_code, error.code, error.message) == (
            404,
            40410000,
            "order not found",
        )


async def test_a_reused_client_order_id_is_refused(
    venue: AlpacaVenue, client: TradingClient
) -> None:
    await submit(client, market("AAPL", "1", OrderSide.BUY, "once"))
    error = await refused(client.submit_order, market("AAPL", "1", OrderSide.BUY, "once"))
    assert (error.status_code, error.code, error.message) == (
        422,
        40010001,
        "client_order_id must be unique",
    )
    assert [o.client_order_id for o in venue.placed(KEY)] == ["once"]
    assert venue.position(KEY, "AAPL") == 1


async def test_insufficient_buying_power(venue: AlpacaVenue, client: TradingClient) -> None:
    venue.set_price("MSFT", Decimal(400))
    error = await refused(client.submit_order, market("MSFT", "251", OrderSide.BUY, "big"))
    assert (error.status_code, error.code, error.message) == (
        403,
        40310000,
        "insufficient buying power",
    )
    assert venue.placed(KEY) == []
    order = await submit(client, market("MSFT", "250", OrderSide.BUY, "exact"))
    assert order.status == OrderStatus.FILLED


async def test_fractional_qty_on_a_non_fractionable_asset_is_refused(
    venue: AlpacaVenue, client: TradingClient
) -> None:
    error = await refused(client.submit_order, market("MSFT", "0.5", OrderSide.BUY, "half-msft"))
    assert (error.status_code, error.code, error.message) == (
        403,
        40310000,
        'asset "MSFT" is not fractionable',
    )
    notional = MarketOrderRequest(
        symbol="MSFT", notional=100, side=OrderSide.BUY, time_in_force=TimeInForce.DAY
    )
    assert (await refused(client.submit_order, notional)).code == 40310000
    venue.set_price("AAPL", Decimal(200))
    order = await submit(client, market("AAPL", "0.5", OrderSide.BUY, "half-aapl"))
    assert (order.status, order.filled_qty) == (OrderStatus.FILLED, "0.5")
    assert [o.client_order_id for o in venue.placed(KEY)] == ["half-aapl"]


async def test_unknown_symbol_is_refused(client: TradingClient) -> None:
    error = await refused(client.submit_order, market("ZZZZ", "1", OrderSide.BUY, "nope"))
    assert (error.status_code, error.code, error.message) == (
        422,
        42210000,
        'asset "ZZZZ" not found',
    )


async def test_selling_more_than_held_is_refused(venue: AlpacaVenue, client: TradingClient) -> None:
    venue.set_position(KEY, "AAPL", Decimal(5))
    error = await refused(client.submit_order, market("AAPL", "10", OrderSide.SELL, "too-many"))
    assert (error.status_code, error.code) == (403, 40310000)
    assert error.message == "insufficient qty available for order (requested: 10, available: 5)"
    error = await refused(client.submit_order, market("SPY", "0.5", OrderSide.SELL, "frac-short"))
    assert error.message == "insufficient qty available for order (requested: 0.5, available: 0)"
    await submit(client, market("AAPL", "5", OrderSide.SELL, "all-of-it"))
    await submit(client, market("SPY", "3", OrderSide.SELL, "whole-short"))
    assert venue.position(KEY, "AAPL") == 0
    assert venue.position(KEY, "SPY") == -3


async def test_market_orders_queue_while_the_market_is_closed(
    venue: AlpacaVenue, client: TradingClient
) -> None:
    venue.set_market_open(False)
    venue.set_price("SPY", Decimal(500))
    order = await submit(client, market("SPY", "4", OrderSide.BUY, "overnight"))
    assert (order.status, order.filled_qty, order.filled_avg_price) == (
        OrderStatus.ACCEPTED,
        "0",
        None,
    )
    assert venue.position(KEY, "SPY") == 0
    assert (
        await fetch(TradeAccount, client.get_account)
    ).buying_power == "98000"  # held for the order
    venue.set_price("SPY", Decimal(510))
    venue.set_market_open(True)
    order = await fetch(Order, client.get_order_by_client_id, "overnight")
    assert (order.status, order.filled_qty, order.filled_avg_price) == (
        OrderStatus.FILLED,
        "4",
        "510",
    )
    assert venue.position(KEY, "SPY") == 4


async def test_partial_fill_then_fill_resting(venue: AlpacaVenue, client: TradingClient) -> None:
    venue.set_price("AAPL", Decimal(100))
    venue.fill_next_partially(Decimal("0.4"))
    order = await submit(client, market("AAPL", "10", OrderSide.BUY, "partial"))
    assert (order.status, order.filled_qty) == (OrderStatus.PARTIALLY_FILLED, "4")
    [placed] = venue.placed(KEY)
    assert (placed.status, placed.quantity, placed.filled) == (
        "partially_filled",
        Decimal(10),
        Decimal(4),
    )
    venue.set_price("AAPL", Decimal(110))
    venue.fill_resting()
    order = await fetch(Order, client.get_order_by_client_id, "partial")
    assert (order.status, order.filled_qty, order.filled_avg_price) == (
        OrderStatus.FILLED,
        "10",
        "106",
    )
    assert venue.placed(KEY)[0].filled == venue.position(KEY, "AAPL") == 10


async def test_limit_order_rests_until_the_price_reaches_it(
    venue: AlpacaVenue, client: TradingClient
) -> None:
    venue.set_price("SPY", Decimal(500))
    request = LimitOrderRequest(
        symbol="SPY",
        qty=2,
        side=OrderSide.BUY,
        time_in_force=TimeInForce.DAY,
        limit_price=490,
        client_order_id="dip",
    )
    order = await submit(client, request)
    assert (order.status, order.limit_price) == (OrderStatus.NEW, "490")
    venue.set_price("SPY", Decimal(489))
    order = await fetch(Order, client.get_order_by_client_id, "dip")
    assert (order.status, order.filled_avg_price) == (OrderStatus.FILLED, "489")


async def test_positions_are_signed(venue: AlpacaVenue, client: TradingClient) -> None:
    venue.set_price("AAPL", Decimal(100))
    venue.set_price("MSFT", Decimal(400))
    venue.set_position(KEY, "AAPL", Decimal(10))
    venue.set_position(KEY, "MSFT", Decimal(-5))
    positions = {p.symbol: p for p in await fetch_all(Position, client.get_all_positions)}
    assert set(positions) == {"AAPL", "MSFT"}
    assert (positions["AAPL"].qty, positions["AAPL"].side) == ("10", PositionSide.LONG)
    short = await fetch(Position, client.get_open_position, "MSFT")
    assert (short.qty, short.side, short.market_value, short.avg_entry_price) == (
        "-5",
        PositionSide.SHORT,
        "-2000",
        "400",
    )
    error = await refused(client.get_open_position, "SPY")
    assert (error.status_code, error.code, error.message) == (
        404,
        40410000,
        "position does not exist",
    )


async def test_429_reaches_the_client_as_an_api_error(
    venue: AlpacaVenue, client: TradingClient
) -> None:
    venue.fault("POST", "/v2/orders", rate_limited())
    error = await refused(client.submit_order, market("AAPL", "1", OrderSide.BUY, "limited"))
    assert (error.status_code, error.code, error.message) == (429, 42910000, "rate limit exceeded")
    assert error.response.headers["X-RateLimit-Remaining"] == "0"
    assert venue.placed(KEY) == []


async def test_alpaca_py_retries_a_429_by_itself(venue: AlpacaVenue) -> None:
    client = TradingClient(KEY, SECRET, paper=True, url_override=venue.origin)
    client._retry_wait = 0  # default: 3 retries, 3 s apart, on 429 and 504
    venue.fault("POST", "/v2/orders", rate_limited(), times=2)
    order = await submit(client, market("AAPL", "1", OrderSide.BUY, "retried"))
    assert order.status == OrderStatus.FILLED
    assert venue.count("POST", "/v2/orders") == 3
    assert len(venue.placed(KEY)) == 1


async def test_a_lost_answer_raises_while_the_order_stands(
    venue: AlpacaVenue, client: TradingClient
) -> None:
    venue.fault("POST", "/v2/orders", LoseAnswer())
    with pytest.raises(requests.exceptions.ConnectionError):
        await call(client.submit_order, market("AAPL", "3", OrderSide.BUY, "lost"))
    assert [(o.client_order_id, o.status) for o in venue.placed(KEY)] == [("lost", "filled")]
    order = await fetch(Order, client.get_order_by_client_id, "lost")
    assert order.status == OrderStatus.FILLED


async def test_a_slow_answer_only_times_out_with_a_timeout_set(
    venue: AlpacaVenue, client: TradingClient
) -> None:
    venue.fault("GET", "/v2/account", Delay(0.05))
    account = await fetch(TradeAccount, client.get_account)  # alpaca-py sets no timeout: it waits
    assert account.status == "ACTIVE"
    session = client._session
    with_timeout = functools.partial(session.request, timeout=(2.0, 0.05))  # (connect, read)
    session.request = with_timeout  # type: ignore[method-assign]
    venue.fault("POST", "/v2/orders", Delay(0.3))
    with pytest.raises(requests.exceptions.ReadTimeout):
        await call(client.submit_order, market("SPY", "1", OrderSide.BUY, "slow"))
    for _ in range(200):  # the venue still handles the request once the delay is over
        if venue.placed(KEY):
            break
        await asyncio.sleep(0.01)
    assert [o.client_order_id for o in venue.placed(KEY)] == ["slow"]
