"""Reading the order history is rate limited per user, in a bucket of its own (issue 16, 9):
a client hammering ``GET /trading/orders`` gets 429 with Retry-After, and neither budget
spends the other."""

from __future__ import annotations

from http_support import Env, Trader, login

from tradecore.services.orders.history_reads import READS_PER_MINUTE


async def test_history_reads_beyond_the_limit_are_429_with_retry_after(
    env: Env, trader: Trader
) -> None:
    session = await login(env.client, trader.user.email)
    for _ in range(READS_PER_MINUTE):
        assert (await session.request("GET", "/trading/orders")).status == 200

    refused = await session.request("GET", "/trading/orders")
    assert refused.status == 429
    assert (await refused.json())["code"] == "rate_limited"
    assert 0 < float(refused.headers["Retry-After"]) <= 60
    assert (await session.request("GET", "/trading/orders/some-id")).status == 429

    # the order budget is its own: a webhook still goes through
    assert (await trader.webhook()).status == 200
    env.clock.advance(61)
    assert (await session.request("GET", "/trading/orders")).status == 200
