"""Input that used to reach a store and fail there (issue 16, 1) is a 4xx before any store:
extreme dates in the history cursor, and NUL characters, which Postgres refuses in text."""

from __future__ import annotations

import pytest
from http_support import Env, Session, Trader, login


@pytest.fixture
async def session(env: Env, trader: Trader) -> Session:
    return await login(env.client, trader.user.email)


@pytest.mark.parametrize(
    "before",
    [
        "9999-12-31T23:59:59.999999",  # its bound, one tick later, does not exist
        "9999-12-31T23:59:59-01:00",  # its UTC form is beyond the calendar
        "0001-01-01T00:00:00+01:00",
    ],
)
async def test_an_extreme_history_cursor_is_400(session: Session, before: str) -> None:
    response = await session.request("GET", "/trading/orders", params={"before": before})
    assert response.status == 400
    assert (await response.json())["code"] == "invalid_request"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/trading/orders/abc%00"),
        ("GET", "/trading/accounts/x%00y"),
        ("DELETE", "/settings/api-keys/x%00"),
        ("GET", "/trading/orders?trading_account_id=a%00b"),
    ],
)
async def test_a_nul_in_the_path_or_query_is_400(session: Session, method: str, path: str) -> None:
    response = await session.request(method, path)
    assert response.status == 400
    assert (await response.json())["code"] == "invalid_request"


async def test_a_nul_in_a_json_string_is_400_and_changes_nothing(
    env: Env, trader: Trader, session: Session
) -> None:
    before = await session.request("GET", "/trading/accounts")
    for body in (
        '{"name": "Main\\u0000", "broker": "paper"}',
        '{"name": "Main", "credentials": {"api_key\\u0000": "x"}}',
    ):
        response = await session.request(
            "POST", "/trading/accounts", data=body, headers={"Content-Type": "application/json"}
        )
        assert response.status == 400
        assert "NUL" in (await response.json())["detail"]
    after = await session.request("GET", "/trading/accounts")
    assert await after.json() == await before.json()


async def test_a_method_a_path_does_not_take_is_405_with_a_code(env: Env) -> None:
    response = await env.client.request("PUT", "/health/ready")
    assert response.status == 405
    problem = await response.json()
    assert (problem["code"], problem["type"]) == (
        "method_not_allowed",
        "urn:tradecore:problem:method_not_allowed",
    )
