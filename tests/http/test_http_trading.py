"""Trading and settings endpoints through HTTP: accounts, webhook credentials, dashboard
orders, order history, API keys, allowed IPs and security events."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from http_support import BASE_URL, Env, Session, Trader, login, running

from tradecore.audit import AuditAction
from tradecore_entrypoints.settings import Settings


@pytest.fixture
async def session(env: Env, trader: Trader) -> Session:
    return await login(env.client, trader.user.email)


def order_body(trader: Trader, **changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "trading_account_id": trader.account.account.id,
        "symbol": "BTCUSDT",
        "action": "buy",
        "quantity": 1,
    }
    body.update(changes)
    return body


async def test_account_lifecycle(env: Env, session: Session) -> None:
    created = await session.request(
        "POST", "/trading/accounts", json={"name": "Second", "broker": "paper"}
    )
    assert created.status == 201
    body = await created.json()
    account = body["account"]
    assert body["webhook_url"].startswith(f"{BASE_URL}/webhook/")
    assert body["webhook_secret"]
    assert account["credentials_verified"] is False
    listed = await (await session.request("GET", "/trading/accounts", csrf=False)).json()
    assert {a["name"] for a in listed["items"]} == {"Main", "Second"}
    assert all("secret" not in k and "token" not in k for a in listed["items"] for k in a)
    path = f"/trading/accounts/{account['id']}"
    patched = await session.request(
        "PATCH",
        path,
        json={"name": "Renamed", "max_request_age": 60, "allowed_symbols": ["btcusdt"]},
    )
    assert patched.status == 200
    assert await patched.json() == {
        **account,
        "name": "Renamed",
        "max_request_age": 60,
        "allowed_symbols": ["BTCUSDT"],
    }
    bad = await session.request("PATCH", path, json={"max_request_age": True})
    assert bad.status == 400
    unknown_symbol = await session.request("PATCH", path, json={"allowed_symbols": ["NOPE"]})
    assert unknown_symbol.status == 400
    verified = await session.request("POST", f"{path}/verify-credentials")
    assert await verified.json() == {"verified": True}
    assert (await (await session.request("GET", path, csrf=False)).json())["credentials_verified"]
    deleted = await session.request("DELETE", path)
    assert deleted.status == 204
    assert (await session.request("GET", path, csrf=False)).status == 404
    webhook = await env.client.post(body["webhook_url"].removeprefix(BASE_URL), json={})
    assert webhook.status in (400, 404)
    actions = [s.entry.action for s in env.audit()]
    for action in (
        AuditAction.ACCOUNT_CREATED,
        AuditAction.ACCOUNT_UPDATED,
        AuditAction.ACCOUNT_DELETED,
    ):
        assert action in actions


async def test_create_account_validates_input(session: Session) -> None:
    for body in (
        {},
        {"name": ""},
        {"name": "x", "broker": "nasdaq"},
        {"name": "x", "credentials": 5},
    ):
        assert (await session.request("POST", "/trading/accounts", json=body)).status == 400


async def test_another_users_account_is_404(env: Env, trader: Trader) -> None:
    await env.trader("bob@example.com")
    bob = await login(env.client, "bob@example.com")
    path = f"/trading/accounts/{trader.account.account.id}"
    assert (await bob.request("GET", path, csrf=False)).status == 404
    assert (await bob.request("DELETE", path)).status == 404
    assert (await bob.request("POST", f"{path}/webhook-secret")).status == 404
    order = await bob.request("POST", "/trading/order", json=order_body(trader))
    assert order.status == 404


async def test_regenerated_secret_replaces_the_old_one(
    env: Env, trader: Trader, session: Session
) -> None:
    path = f"/trading/accounts/{trader.account.account.id}/webhook-secret"
    response = await session.request("POST", path)
    new_secret = (await response.json())["webhook_secret"]
    assert (await trader.webhook(trader.body())).status == 401
    assert (await trader.webhook(trader.body(secret=new_secret, quantity=2))).status == 200
    assert env.last_audit().entry.action is AuditAction.WEBHOOK_ORDER


async def test_rotated_token_retires_the_old_url(
    env: Env, trader: Trader, session: Session
) -> None:
    path = f"/trading/accounts/{trader.account.account.id}/webhook-token"
    url = (await (await session.request("POST", path)).json())["webhook_url"]
    assert (await trader.webhook()).status == 404
    response = await env.client.post(url.removeprefix(BASE_URL), json=trader.body(quantity=2))
    assert response.status == 200


async def test_webhook_credentials_need_a_browser_session(
    env: Env, trader: Trader, session: Session
) -> None:
    key = (await (await session.request("POST", "/settings/api-keys", json={"name": "k"})).json())[
        "key"
    ]
    bearer = {"Authorization": f"Bearer {key}"}
    account = f"/trading/accounts/{trader.account.account.id}"
    for path in (f"{account}/webhook-secret", f"{account}/webhook-token", "/settings/api-keys"):
        response = await env.client.post(path, headers=bearer, json={"name": "x"})
        assert response.status == 403, path
    assert (await env.client.get("/settings/allowed-ips", headers=bearer)).status == 403
    assert (await env.client.get("/trading/accounts", headers=bearer)).status == 200


async def test_positions(env: Env, trader: Trader, session: Session) -> None:
    await trader.webhook(trader.body(quantity=0.5))
    path = f"/trading/accounts/{trader.account.account.id}/positions"
    body = await (await session.request("GET", path, csrf=False)).json()
    assert body["positions"] == [{"symbol": "BTCUSDT", "quantity": "0.5"}]


async def test_dashboard_order_200_and_history(env: Env, trader: Trader, session: Session) -> None:
    response = await session.request(
        "POST", "/trading/order", json=order_body(trader, quantity=0.25)
    )
    assert response.status == 200
    result = await response.json()
    assert result["status"] == "filled" and result["quantity"] == "0.25"
    row = await (
        await session.request("GET", f"/trading/orders/{result['order_id']}", csrf=False)
    ).json()
    assert row["source"] == "dashboard"
    assert row["id"] == result["order_id"]
    assert row["fill_quantity"] == "0.25"
    # every moment of its life is recorded, in order (the dashboard's stage chart reads them)
    moments = ["created_at", "admitted_at", "submitted_at", "placed_at", "filled_at"]
    assert all(row[m] is not None for m in moments), {m: row[m] for m in moments}
    times = [datetime.fromisoformat(row[m]) for m in moments]
    assert times == sorted(times)
    assert set(row) >= {
        "symbol",
        "action",
        "quantity",
        "order_type",
        "source",
        "order_id",
        "broker_refs",
        "status",
        "submitted_at",
        "fill_price",
        "fill_quantity",
        "filled_at",
        "auto_exit",
        "exit_quantity",
        "position_before",
        "exit_order_result",
        "user_id",
        "trading_account_id",
        "broker_name",
        "simulation",
        "id",
        "created_at",
    }
    assert env.last_audit().entry.action is AuditAction.DASHBOARD_ORDER


@pytest.mark.parametrize(
    ("action", "order_type", "stored"),
    [
        ("buy", "exit", "exit"),
        ("buy", None, "entry"),
        ("close_long", None, None),
        ("close_short", "exit", None),  # accepted; a close has no type whatever the alert says
    ],
)
async def test_the_history_records_the_order_type_the_order_had(
    trader: Trader, session: Session, action: str, order_type: str | None, stored: str | None
) -> None:
    changes: dict[str, object] = {"action": action}
    if order_type is not None:
        changes["order_type"] = order_type
    response = await session.request("POST", "/trading/order", json=order_body(trader, **changes))
    assert response.status == 200, await response.text()
    order_id = (await response.json())["order_id"]
    row = await (await session.request("GET", f"/trading/orders/{order_id}", csrf=False)).json()
    assert (row["action"], row["order_type"]) == (action, stored)


@pytest.mark.parametrize(
    "changes",
    [
        {"quantity": "1e3"},
        {"quantity": 0},
        {"action": "hold"},
        {"symbol": "BTC USDT!"},
        {"trading_account_id": 7},
        {"order_type": "limit"},
    ],
)
async def test_dashboard_order_bad_input_is_400_and_audited(
    env: Env, trader: Trader, session: Session, changes: dict[str, object]
) -> None:
    response = await session.request("POST", "/trading/order", json=order_body(trader, **changes))
    assert response.status == 400
    assert env.last_audit().entry.action is AuditAction.DASHBOARD_ORDER


async def test_dashboard_order_without_credentials_is_401_and_audited(
    env: Env, trader: Trader
) -> None:
    response = await env.client.post("/trading/order", json=order_body(trader))
    assert response.status == 401
    assert env.last_audit().entry.action is AuditAction.DASHBOARD_ORDER


async def test_dashboard_unverified_credentials_are_403(env: Env) -> None:
    trader = await env.trader("eve@example.com", verified=False)
    session = await login(env.client, trader.user.email)
    response = await session.request("POST", "/trading/order", json=order_body(trader))
    assert response.status == 403
    simulated = await session.request(
        "POST", "/trading/order?simulation=true", json=order_body(trader)
    )
    assert simulated.status == 200


async def test_dashboard_allowed_ip_block(env: Env, trader: Trader, session: Session) -> None:
    added = await session.request(
        "POST", "/settings/allowed-ips", json={"ip_address": "203.0.113.0/24"}
    )
    assert added.status == 201
    response = await session.request("POST", "/trading/order", json=order_body(trader))
    assert response.status == 403
    assert env.last_audit().entry.action is AuditAction.WEBHOOK_IP_BLOCKED
    entry_id = (await added.json())["id"]
    assert (await session.request("DELETE", f"/settings/allowed-ips/{entry_id}")).status == 204
    assert (await session.request("POST", "/trading/order", json=order_body(trader))).status == 200


async def test_slow_worker_gives_202_and_the_poll_link_resolves() -> None:
    async with running(Settings(order_wait_s=0.01, webhook_wait_s=0.01)) as env:
        trader = await env.trader()
        # Another host holds the user's lease but is not serving yet: the wait runs out.
        foreign = await env.system.directory.acquire(trader.user.id, "host-elsewhere", 3600)
        assert foreign is not None
        response = await trader.webhook()
        assert response.status == 202
        body = await response.json()
        assert body["status"] == "queued"
        assert body["poll"] == f"/trading/orders/{body['order_id']}"
        assert response.headers["Location"] == body["poll"]
        session = await login(env.client, trader.user.email)
        dashboard = await session.request(
            "POST", "/trading/order", json=order_body(trader, quantity=2)
        )
        assert dashboard.status == 202
        row = await (await session.request("GET", body["poll"], csrf=False)).json()
        assert row["status"] == "queued"
        await env.system.directory.release(trader.user.id, foreign)  # that host went away
        env.system.host.activate(trader.user.id)
        for _ in range(500):
            row = await (await session.request("GET", body["poll"], csrf=False)).json()
            if row["status"] == "filled":
                break
            await asyncio.sleep(0.01)
        assert row["status"] == "filled"


async def test_order_history_pages_newest_first_without_gaps(
    env: Env, trader: Trader, session: Session
) -> None:
    ids = []
    for n in range(7):
        if n % 3 == 0:
            env.clock.advance(1)  # several orders share a creation time
        response = await trader.webhook(trader.body(quantity=n + 1))
        ids.append((await response.json())["order_id"])
    seen: list[str] = []
    before = None
    for _ in range(10):
        query = "?limit=3" + (f"&before={before}" if before else "")
        page = await (await session.request("GET", "/trading/orders" + query, csrf=False)).json()
        seen += [item["id"] for item in page["items"]]
        before = page["next_before"]
        if before is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    created = [
        (await env.system.orders.get(order_id)).created_at
        for order_id in seen  # type: ignore[union-attr]
    ]
    assert created == sorted(created, reverse=True)
    other = await session.request("GET", "/trading/orders?trading_account_id=elsewhere", csrf=False)
    assert (await other.json())["items"] == []
    assert (await session.request("GET", "/trading/orders?limit=0", csrf=False)).status == 400
    assert (await session.request("GET", "/trading/orders?before=%%%", csrf=False)).status == 400


async def test_foreign_order_is_404(env: Env, trader: Trader) -> None:
    order_id = (await (await trader.webhook()).json())["order_id"]
    await env.trader("bob@example.com")
    bob = await login(env.client, "bob@example.com")
    assert (await bob.request("GET", f"/trading/orders/{order_id}", csrf=False)).status == 404


async def test_api_keys(env: Env, trader: Trader, session: Session) -> None:
    expires = (env.clock.now() + timedelta(hours=1)).isoformat()
    created = await session.request(
        "POST", "/settings/api-keys", json={"name": "bot", "expires_at": expires}
    )
    assert created.status == 201
    body = await created.json()
    key = body["key"]
    assert key.startswith("tck_") and body["prefix"] == key[:12]
    listed = await (await session.request("GET", "/settings/api-keys", csrf=False)).json()
    assert [k["id"] for k in listed["items"]] == [body["id"]]
    assert "key" not in listed["items"][0]
    bearer = {"Authorization": f"Bearer {key}"}
    assert (await env.client.get("/trading/accounts", headers=bearer)).status == 200
    stored = await env.system.api_keys.by_hash(
        __import__("hashlib").sha256(key.encode()).hexdigest()
    )
    assert stored is not None and stored.last_used_at == env.clock.now()
    env.clock.advance(2 * 3600)
    assert (await env.client.get("/trading/accounts", headers=bearer)).status == 401
    session = await login(env.client, trader.user.email)
    second = await (await session.request("POST", "/settings/api-keys", json={"name": "b2"})).json()
    bearer2 = {"Authorization": f"Bearer {second['key']}"}
    assert (await env.client.get("/trading/accounts", headers=bearer2)).status == 200
    revoked = await session.request("DELETE", f"/settings/api-keys/{second['id']}")
    assert revoked.status == 204
    assert (await env.client.get("/trading/accounts", headers=bearer2)).status == 401
    assert (await session.request("DELETE", f"/settings/api-keys/{second['id']}")).status == 404
    bad = await session.request(
        "POST", "/settings/api-keys", json={"name": "x", "expires_at": "soon"}
    )
    assert bad.status == 400


async def test_allowed_ips_validation(session: Session) -> None:
    assert (
        await session.request("POST", "/settings/allowed-ips", json={"ip_address": "nope"})
    ).status == 400
    first = await session.request(
        "POST", "/settings/allowed-ips", json={"ip_address": "::ffff:10.0.0.1"}
    )
    assert (await first.json())["ip_address"] == "10.0.0.1"
    dup = await session.request("POST", "/settings/allowed-ips", json={"ip_address": "10.0.0.1"})
    assert dup.status == 409
    listed = await (await session.request("GET", "/settings/allowed-ips", csrf=False)).json()
    assert [e["ip_address"] for e in listed["items"]] == ["10.0.0.1"]
    assert (await session.request("DELETE", "/settings/allowed-ips/missing")).status == 404


async def test_security_attacks_lists_counts_and_pages(
    env: Env, trader: Trader, session: Session
) -> None:
    await trader.webhook(trader.body(secret="wrong"))
    stale = (env.clock.now() - timedelta(minutes=10)).isoformat()
    await trader.webhook(trader.body(timestamp=stale))
    body = trader.body()
    await trader.webhook(body)
    await trader.webhook(body)
    await trader.webhook(trader.body(secret="wrong", quantity=3))
    response = await session.request("GET", "/settings/security-attacks?page_size=2", csrf=False)
    page = await response.json()
    assert page["total"] == 4
    assert page["counts"]["webhook_credential_attack"] == 2
    assert page["counts"]["webhook_replay_attack"] == 1
    assert page["counts"]["webhook_timestamp_expired"] == 1
    assert len(page["items"]) == 2 and page["page_size"] == 2
    assert page["items"][0]["action"] == "webhook_credential_attack"
    assert page["items"][0]["trading_account_id"] == trader.account.account.id
    assert page["affected_accounts"] == [
        {"trading_account_id": trader.account.account.id, "name": "Main", "events": 4}
    ]
    second = await (
        await session.request("GET", "/settings/security-attacks?page=2&page_size=2", csrf=False)
    ).json()
    assert {i["id"] for i in second["items"]}.isdisjoint({i["id"] for i in page["items"]})
    env.clock.advance(8 * 86400)
    session2 = await login(env.client, trader.user.email)
    recent = await (
        await session2.request("GET", "/settings/security-attacks?days=7", csrf=False)
    ).json()
    assert recent["total"] == 0
    assert (
        await session2.request("GET", "/settings/security-attacks?days=0", csrf=False)
    ).status == 400


async def test_decimal_positions_stay_exact(env: Env, trader: Trader) -> None:
    env.system.exchange.set_position(trader.account.account.id, "BTCUSDT", Decimal("0.1"))
    result = await (await trader.webhook(trader.body(quantity=0.2))).json()
    assert result["position_before"] == "0.1"
