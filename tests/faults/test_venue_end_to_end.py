"""Real orders at a venue, end to end: ``tradecore serve`` and ``tradecore worker`` as
processes trade at the local Binance emulator (tests/venues/binance.py, USDⓈ-M futures),
which runs on the test's event loop and which the processes reach over loopback through
``BROKER_ENDPOINTS``.

What a user depends on: an account created and verified through the HTTP API trades at its
venue; a webhook's symbol with an exchange prefix reaches the venue as the venue's id; the
order-history item shows the venue's fill; and a worker host killed after the venue took an
order and before it heard back never places that order a second time: the host that takes
the user over finds the order at the venue by its client order id.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest
from harness import (
    SETTLE_TIMEOUT_S,
    START_TIMEOUT_S,
    Account,
    Api,
    Browser,
    Stack,
    eventually,
    webhook_body,
)

from tradecore_adapters.brokers.client_ids import venue_client_id
from venues.base import Hold
from venues.binance import BinanceVenue

pytestmark = pytest.mark.faults

BROKER = "binanceusdm"
API_KEY = "e2e-key-6f1c2a"
API_SECRET = "e2e-secret-0b7d94c3a1"
SYMBOL = "BTCUSDT"
WEBHOOK_SYMBOL = "BINANCE:BTCUSDT"
PRICE = Decimal("61234.5")
QUANTITY = Decimal("0.01")
ORDER_PATH = "/fapi/v1/order"
CLIENT_ID_LENGTH = 36
BROKER_TIMEOUT_MS = "2000"


@pytest.fixture
async def venue() -> AsyncIterator[BinanceVenue]:
    """The emulator with the account's key and the BTCUSDT price. Requested before ``stack``,
    it outlives the processes (they are stopped first)."""
    started = BinanceVenue()
    started.add_account(API_KEY, API_SECRET)
    started.set_price(SYMBOL, PRICE)
    await started.start()
    try:
        yield started
    finally:
        await started.close()


def venue_env(venue: BinanceVenue) -> dict[str, str]:
    """What points a process's binanceusdm calls at the emulator."""
    return {"BROKER_ENDPOINTS": f"{BROKER}={venue.origin}", "BROKER_TIMEOUT_MS": BROKER_TIMEOUT_MS}


def entry_id(order_id: str) -> str:
    """The client order id the venue must hold for the entry of order ``order_id``."""
    return venue_client_id(f"{order_id}-entry", CLIENT_ID_LENGTH)


async def open_venue_account(
    stack: Stack, api: Api, venue: BinanceVenue
) -> tuple[Browser, Account]:
    """Log in as a browser, create a binanceusdm account with the venue's key and verify it
    (the API asks the venue)."""
    browser = await api.browser(stack.trader.email)
    created = await api.create_trading_account(
        browser,
        f"{stack.workdir.name} binance",
        BROKER,
        {"api_key": API_KEY, "api_secret": API_SECRET},
    )
    assert created.status == 201, created
    assert created.body["account"]["broker"] == BROKER
    account = Account.from_created(created.body)

    asked = len(venue.requests)
    verified = await api.verify_credentials(browser, account.trading_account_id)
    assert (verified.status, verified.body) == (200, {"verified": True}), verified
    assert len(venue.requests) > asked, "the API verified the credentials without the venue"
    return browser, account


async def history_item(api: Api, browser: Browser, order_id: str) -> dict[str, object]:
    polled = await api.order(browser.access_token, order_id)
    assert polled.status == 200, polled
    item: dict[str, object] = polled.body
    return item


def assert_filled_at_the_venue(item: dict[str, object]) -> None:
    assert item["status"] == "filled", item
    assert (item["broker_name"], item["symbol"]) == (BROKER, SYMBOL), item
    assert Decimal(str(item["fill_price"])) == PRICE, item
    assert Decimal(str(item["fill_quantity"])) == QUANTITY, item
    assert item["filled_at"] is not None, item


async def test_a_webhook_order_fills_at_the_venue(venue: BinanceVenue, stack: Stack) -> None:
    env = venue_env(venue)
    api, _ = await asyncio.gather(stack.api(**env), stack.worker(**env))
    browser, account = await open_venue_account(stack, api, venue)

    body = webhook_body(account, symbol=WEBHOOK_SYMBOL, quantity=str(QUANTITY))
    reply = await api.webhook(account, body)

    await stack.executed(reply)
    order_id = reply.body["order_id"]
    assert_filled_at_the_venue(await history_item(api, browser, order_id))
    [placed] = venue.placed(API_KEY)
    assert placed.client_order_id == entry_id(order_id), placed
    assert (placed.symbol, placed.side, placed.quantity, placed.filled, placed.status) == (
        SYMBOL,
        "buy",
        QUANTITY,
        QUANTITY,
        "FILLED",
    ), placed
    assert venue.position(API_KEY, SYMBOL) == QUANTITY


async def test_a_worker_killed_after_the_venue_took_the_order_does_not_place_it_twice(
    venue: BinanceVenue, stack: Stack
) -> None:
    env = venue_env(venue)
    api, worker = await asyncio.gather(
        stack.api(WEBHOOK_RESPONSE_WAIT_S="1", **env), stack.worker(**env)
    )
    browser, account = await open_venue_account(stack, api, venue)
    hold = Hold()
    venue.fault("POST", ORDER_PATH, hold)

    body = webhook_body(account, symbol=WEBHOOK_SYMBOL, quantity=str(QUANTITY))
    sent = asyncio.create_task(api.webhook(account, body))
    try:
        await asyncio.wait_for(hold.accepted.wait(), START_TIMEOUT_S)
    except TimeoutError:
        sent.cancel()
        raise AssertionError(f"the order never reached the venue\n{stack.logs()}") from None
    lookups = venue.count("GET", ORDER_PATH)  # the killed worker's own lookups, if any
    await worker.kill()  # the venue took the order; the worker never hears of it

    reply = await sent
    assert reply.status == 202, reply
    order_id = reply.body["order_id"]
    assert await stack.db.order_status(order_id) == "submitted", "finished before the kill"
    assert [p.client_order_id for p in venue.placed(API_KEY)] == [entry_id(order_id)]

    await stack.end_lease()  # the dead host's lease runs out now instead of after 30 s
    await stack.worker(**env)  # the new host takes the user over and recovers the order
    await stack.order_reaches(order_id, "filled")

    assert_filled_at_the_venue(await history_item(api, browser, order_id))
    assert [p.client_order_id for p in venue.placed(API_KEY)] == [entry_id(order_id)]

    async def fill_checked() -> bool:
        # one lookup by the recovery, then the fill check 2-3 s after the outcome
        return venue.count("GET", ORDER_PATH) >= lookups + 2

    await eventually(fill_checked, "the recovered order's fill check", timeout_s=SETTLE_TIMEOUT_S)
    [(fill_price, fill_quantity, filled_at)] = await stack.db.rows(
        "SELECT fill_price, fill_quantity, filled_at FROM order_history WHERE id = %s", order_id
    )
    assert (fill_price, fill_quantity) == (PRICE, QUANTITY)
    assert filled_at is not None

    second = await api.webhook(
        account, webhook_body(account, symbol=WEBHOOK_SYMBOL, quantity=str(QUANTITY))
    )
    await stack.executed(second)
    second_id = second.body["order_id"]
    assert second_id != order_id
    assert_filled_at_the_venue(await history_item(api, browser, second_id))
    assert [p.client_order_id for p in venue.placed(API_KEY)] == [
        entry_id(order_id),
        entry_id(second_id),
    ]
    assert venue.position(API_KEY, SYMBOL) == 2 * QUANTITY
