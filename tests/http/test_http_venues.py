"""A trader connecting a real venue through the API: the account is created for the venue,
its credentials are checked by the venue, orders go there through the worker, and a rotated
credential reaches the running worker. The venue is the local Binance emulator (the real ccxt
talks to it through ``BROKER_ENDPOINTS``); the service is the embedded runtime."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from http_support import Env, Session, login, running

from tradecore_adapters.brokers.client_ids import venue_client_id
from tradecore_entrypoints.settings import Settings
from venues.binance import BinanceVenue

KEY, SECRET = "venue-key-1", "venue-secret-1"
NEW_KEY, NEW_SECRET = "venue-key-2", "venue-secret-2"
PRICE = Decimal(61234)


@pytest.fixture
async def venue() -> AsyncIterator[BinanceVenue]:
    binance = BinanceVenue(default_market="usdm")
    await binance.start()
    binance.add_account(KEY, SECRET)
    binance.add_account(NEW_KEY, NEW_SECRET)
    binance.set_price("BTCUSDT", PRICE)
    try:
        yield binance
    finally:
        await binance.close()


@pytest.fixture
async def env(venue: BinanceVenue) -> AsyncIterator[Env]:
    settings = Settings(broker_endpoints={"binanceusdm": venue.origin}, broker_timeout_ms=1500)
    async with running(settings) as env:
        yield env


async def open_account(env: Env, secret: str = SECRET) -> tuple[Session, dict[str, Any]]:
    """A trader's browser session and a new binanceusdm account (unverified)."""
    trader = await env.trader()
    session = await login(env.client, trader.user.email)
    created = await session.request(
        "POST",
        "/trading/accounts",
        json={
            "name": "Binance futures",
            "broker": "binanceusdm",
            "credentials": {"api_key": KEY, "api_secret": secret},
        },
    )
    assert created.status == 201, await created.text()
    return session, await created.json()


async def verify(session: Session, account_id: str) -> Any:
    return await session.request("POST", f"/trading/accounts/{account_id}/verify-credentials")


async def send_webhook(env: Env, created: dict[str, Any], symbol: str, **fields: Any) -> Any:
    body = {
        "action": "buy",
        "symbol": symbol,
        "quantity": 0.01,
        "timestamp": env.clock.now().isoformat(),
        "secret": created["webhook_secret"],
        **fields,
    }
    path = created["webhook_url"].split("tradecore.test", 1)[1]
    return await env.client.post(path, json=body)


async def test_an_account_at_a_venue_is_checked_by_the_venue_and_trades_there(
    env: Env, venue: BinanceVenue
) -> None:
    session, created = await open_account(env)
    account = created["account"]
    assert (account["broker"], account["testnet"], account["credentials_verified"]) == (
        "binanceusdm",
        False,
        False,
    )
    verified = await verify(session, account["id"])
    assert verified.status == 200, await verified.text()

    listed = await session.request("GET", f"/trading/accounts/{account['id']}/instruments")
    assert {"BTCUSDT", "ETHUSDT"} <= set((await listed.json())["symbols"])

    reply = await send_webhook(env, created, "BINANCE:BTCUSDT")
    assert reply.status == 200, await reply.text()
    result = await reply.json()
    assert (result["status"], result["symbol"]) == ("filled", "BTCUSDT")
    assert Decimal(result["fill_price"]) == PRICE
    assert Decimal(result["filled_quantity"]) == Decimal("0.01")
    [placed] = venue.placed(KEY)
    assert placed.client_order_id == venue_client_id(f"{result['order_id']}-entry", 36)
    assert venue.position(KEY, "BTCUSDT") == Decimal("0.01")

    item = await session.request("GET", f"/trading/orders/{result['order_id']}")
    history = await item.json()
    assert (history["broker_name"], history["symbol"]) == ("binanceusdm", "BTCUSDT")
    held = await session.request("GET", f"/trading/accounts/{account['id']}/positions")
    assert (await held.json())["positions"] == [{"symbol": "BTCUSDT", "quantity": "0.01"}]


async def test_the_same_alert_in_another_symbol_form_is_a_replay(
    env: Env, venue: BinanceVenue
) -> None:
    session, created = await open_account(env)
    assert (await verify(session, created["account"]["id"])).status == 200
    first = await send_webhook(env, created, "BINANCE:BTCUSDT")
    assert first.status == 200
    again = await send_webhook(env, created, "BTCUSDT.P")
    assert again.status == 409
    assert len(venue.placed(KEY)) == 1


async def test_wrong_keys_are_400_with_the_venues_reason_and_stay_unverified(
    env: Env, venue: BinanceVenue
) -> None:
    session, created = await open_account(env, secret="wrong-secret")
    refused = await verify(session, created["account"]["id"])
    assert refused.status == 400
    problem = await refused.json()
    assert problem["code"] == "credentials_rejected"
    assert "wrong-secret" not in await refused.text()
    account = await session.request("GET", f"/trading/accounts/{created['account']['id']}")
    assert (await account.json())["credentials_verified"] is False
    assert venue.placed(KEY) == []


async def test_an_unreachable_venue_is_503_not_verified(env: Env, venue: BinanceVenue) -> None:
    session, created = await open_account(env)
    await venue.close()
    down = await verify(session, created["account"]["id"])
    assert down.status == 503
    assert (await down.json())["code"] == "broker_unavailable"
    account = await session.request("GET", f"/trading/accounts/{created['account']['id']}")
    assert (await account.json())["credentials_verified"] is False


async def test_rotated_credentials_reach_the_running_worker(env: Env, venue: BinanceVenue) -> None:
    session, created = await open_account(env)
    account_id = created["account"]["id"]
    assert (await verify(session, account_id)).status == 200
    assert (await send_webhook(env, created, "BTCUSDT")).status == 200  # the worker connects

    rotated = await session.request(
        "PATCH",
        f"/trading/accounts/{account_id}",
        json={"credentials": {"api_key": NEW_KEY, "api_secret": NEW_SECRET}},
    )
    assert rotated.status == 200, await rotated.text()
    assert (await verify(session, account_id)).status == 200
    env.clock.advance(1)
    reply = await send_webhook(env, created, "BTCUSDT", action="sell")
    assert reply.status == 200, await reply.text()
    assert [o.side for o in venue.placed(KEY)] == ["buy"]
    assert [o.side for o in venue.placed(NEW_KEY)] == ["sell"]


async def test_symbol_aliases_and_allowed_symbols_use_the_venues_names(
    env: Env, venue: BinanceVenue
) -> None:
    session, created = await open_account(env)
    account_id = created["account"]["id"]
    assert (await verify(session, account_id)).status == 200
    changed = await session.request(
        "PATCH",
        f"/trading/accounts/{account_id}",
        json={"symbol_map": {"btc1!": "BTCUSDT"}, "allowed_symbols": ["BINANCE:BTCUSDT"]},
    )
    assert changed.status == 200, await changed.text()
    account = await changed.json()
    assert account["symbol_map"] == {"BTC1!": "BTCUSDT"}
    assert account["allowed_symbols"] == ["BTCUSDT"]

    reply = await send_webhook(env, created, "BTC1!")
    assert reply.status == 200, await reply.text()
    assert (await reply.json())["symbol"] == "BTCUSDT"
    refused = await send_webhook(env, created, "ETHUSDT")
    assert refused.status == 400
    assert len(venue.placed(KEY)) == 1


async def test_a_venue_nobody_lists_is_refused(env: Env) -> None:
    trader = await env.trader()
    session = await login(env.client, trader.user.email)
    refused = await session.request(
        "POST", "/trading/accounts", json={"name": "X", "broker": "kraken"}
    )
    assert refused.status == 400
    assert "broker is not supported" in await refused.text()


async def test_no_credential_reaches_a_log_line_or_the_audit_log(
    env: Env, venue: BinanceVenue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    session, created = await open_account(env, secret="wrong-secret")
    account_id = created["account"]["id"]
    assert (await verify(session, account_id)).status == 400
    replaced = await session.request(
        "PATCH",
        f"/trading/accounts/{account_id}",
        json={"credentials": {"api_key": KEY, "api_secret": SECRET}},
    )
    assert replaced.status == 200
    assert (await verify(session, account_id)).status == 200
    assert (await send_webhook(env, created, "BTCUSDT")).status == 200
    await venue.close()  # and a venue that went away
    assert (await verify(session, account_id)).status == 503

    logged = "\n".join(
        f"{r.getMessage()} {r.exc_text or ''} {r.stack_info or ''}" for r in caplog.records
    )
    audited = "\n".join(repr(s.entry) for s in env.audit())
    for secret in ("wrong-secret", SECRET, KEY):
        assert secret not in logged
        assert secret not in audited
