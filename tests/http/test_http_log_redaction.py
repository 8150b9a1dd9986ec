"""Secrets through the real request paths never reach a written log line, in either format:
a webhook's URL token and body secret, a login's password, the session's cookies, CSRF token
and bearer token, an API key, and broker credentials in a failed verification."""

from __future__ import annotations

from typing import Any

import pytest
from http_support import PASSWORD, Session, login
from log_support import bearer_token, served

from log_capture import FORMATS, captured_logs
from tradecore_entrypoints.logs import LogFormat

CREDENTIALS = {"api_key": "AKIA-log-key-4242", "api_secret": "hush-log-secret-1618"}
SIGNATURE = "5f2b8e0c0ffee1d2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f80912"


def assert_absent(text: str, secrets: list[str]) -> None:
    leaked = [secret for secret in secrets if secret in text]
    assert leaked == [], leaked


class LeakyVenue:
    """A venue client whose failures quote the signed request, as SDK errors do."""

    async def verify(self, account: object, credentials: dict[str, str]) -> str | None:
        raise RuntimeError(
            "401 GET https://api.venue.test/api/v3/account?timestamp=1&signature="
            f"{SIGNATURE} headers={{'X-MBX-APIKEY': '{credentials['api_key']}'}} "
            f"api_secret={credentials['api_secret']}"
        )

    async def positions(self, account: object) -> dict[str, object]:
        return {}


@pytest.mark.parametrize("log_format", FORMATS)
async def test_a_webhook_token_and_secret_are_never_written(log_format: LogFormat) -> None:
    with captured_logs(log_format) as logs:
        async with served() as env:
            trader = await env.trader()
            assert (await trader.webhook()).status == 200
            assert (await trader.webhook(trader.body(secret="wrong"))).status == 401
            await env.client.post(f"/webhook/{trader.account.webhook_token}/elsewhere", json={})
            await env.client.post(f"/webhook/{trader.account.webhook_token}", data=b"{")

    assert logs.text.count("/webhook/<token>/order") >= 2
    assert_absent(logs.text, [trader.account.webhook_token, trader.account.webhook_secret])


@pytest.mark.parametrize("log_format", FORMATS)
async def test_passwords_and_session_secrets_are_never_written(log_format: LogFormat) -> None:
    with captured_logs(log_format) as logs:
        async with served() as env:
            trader = await env.trader()
            wrong = "not-the-password-" + PASSWORD[::-1]
            refused = await env.client.post(
                "/auth/login", json={"email": trader.user.email, "password": wrong}
            )
            assert refused.status == 401
            grant = await env.client.post(
                "/auth/token",
                data={"grant_type": "password", "username": trader.user.email, "password": wrong},
            )
            assert grant.status in (400, 401)
            session = await login(env.client, trader.user.email)
            token = await bearer_token(env)
            key = await api_key(session)
            for headers in (
                session.headers(),
                {"Authorization": f"Bearer {token}"},
                {"Authorization": f"Bearer {key}"},
            ):
                response = await env.client.get("/trading/accounts", headers=headers)
                assert response.status == 200
            logout = await session.request("POST", "/auth/logout")
            assert logout.status < 300

    secrets = [wrong, PASSWORD, token, key, session.csrf_token, *session.cookies.values()]
    assert_absent(logs.text, secrets)
    assert "/auth/login" in logs.text  # the requests were logged, without their secrets


@pytest.mark.parametrize("log_format", FORMATS)
async def test_broker_credentials_in_a_failed_verification_are_never_written(
    log_format: LogFormat,
) -> None:
    with captured_logs(log_format) as logs:
        async with served(account_broker=LeakyVenue()) as env:
            trader = await env.trader()
            session = await login(env.client, trader.user.email)
            created = await session.request(
                "POST", "/trading/accounts", json={"name": "Venue", "credentials": CREDENTIALS}
            )
            assert created.status == 201, await created.text()
            account_id = (await created.json())["account"]["id"]
            verified = await session.request(
                "POST", f"/trading/accounts/{account_id}/verify-credentials"
            )
            assert verified.status == 500

    assert "RuntimeError: 401 GET https://api.venue.test/api/v3/account" in logs.text
    assert_absent(logs.text, [*CREDENTIALS.values(), SIGNATURE])


async def api_key(session: Session) -> str:
    response = await session.request("POST", "/settings/api-keys", json={"name": "bot"})
    assert response.status == 201, await response.text()
    body: dict[str, Any] = await response.json()
    key: str = body["key"]
    return key
