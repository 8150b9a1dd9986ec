"""Middleware through HTTP: CSRF, CORS, BrowserOnly, the security headers on every response,
problem responses, the catch-all 500 and the hidden server version."""

from __future__ import annotations

import ipaddress
import json
import logging

import pytest
from dependency_injector import providers
from http_support import Env, container_for, login, running

from tradecore.audit import AuditAction
from tradecore.testing.clock import FakeClock
from tradecore_adapters.http import runner_options
from tradecore_adapters.http.config import SECURITY_HEADERS, HttpConfig
from tradecore_entrypoints.container import make_app
from tradecore_entrypoints.settings import Settings

DASHBOARD = "https://app.example.com"


def assert_security_headers(response, config: HttpConfig | None = None) -> None:
    """The headers of a service with ``config`` (default: the tests' one, challenge off)."""
    expected = (config or HttpConfig()).security_headers
    for name, value in expected.items():
        assert response.headers[name] == value, name
    assert response.headers["Server"] == "tradecore"
    assert "aiohttp" not in response.headers["Server"]


def test_csp_names_its_allowlists_and_no_wildcard() -> None:
    csp = SECURITY_HEADERS["Content-Security-Policy"]
    assert "*" not in csp
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
    directives = dict(d.split(" ", 1) for d in csp.split("; "))
    assert "https://challenges.cloudflare.com" in directives["script-src"]
    assert "tradingview.com" in directives["script-src"]
    assert "https://challenges.cloudflare.com" in directives["frame-src"]
    for name in ("script-src", "style-src", "img-src", "connect-src", "frame-src"):
        assert name in directives


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/health", 200),
        ("GET", "/health/ready", 200),
        ("GET", "/no/such/path", 404),
        ("DELETE", "/health", 405),
        ("GET", "/auth/me", 401),
        ("POST", "/webhook/x/order", 415),
        ("GET", "/docs", 200),
    ],
)
async def test_every_response_carries_the_security_headers(
    env: Env, method: str, path: str, status: int
) -> None:
    response = await env.client.request(method, path)
    assert response.status == status
    assert_security_headers(response)
    if status >= 400:
        assert response.headers["Content-Type"].startswith("application/problem+json")
        body = await response.json()
        assert body["status"] == status and body["title"] and body["detail"]


async def test_method_not_allowed_keeps_allow(env: Env) -> None:
    response = await env.client.delete("/health")
    assert "GET" in response.headers["Allow"]


async def test_unexpected_exception_is_a_problem_500_without_details(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Exploding:
        async def get(self, order_id: str) -> None:
            raise RuntimeError("secret internals")

    from aiohttp.test_utils import TestClient, TestServer

    container = container_for(Settings(), FakeClock())
    system = container.services.system()
    container.services.http.add_kwargs(orders=providers.Object(Exploding()))
    server = TestServer(make_app(container))
    await server.start_server(**runner_options())
    async with TestClient(server) as client:
        await system.provisioning.create_user("ada@example.com", "correct horse battery staple")
        response = await client.post(
            "/auth/token",
            data={
                "grant_type": "password",
                "username": "ada@example.com",
                "password": "correct horse battery staple",
            },
        )
        token = (await response.json())["access_token"]
        with caplog.at_level(logging.ERROR):
            failed = await client.get(
                "/trading/orders/abc", headers={"Authorization": f"Bearer {token}"}
            )
        assert failed.status == 500
        body = await failed.json()
        assert body["type"] == "about:blank" and "secret internals" not in json.dumps(body)
        assert_security_headers(failed)
        assert any("unhandled error" in r.getMessage() for r in caplog.records)


async def test_csrf_missing_or_wrong_is_403_audited_without_mail(env: Env) -> None:
    trader = await env.trader()
    session = await login(env.client, "ada@example.com")
    missing = await session.request(
        "POST", "/settings/allowed-ips", csrf=False, json={"ip_address": "1.2.3.4"}
    )
    assert missing.status == 403
    wrong = await session.request(
        "POST",
        "/settings/allowed-ips",
        csrf=False,
        json={"ip_address": "1.2.3.4"},
        headers={"X-CSRF-Token": "forged"},
    )
    assert wrong.status == 403
    entries = [s.entry for s in env.audit(trader.user.id)][-2:]
    assert [e.action for e in entries] == [AuditAction.CSRF_VALIDATION_FAILED] * 2
    assert [e.metadata["reason"] for e in entries] == ["missing", "mismatch"]
    await env.system.events.drain()
    assert env.system.outbox.sent == []
    assert await env.system.allowed_ips.list_for_user(trader.user.id) == []
    ok = await session.request("POST", "/settings/allowed-ips", json={"ip_address": "1.2.3.4"})
    assert ok.status == 201


async def test_csrf_token_of_another_session_is_refused(env: Env) -> None:
    await env.trader()
    await env.trader("bob@example.com")
    ada = await login(env.client, "ada@example.com")
    bob = await login(env.client, "bob@example.com")
    response = await ada.request(
        "POST",
        "/auth/accept-terms",
        csrf=False,
        json={"version": "1"},
        headers={"X-CSRF-Token": bob.csrf_token},
    )
    assert response.status == 403


async def test_safe_methods_need_no_csrf(env: Env) -> None:
    await env.trader()
    session = await login(env.client, "ada@example.com")
    assert (await session.request("GET", "/trading/accounts", csrf=False)).status == 200


async def test_api_key_bearer_needs_no_csrf(env: Env) -> None:
    trader = await env.trader()
    session = await login(env.client, "ada@example.com")
    created = await session.request("POST", "/settings/api-keys", json={"name": "bot"})
    key = (await created.json())["key"]
    bearer = {"Authorization": f"Bearer {key}"}
    order = {
        "trading_account_id": trader.account.account.id,
        "symbol": "BTCUSDT",
        "action": "buy",
        "quantity": 1,
    }
    response = await env.client.post("/trading/order", json=order, headers=bearer)
    assert response.status == 200, await response.text()


async def test_cors_for_allowed_origins_only() -> None:
    async with running(Settings(allowed_origins=frozenset({DASHBOARD}))) as env:
        allowed = await env.client.get("/health", headers={"Origin": DASHBOARD})
        assert allowed.headers["Access-Control-Allow-Origin"] == DASHBOARD
        assert allowed.headers["Access-Control-Allow-Credentials"] == "true"
        exposed = allowed.headers["Access-Control-Expose-Headers"]
        assert "Retry-After" in exposed and "Set-Cookie" not in exposed
        assert "Origin" in allowed.headers["Vary"]
        foreign = await env.client.get("/health", headers={"Origin": "https://evil.example"})
        assert "Access-Control-Allow-Origin" not in foreign.headers
        preflight = await env.client.options(
            "/trading/order",
            headers={
                "Origin": DASHBOARD,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-csrf-token",
            },
        )
        assert preflight.status == 204
        assert "X-CSRF-Token" in preflight.headers["Access-Control-Allow-Headers"]
        assert "DELETE" in preflight.headers["Access-Control-Allow-Methods"]
        assert_security_headers(preflight)
        refused = await env.client.options(
            "/trading/order",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert refused.status == 403
        assert "Access-Control-Allow-Origin" not in refused.headers
        error = await env.client.get("/auth/me", headers={"Origin": DASHBOARD})
        assert error.status == 401
        assert error.headers["Access-Control-Allow-Origin"] == DASHBOARD


async def test_browser_only_in_production() -> None:
    settings = Settings(production=True, allowed_origins=frozenset({DASHBOARD}))
    async with running(settings) as env:
        trader = await env.trader()
        creds = {"email": "ada@example.com", "password": "correct horse battery staple"}
        bare = await env.client.post("/auth/login", json=creds)
        assert bare.status == 403
        assert (await bare.json())["code"] == "browser_only"
        foreign = await env.client.post(
            "/auth/login", json=creds, headers={"Origin": "https://evil.example"}
        )
        assert foreign.status == 403
        assert (await foreign.json())["code"] == "origin_not_allowed"
        by_referer = await env.client.post(
            "/auth/login", json=creds, headers={"Referer": DASHBOARD + "/login"}
        )
        assert by_referer.status == 200
        ok = await env.client.post("/auth/login", json=creds, headers={"Origin": DASHBOARD})
        assert ok.status == 200
        # exemptions: health, webhooks, docs
        assert (await env.client.get("/health")).status == 200
        assert (await env.client.get("/docs")).status == 200
        assert (await trader.webhook()).status == 200
        # bearer requests carry no ambient credential
        token = await env.client.post(
            "/auth/token",
            data={
                "grant_type": "password",
                "username": creds["email"],
                "password": creds["password"],
            },
        )
        assert token.status == 200
        bearer = {"Authorization": f"Bearer {(await token.json())['access_token']}"}
        assert (await env.client.get("/auth/me", headers=bearer)).status == 200


async def test_development_skips_browser_only(env: Env) -> None:
    await env.trader()
    await login(env.client, "ada@example.com")  # no Origin, no Referer


async def test_client_ip_through_trusted_proxies_reaches_the_audit_log() -> None:
    settings = Settings(trusted_proxies=(ipaddress.ip_network("127.0.0.0/8"),))
    async with running(settings) as env:
        await env.client.post(
            "/auth/login",
            json={"email": "x@example.com", "password": "wrong password"},
            headers={"X-Forwarded-For": "::ffff:198.51.100.4, 127.0.0.2"},
        )
        assert env.last_audit().entry.context.ip_address == "198.51.100.4"


async def test_untrusted_peer_cannot_forge_its_address(env: Env) -> None:
    await env.client.post(
        "/auth/login",
        json={"email": "x@example.com", "password": "wrong password"},
        headers={"X-Forwarded-For": "198.51.100.4"},
    )
    assert env.last_audit().entry.context.ip_address == "127.0.0.1"


async def test_readiness_and_broker_outages_are_503() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    class Down:
        """Stores that went down after the process opened them, and a broker that is down."""

        async def open(self) -> None:
            return None

        async def ready(self) -> bool:
            return False

        async def close(self) -> None:
            return None

        async def positions(self, account: object) -> dict[str, object]:
            raise ConnectionError("broker down")

        async def verify(self, account: object, credentials: object) -> str | None:
            return "Invalid API key"

    container = container_for(Settings(), FakeClock())
    container.adapters.stores.override(providers.Object(Down()))
    container.services.account_broker.override(providers.Object(Down()))
    server = TestServer(make_app(container))
    await server.start_server(**runner_options())
    async with TestClient(server) as client:
        assert (await client.get("/health/ready")).status == 503
        assert (await client.get("/health")).status == 200
        system = container.services.system()
        user = await system.provisioning.create_user("ada@example.com", "correct horse battery")
        account = await system.provisioning.create_account(user, "Main")
        token = await client.post(
            "/auth/token",
            data={
                "grant_type": "password",
                "username": user.email,
                "password": "correct horse battery",
            },
        )
        bearer = {"Authorization": f"Bearer {(await token.json())['access_token']}"}
        path = f"/trading/accounts/{account.account.id}"
        assert (await client.get(f"{path}/positions", headers=bearer)).status == 503
        verify = await client.post(f"{path}/verify-credentials", headers=bearer)
        assert verify.status == 400
        assert (await verify.json())["detail"] == "Invalid API key"
