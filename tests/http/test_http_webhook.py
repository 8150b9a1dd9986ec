"""The webhook endpoint through HTTP: the specification's matrix with the audit action each
case writes, simulation, content types, body limits, and the token kept out of logs."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from decimal import Decimal

import attrs
import pytest
from http_support import Env, Trader, running

from tradecore.audit import AuditAction
from tradecore.identity import AllowedIp, Plan
from tradecore_entrypoints.settings import Settings

PROBLEM = "application/problem+json"


async def problem(response, status: int) -> dict:
    assert response.status == status, await response.text()
    assert response.headers["Content-Type"].startswith(PROBLEM)
    body = await response.json()
    assert set(body) >= {"type", "title", "status", "detail"}
    assert body["status"] == status
    return body


async def test_authentic_alert_returns_the_order_result(env: Env, trader: Trader) -> None:
    response = await trader.webhook(trader.body(quantity=0.5))
    assert response.status == 200
    result = await response.json()
    assert result["status"] == "filled"
    assert result["quantity"] == "0.5"  # decimals travel as exact strings
    assert result["filled_quantity"] == "0.5"
    assert result["auto_exit"] is False
    assert result["position_before"] == "0"
    assert result["simulation"] is False
    assert result["error"] is None
    row = await env.system.orders.get(result["order_id"])
    assert row is not None and row.source.value == "webhook"
    assert trader.actions()[-1] is AuditAction.WEBHOOK_ORDER
    assert env.last_audit().entry.success is True


async def test_text_plain_body_is_accepted_as_tradingview_sends_it(trader: Trader) -> None:
    response = await trader.webhook(content_type="text/plain; charset=utf-8")
    assert response.status == 200


async def test_other_content_types_are_refused_and_audited(env: Env, trader: Trader) -> None:
    response = await trader.webhook(content_type="application/x-www-form-urlencoded")
    await problem(response, 415)
    assert env.last_audit().entry.action is AuditAction.WEBHOOK_PAYLOAD_INVALID


async def test_reversal_sets_auto_exit(env: Env, trader: Trader) -> None:
    env.system.exchange.set_position(trader.account.account.id, "BTCUSDT", Decimal(-2))
    result = await (await trader.webhook()).json()
    assert result["auto_exit"] is True
    assert result["exit_quantity"] == "2"
    assert result["position_before"] == "-2"


async def test_unknown_token_is_404_and_audited_without_user(env: Env, trader: Trader) -> None:
    response = await env.client.post(
        "/webhook/not-a-token/order",
        data=json.dumps(trader.body()),
        headers={"Content-Type": "application/json"},
    )
    await problem(response, 404)
    entry = env.last_audit().entry
    assert entry.action is AuditAction.WEBHOOK_ORDER and entry.user_id is None
    assert "not-a-token" not in entry.context.request_path


async def test_disabled_user_is_403(env: Env, trader: Trader) -> None:
    disabled = attrs.evolve(trader.user, disabled=True)
    assert await env.system.users.save(disabled, previous=trader.user)
    await problem(await trader.webhook(), 403)
    assert trader.actions()[-1] is AuditAction.WEBHOOK_ORDER


async def test_foreign_ip_is_403_and_alerted(env: Env, trader: Trader) -> None:
    await env.system.allowed_ips.add(
        AllowedIp("ip1", trader.user.id, "203.0.113.7", env.clock.now())
    )
    await problem(await trader.webhook(), 403)
    assert trader.actions()[-1] is AuditAction.WEBHOOK_IP_BLOCKED
    await env.system.events.drain()
    assert [m.to for m in env.system.outbox.sent] == [trader.user.email]


async def test_allowed_ip_through_trusted_proxy_passes() -> None:
    settings = Settings(trusted_proxies=(__import__("ipaddress").ip_network("127.0.0.1/32"),))
    async with running(settings) as env:
        trader = await env.trader()
        await env.system.allowed_ips.add(
            AllowedIp("ip1", trader.user.id, "203.0.113.7", env.clock.now())
        )
        allowed = await trader.webhook(headers={"X-Forwarded-For": "203.0.113.7"})
        assert allowed.status == 200
        spoofed = await trader.webhook(
            trader.body(quantity=2), headers={"X-Forwarded-For": "203.0.113.7, 198.51.100.9"}
        )
        await problem(spoofed, 403)
        assert env.last_audit().entry.context.ip_address == "198.51.100.9"


async def test_stale_timestamp_is_401_request_expired(env: Env, trader: Trader) -> None:
    stale = (env.clock.now() - timedelta(seconds=301)).isoformat()
    body = await problem(await trader.webhook(trader.body(timestamp=stale)), 401)
    assert body["detail"] == "Request expired"
    assert trader.actions()[-1] is AuditAction.WEBHOOK_TIMESTAMP_EXPIRED


async def test_wrong_secret_is_401(env: Env, trader: Trader) -> None:
    body = await problem(await trader.webhook(trader.body(secret="guessed")), 401)
    assert body["detail"] != "Request expired"
    assert trader.actions()[-1] is AuditAction.WEBHOOK_CREDENTIAL_ATTACK
    assert env.last_audit().entry.metadata["attack_type"] == "wrong_secret"


@pytest.mark.parametrize("secret", [12345, None, ["x"], "s\u00e9cret"])
async def test_secret_of_a_wrong_type_is_a_wrong_secret(trader: Trader, secret: object) -> None:
    body = trader.body()
    body["secret"] = secret
    response = await trader.webhook(json.dumps(body).encode())
    assert response.status in (400, 401)  # a non-string is a payload error, never a 500


async def test_replay_is_409(env: Env, trader: Trader) -> None:
    body = trader.body()
    assert (await trader.webhook(body)).status == 200
    await problem(await trader.webhook(body), 409)
    assert trader.actions()[-1] is AuditAction.WEBHOOK_REPLAY_ATTACK
    assert "payload_hash" in env.last_audit().entry.metadata


@pytest.mark.parametrize(
    "raw",
    [
        b'{"action": "buy", "symbol": "BTCUSDT", "quantity": NaN}',
        b'{"action": "buy", "action": "sell", "symbol": "BTCUSDT", "quantity": 1}',
        b"[" * 5000 + b"]" * 5000,
        b'{"action": "buy", "symbol": "BTCUSDT", "quantity": true}',
        b'{"action": "buy", "symbol": "BTCUSDT", "quantity": 1' + b"0" * 100 + b"}",
        b"not json",
        b"\xff\xfe",
        b"",
    ],
)
async def test_malformed_body_is_400_payload_invalid(env: Env, trader: Trader, raw: bytes) -> None:
    await problem(await trader.webhook(raw), 400)
    entry = env.last_audit().entry
    assert entry.action is AuditAction.WEBHOOK_PAYLOAD_INVALID
    assert entry.user_id == trader.user.id


async def test_body_over_16_kib_is_400_never_read_whole(env: Env, trader: Trader) -> None:
    body = trader.body(padding="x" * (16 * 1024))
    await problem(await trader.webhook(body), 400)
    assert env.last_audit().entry.action is AuditAction.WEBHOOK_PAYLOAD_INVALID


async def test_rate_limit_is_429_with_retry_after() -> None:
    async with running(Settings(rate_limit_per_minute=1)) as env:
        trader = await env.trader()
        assert (await trader.webhook(trader.body(quantity=1))).status == 200
        response = await trader.webhook(trader.body(quantity=2))
        await problem(response, 429)
        assert int(response.headers["Retry-After"]) >= 1


async def test_free_plan_real_order_is_403_but_simulation_passes(env: Env) -> None:
    trader = await env.trader(plan=Plan.FREE)
    body = await problem(await trader.webhook(), 403)
    assert body["code"] == "plan_simulation_only"
    simulated = await trader.webhook(trader.body(quantity=3), simulation=True)
    assert simulated.status == 200
    assert (await simulated.json())["simulation"] is True


async def test_daily_cap_is_429() -> None:
    async with running(Settings(plan_caps="free=1,pro=1")) as env:
        trader = await env.trader()
        assert (await trader.webhook(trader.body(quantity=1))).status == 200
        body = await problem(await trader.webhook(trader.body(quantity=2)), 429)
        assert body["code"] == "daily_cap_reached"


async def test_unverified_credentials_are_400_on_the_webhook(env: Env) -> None:
    trader = await env.trader(verified=False)
    body = await problem(await trader.webhook(), 400)
    assert body["code"] == "credentials_unverified"


async def test_terms_not_accepted_is_403(env: Env) -> None:
    trader = await env.trader(terms=None)
    body = await problem(await trader.webhook(), 403)
    assert body["code"] == "terms_not_accepted"


async def test_simulation_skips_exactly_timestamp_and_secret(env: Env, trader: Trader) -> None:
    body = {"action": "buy", "symbol": "BTCUSDT", "quantity": 1}
    first = await trader.webhook(body, simulation=True)
    assert first.status == 200
    assert env.system.exchange.position(trader.account.account.id, "BTCUSDT") == 0
    # the replay layer still applies
    await problem(await trader.webhook(body, simulation=True), 409)
    # and the token layer
    response = await env.client.post("/webhook/unknown/order?simulation=true", json=body)
    await problem(response, 404)


async def test_simulation_flag_must_be_boolean(trader: Trader) -> None:
    response = await trader.env.client.post(trader.path + "?simulation=maybe", json=trader.body())
    await problem(response, 400)


async def test_token_never_reaches_the_access_log_or_audit(
    env: Env, trader: Trader, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await trader.webhook()
    await trader.webhook(trader.body(secret="wrong"))
    await env.client.post(f"/webhook/{trader.account.webhook_token}/elsewhere", json={})
    access = [r for r in caplog.records if r.name == "aiohttp.access"]
    assert access, "the access log wrote nothing"
    assert any("/webhook/<token>/order" in r.getMessage() for r in access)
    for record in caplog.records:
        assert trader.account.webhook_token not in record.getMessage()
        assert trader.account.webhook_secret not in record.getMessage()
    for stored in env.audit():
        assert trader.account.webhook_token not in stored.entry.context.request_path
