"""Request ids: taken from the edge when valid or made, returned in ``X-Request-ID``, and on
every log line of the request; an order followed by its ids from the webhook to the fill."""

from __future__ import annotations

import re

import pytest
from http_support import Env
from log_support import bearer_token, served

from log_capture import FORMATS, captured_logs
from tradecore_entrypoints.logs import LogFormat

MADE = re.compile(r"[0-9a-f]{32}")


async def test_a_valid_incoming_request_id_is_returned(env: Env) -> None:
    for presented in ("edge-7f3a", "a" * 128, "Root.1:2_3-4"):
        response = await env.client.get("/health", headers={"X-Request-ID": presented})
        assert response.headers["X-Request-ID"] == presented


@pytest.mark.parametrize(
    "presented",
    ["", "a" * 129, "two words", "line\\nbreak", "<script>", "caf\u00e9"],
)
async def test_an_invalid_request_id_is_replaced(env: Env, presented: str) -> None:
    response = await env.client.get(
        "/health", headers={"X-Request-ID": presented.encode("utf-8").decode("latin-1")}
    )
    assert response.status == 200
    assert MADE.fullmatch(response.headers["X-Request-ID"])


async def test_a_request_without_one_gets_a_new_one_each_time(env: Env) -> None:
    first = await env.client.get("/health")
    second = await env.client.get("/health")
    ids = {first.headers["X-Request-ID"], second.headers["X-Request-ID"]}
    assert len(ids) == 2 and all(MADE.fullmatch(i) for i in ids)


async def test_two_request_ids_are_one_too_many(env: Env) -> None:
    response = await env.client.get(
        "/health", headers=[("X-Request-ID", "one"), ("X-Request-ID", "two")]
    )
    assert MADE.fullmatch(response.headers["X-Request-ID"])


async def test_refusals_carry_the_request_id_too(env: Env) -> None:
    headers = {"X-Request-ID": "edge-404"}
    missing = await env.client.get("/no/such/page", headers=headers)
    refused = await env.client.get("/trading/orders", headers=headers)
    assert (missing.status, refused.status) == (404, 401)
    assert missing.headers["X-Request-ID"] == refused.headers["X-Request-ID"] == "edge-404"


@pytest.mark.parametrize("log_format", FORMATS)
async def test_every_line_of_a_request_carries_its_id_and_its_user(
    log_format: LogFormat,
) -> None:
    """A request that fails inside its handler writes an error line and an access line: both
    name the request and the user it was authenticated as."""

    class Exploding:
        async def get(self, order_id: str) -> None:
            raise RuntimeError("the store fell over")

    # aiohttp decides per connection whether it keeps an access log: capture from the start
    with captured_logs(log_format) as logs:
        async with served(orders=Exploding()) as env:
            trader = await env.trader()
            token = await bearer_token(env)
            response = await env.client.get(
                "/trading/orders/abc",
                headers={"Authorization": f"Bearer {token}", "X-Request-ID": "edge-500"},
            )
            assert response.status == 500

    if log_format == "json":
        error = logs.matching(logger="tradecore.http")
        access = logs.matching(logger="aiohttp.access", path="/trading/orders/abc")
        assert len(error) == 1 and len(access) == 1
        assert error[0]["message"] == "unhandled error on GET /trading/orders/abc"
        assert error[0]["exception"].endswith("RuntimeError: the store fell over")
        assert access[0]["status"] == 500
        for line in error + access:
            assert (line["request_id"], line["user_id"]) == ("edge-500", trader.user.id)
        assert logs.matching(request_id="edge-500") == error + access
    else:
        written = [line for line in logs.text.splitlines() if "edge-500" in line]
        assert len(written) == 2
        assert "unhandled error on GET /trading/orders/abc" in written[0]
        assert '"GET /trading/orders/abc" 500' in written[1]
        for line in written:
            assert "request_id=edge-500" in line and f"user_id={trader.user.id}" in line


@pytest.mark.parametrize("log_format", FORMATS)
async def test_an_order_is_followed_from_the_webhook_to_the_fill(log_format: LogFormat) -> None:
    with captured_logs(log_format) as logs:
        async with served() as env:
            trader = await env.trader()
            response = await trader.webhook(headers={"X-Request-ID": "tv-alert-1"})
            assert response.status == 200
            order_id = (await response.json())["order_id"]
            env.clock.advance(3)  # the first fill check is due 2-3 s after placement
            decision = await env.system.verifier.run_once(0)
            assert decision is not None and decision.order_status is not None

    ids = {
        "user_id": trader.user.id,
        "account_id": trader.account.account.id,
        "order_id": order_id,
    }
    if log_format == "json":
        access = logs.matching(logger="aiohttp.access", request_id="tv-alert-1", **ids)
        executed = logs.matching(message=f"order {order_id} executed: filled", **ids)
        checked = logs.matching(message=f"order {order_id}: fill check 1: filled", **ids)
        assert len(access) == len(executed) == len(checked) == 1
        assert access[0]["path"] == "/webhook/<token>/order"
        assert executed[0]["request_id"] == "tv-alert-1"  # carried in the queued order
        assert executed[0]["logger"] == "tradecore.services.execution.worker"
    else:
        wanted = ("/webhook/<token>/order", "executed: filled", "fill check 1: filled")
        for fragment in wanted:
            (line,) = [line for line in logs.text.splitlines() if fragment in line]
            assert all(f"{name}={value}" in line for name, value in ids.items()), line
