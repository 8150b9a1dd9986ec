"""The webhook owner cache across real API processes: a change made through one API process
is refused by another at once, although the other caches owners for an hour.

Both API processes run with ``WEBHOOK_OWNER_CACHE_TTL_S`` of an hour, so nothing but the
announcement (Redis pub/sub) can make the second one see a change within the test's wait. The
test first shows that the second process does serve from its cache: an account deleted straight
in Postgres (announced to nobody) still works there.
"""

from __future__ import annotations

import asyncio

import pytest
from harness import Account, Api, Stack, eventually, webhook_body

pytestmark = pytest.mark.faults

CACHING = {"WEBHOOK_OWNER_CACHE_TTL_S": "3600", "RATE_LIMIT_PER_MINUTE": "100000"}
ANNOUNCED_WITHIN_S = 10.0
"""A generous bound on the wait (an hour less than the TTL), not the measured latency."""


async def delete_behind_its_back(stack: Stack, account: Account) -> None:
    """Delete the account straight in Postgres: no API process is told."""
    await stack.db.rows(
        "UPDATE trading_accounts SET deleted = true WHERE id = %s RETURNING id",
        account.trading_account_id,
    )


async def status(api: Api, account: Account) -> int:
    return (await api.webhook(account, webhook_body(account), simulation=True)).status


async def test_a_change_through_one_api_process_is_refused_by_another_at_once(
    stack: Stack,
) -> None:
    first, second, _, account = await asyncio.gather(
        stack.api(**CACHING), stack.api(**CACHING), stack.worker(), stack.new_account()
    )

    async def second_serves_from_its_cache() -> bool:
        # once the second process's subscription is confirmed it keeps what it looked up, so
        # a deletion nobody announced stays unseen by it
        probe = await stack.new_account()
        await status(second, probe)
        await delete_behind_its_back(stack, probe)
        return await status(second, probe) == 200

    await eventually(second_serves_from_its_cache, "the second API process to cache owners")
    assert await status(second, account) == 200

    browser = await first.browser(stack.trader.email)
    added = await first.as_browser(
        browser, "POST", "/settings/allowed-ips", json={"ip_address": "192.0.2.1"}
    )
    assert added.status == 201, added

    async def refused(code: int, on: Account = account) -> bool:
        return await status(second, on) == code

    await eventually(
        lambda: refused(403),
        "the IP block to reach the second process",
        timeout_s=ANNOUNCED_WITHIN_S,
    )

    removed = await first.as_browser(browser, "DELETE", f"/settings/allowed-ips/{added.body['id']}")
    assert removed.status == 204, removed
    await eventually(
        lambda: refused(200), "the IP unblock to reach it", timeout_s=ANNOUNCED_WITHIN_S
    )

    rotated = await first.as_browser(
        browser, "POST", f"/trading/accounts/{account.trading_account_id}/webhook-token"
    )
    assert rotated.status == 200, rotated
    await eventually(
        lambda: refused(404), "the old token to be refused there", timeout_s=ANNOUNCED_WITHIN_S
    )
    token = str(rotated.body["webhook_url"]).removesuffix("/order").rpartition("/webhook/")[2]
    renewed = Account(account.trading_account_id, token, account.webhook_secret)
    assert await status(second, renewed) == 200
