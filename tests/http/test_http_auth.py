"""``/auth/*`` through HTTP: login and its cookies, register, the OAuth2 token endpoint,
password reset, silent refresh with rotation and reuse detection, logout, revocation,
``/auth/me``, terms and the public key."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import pytest
from http_support import PASSWORD, Env, cookies_of, login, running

from tradecore.audit import AuditAction
from tradecore.identity import Plan
from tradecore.sessions import REFRESH_REUSE_GRACE
from tradecore.testing.clock import FakeClock
from tradecore_entrypoints.admin import admin_revoke_sessions
from tradecore_entrypoints.settings import Settings


async def test_login_sets_both_cookies_with_the_specification_flags(env: Env) -> None:
    await env.trader()
    response = await env.client.post(
        "/auth/login", json={"email": "ada@example.com", "password": PASSWORD}
    )
    assert response.status == 200
    body = await response.json()
    assert body["user"]["email"] == "ada@example.com"
    assert body["user"]["plan"] == "pro"
    assert "password_hash" not in body["user"]
    assert len(body["csrf_token"]) >= 43
    cookies = cookies_of(response)
    access, refresh = cookies["access_token"], cookies["refresh_token"]
    for morsel in (access, refresh):
        assert morsel["httponly"] and morsel["secure"]
        assert morsel["samesite"] == "Strict"
    assert int(access["max-age"]) == pytest.approx(30 * 60, abs=1)
    assert int(refresh["max-age"]) == pytest.approx(30 * 24 * 3600, abs=1)
    assert refresh["path"] == "/auth"
    assert "csrf" not in " ".join(response.headers.getall("Set-Cookie"))
    assert env.last_audit().entry.action is AuditAction.LOGIN


async def test_cookie_domain_and_lifetimes_follow_the_settings() -> None:
    settings = Settings(cookie_domain="example.com", access_token_minutes=5, refresh_token_days=2)
    async with running(settings) as env:
        await env.trader()
        response = await env.client.post(
            "/auth/login", json={"email": "ada@example.com", "password": PASSWORD}
        )
        cookies = cookies_of(response)
        assert cookies["access_token"]["domain"] == "example.com"
        assert int(cookies["access_token"]["max-age"]) == pytest.approx(300, abs=1)
        assert int(cookies["refresh_token"]["max-age"]) == pytest.approx(2 * 86400, abs=1)


async def test_unknown_user_and_wrong_password_look_the_same(env: Env) -> None:
    await env.trader()
    wrong = await env.client.post(
        "/auth/login", json={"email": "ada@example.com", "password": "not the password"}
    )
    unknown = await env.client.post(
        "/auth/login", json={"email": "nobody@example.com", "password": "not the password"}
    )
    assert wrong.status == unknown.status == 401
    assert await wrong.json() == await unknown.json()
    assert "Set-Cookie" not in wrong.headers


@pytest.mark.parametrize(
    "body", [b"{", b"[]", b'{"email": "a@b.co", "email": "c@d.co", "password": "x"}']
)
async def test_malformed_login_body_is_400_and_audited(env: Env, body: bytes) -> None:
    response = await env.client.post(
        "/auth/login", data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status == 400
    assert env.last_audit().entry.action is AuditAction.LOGIN


async def test_login_needs_json(env: Env) -> None:
    response = await env.client.post("/auth/login", data={"email": "a", "password": "b"})
    assert response.status == 415


async def test_json_body_over_64_kib_is_413(env: Env) -> None:
    response = await env.client.post(
        "/auth/login",
        data=b'{"email": "' + b"a" * 70_000 + b'"}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 413
    assert response.headers["Content-Type"].startswith("application/problem+json")


async def test_captcha_is_verified_when_enabled() -> None:
    class Refusing:
        async def verify(self, token: str, client_ip: str) -> bool:
            self.seen = (token, client_ip)
            return token == "good"

    from dependency_injector import providers
    from http_support import TestClient, TestServer, container_for

    from tradecore_adapters.http import runner_options
    from tradecore_entrypoints.container import make_app

    captcha = Refusing()
    settings = Settings(captcha_enabled=True, turnstile_secret="s")
    container = container_for(settings, FakeClock())
    container.shared.captcha.override(providers.Object(captcha))
    server = TestServer(make_app(container))
    await server.start_server(**runner_options())
    async with TestClient(server) as client:
        system = container.services.system()
        await system.provisioning.create_user("ada@example.com", PASSWORD, plan=Plan.PRO)
        creds = {"email": "ada@example.com", "password": PASSWORD}
        assert (await client.post("/auth/login", json=creds)).status == 400
        refused = await client.post("/auth/login", json={**creds, "turnstile_token": "bad"})
        assert refused.status == 403
        assert captcha.seen == ("bad", "127.0.0.1")
        accepted = await client.post("/auth/login", json={**creds, "turnstile_token": "good"})
        assert accepted.status == 200


async def test_register_answers_a_new_and_a_taken_address_alike(env: Env) -> None:
    new = await env.client.post(
        "/auth/register", json={"email": "new@example.com", "password": PASSWORD}
    )
    taken = await env.client.post(
        "/auth/register", json={"email": "NEW@example.com", "password": "another password 1"}
    )
    for response in (new, taken):
        assert response.status == 202
        assert await response.json() == {"detail": "Check your mail to continue"}
        assert "Set-Cookie" not in response.headers  # nobody is signed in by registering
    session = await login(env.client, "new@example.com")  # the first password holds
    me = await (await session.request("GET", "/auth/me", csrf=False)).json()
    assert me["user"]["plan"] == "free"
    assert me["user"]["terms_accepted"] is False
    weak = await env.client.post("/auth/register", json={"email": "w@example.com", "password": "x"})
    assert weak.status == 400


async def test_me_and_accept_terms(env: Env) -> None:
    await env.trader(terms=None)
    session = await login(env.client, "ada@example.com")
    me = await (await session.request("GET", "/auth/me", csrf=False)).json()
    assert me["user"]["terms_accepted"] is False
    wrong = await session.request("POST", "/auth/accept-terms", json={"version": "0"})
    assert wrong.status == 400
    accepted = await session.request("POST", "/auth/accept-terms", json={"version": "1"})
    assert accepted.status == 204
    me = await (await session.request("GET", "/auth/me", csrf=False)).json()
    assert me["user"]["terms_accepted"] is True


async def test_me_without_credentials_is_401_with_www_authenticate(env: Env) -> None:
    response = await env.client.get("/auth/me")
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_expired_subscription_shows_the_free_plan(env: Env) -> None:
    import attrs

    trader = await env.trader()
    expiring = attrs.evolve(
        trader.user, subscription_expires_at=env.clock.now() + timedelta(hours=1)
    )
    assert await env.system.users.save(expiring, previous=trader.user)
    session = await login(env.client, "ada@example.com")
    env.clock.advance(2 * 3600)
    refreshed = await env.client.post("/auth/silent-refresh", headers=session.headers(refresh=True))
    session.absorb(refreshed)
    me = await (await session.request("GET", "/auth/me", csrf=False)).json()
    assert me["user"]["plan"] == "free"


async def test_silent_refresh_rotates_and_detects_reuse(env: Env) -> None:
    await env.trader()
    session = await login(env.client, "ada@example.com")
    old_cookie = session.cookie_header(refresh=True)
    env.clock.advance(60)
    response = await env.client.post("/auth/silent-refresh", headers={"Cookie": old_cookie})
    assert response.status == 200
    body = await response.json()
    assert body["csrf_token"] == session.csrf_token
    session.absorb(response)
    assert session.cookie_header(refresh=True) != old_cookie
    # the already-rotated token comes back after the grace: the session is revoked
    env.clock.advance(REFRESH_REUSE_GRACE.total_seconds())
    reused = await env.client.post("/auth/silent-refresh", headers={"Cookie": old_cookie})
    assert reused.status == 401
    assert cookies_of(reused)["access_token"]["max-age"] == "0"
    assert env.last_audit().entry.action is AuditAction.REFRESH_TOKEN_REUSE
    me = await session.request("GET", "/auth/me", csrf=False)
    assert me.status == 401


async def test_two_tabs_refreshing_at_once_both_stay_signed_in(env: Env) -> None:
    await env.trader()
    session = await login(env.client, "ada@example.com")
    env.clock.advance(31 * 60)
    cookie = {"Cookie": session.cookie_header(refresh=True)}
    first, second = await asyncio.gather(
        env.client.post("/auth/silent-refresh", headers=cookie),
        env.client.post("/auth/silent-refresh", headers=cookie),
    )
    assert (first.status, second.status) == (200, 200)
    assert await first.json() == await second.json()
    assert (await first.json())["csrf_token"] == session.csrf_token
    jars = [cookies_of(r) for r in (first, second)]
    for name in ("access_token", "refresh_token"):
        assert jars[0][name].value == jars[1][name].value
    session.absorb(second)
    assert (await session.request("GET", "/auth/me", csrf=False)).status == 200
    env.clock.advance(60)
    again = await env.client.post("/auth/silent-refresh", headers=session.headers(refresh=True))
    assert again.status == 200
    assert env.last_audit().entry.action is AuditAction.TOKEN_REFRESH


async def test_access_token_expires_after_its_lifetime(env: Env) -> None:
    await env.trader()
    session = await login(env.client, "ada@example.com")
    env.clock.advance(31 * 60)
    assert (await session.request("GET", "/auth/me", csrf=False)).status == 401
    refreshed = await env.client.post("/auth/silent-refresh", headers=session.headers(refresh=True))
    assert refreshed.status == 200
    session.absorb(refreshed)
    assert (await session.request("GET", "/auth/me", csrf=False)).status == 200


async def test_silent_refresh_without_cookie_is_401(env: Env) -> None:
    assert (await env.client.post("/auth/silent-refresh")).status == 401


async def test_logout_needs_csrf_and_ends_the_session(env: Env) -> None:
    await env.trader()
    session = await login(env.client, "ada@example.com")
    refused = await session.request("POST", "/auth/logout", csrf=False)
    assert refused.status == 403
    response = await session.request("POST", "/auth/logout")
    assert response.status == 204
    assert cookies_of(response)["access_token"]["max-age"] == "0"
    assert (await session.request("GET", "/auth/me", csrf=False)).status == 401
    refresh = await env.client.post("/auth/silent-refresh", headers=session.headers(refresh=True))
    assert refresh.status == 401


async def test_administrative_revocation_ends_every_session(env: Env) -> None:
    await env.trader()
    first = await login(env.client, "ada@example.com")
    second = await login(env.client, "ada@example.com")
    result = await admin_revoke_sessions(env.container, "ada@example.com")
    assert result["sessions_revoked"] == 2
    for session in (first, second):
        assert (await session.request("GET", "/auth/me", csrf=False)).status == 401


async def test_token_endpoint_password_and_refresh_grants(env: Env) -> None:
    await env.trader()
    response = await env.client.post(
        "/auth/token",
        data={"grant_type": "password", "username": "ada@example.com", "password": PASSWORD},
    )
    assert response.status == 200
    tokens = await response.json()
    assert tokens["token_type"] == "bearer"
    assert tokens["expires_in"] == pytest.approx(1800, abs=1)
    bearer = {"Authorization": f"Bearer {tokens['access_token']}"}
    assert (await env.client.get("/auth/me", headers=bearer)).status == 200
    # a bearer token needs no CSRF header, even on unsafe methods
    accepted = await env.client.post("/auth/accept-terms", json={"version": "1"}, headers=bearer)
    assert accepted.status == 204
    refreshed = await env.client.post(
        "/auth/token",
        data={"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]},
    )
    assert refreshed.status == 200
    wrong = await env.client.post(
        "/auth/token",
        data={"grant_type": "password", "username": "ada@example.com", "password": "nope"},
    )
    assert wrong.status == 401
    unsupported = await env.client.post("/auth/token", data={"grant_type": "client_credentials"})
    assert unsupported.status == 400
    as_json = await env.client.post("/auth/token", json={"grant_type": "password"})
    assert as_json.status == 415


async def test_forgot_and_reset_password(env: Env) -> None:
    await env.trader()
    unknown = await env.client.post("/auth/forgot-password", json={"email": "no@example.com"})
    known = await env.client.post("/auth/forgot-password", json={"email": "ada@example.com"})
    assert unknown.status == known.status == 202
    assert await unknown.json() == await known.json()
    password_reset = env.container.services.password_reset()
    await password_reset.drain()
    mail = env.system.outbox.sent[-1]
    token = re.search(r"#token=([A-Za-z0-9_-]+)", mail.text)
    assert token is not None
    session = await login(env.client, "ada@example.com")
    new_password = "another long passphrase"
    reset = await env.client.post(
        "/auth/reset-password", json={"token": token.group(1), "password": new_password}
    )
    assert reset.status == 204
    assert (await session.request("GET", "/auth/me", csrf=False)).status == 401
    again = await env.client.post(
        "/auth/reset-password", json={"token": token.group(1), "password": new_password}
    )
    assert again.status == 400
    await login(env.client, "ada@example.com", new_password)


async def test_public_key_is_a_jwk(env: Env) -> None:
    response = await env.client.get("/auth/public-key")
    assert response.status == 200
    key = await response.json()
    assert key["kty"] == "RSA" and key["alg"] == "RSA-OAEP-256"
    assert "d" not in key  # never the private exponent
