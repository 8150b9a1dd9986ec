"""The dashboard's pictures: after a buy and a reversing sell sent by webhook, the account's
page draws the position per symbol and the orders per day, and the order's page its stages.
Fails on any console error, page error or CSP violation (the ``page`` fixture)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import aiohttp
from playwright.async_api import Page, expect

from browser.support import LiveApp, Shot, log_in


async def _webhook(url: str, secret: str, action: str, quantity: str) -> None:
    body = {
        "action": action,
        "symbol": "BTCUSDT",
        "quantity": quantity,
        "timestamp": datetime.now(UTC).isoformat(),
        "secret": secret,
    }
    async with aiohttp.ClientSession() as client, client.post(url, json=body) as response:
        assert response.status == 200, await response.text()


async def test_the_account_and_order_pages_draw_their_charts(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    user = await live.user()
    new = await live.system.provisioning.create_account(user, "Main", credentials_verified=True)
    url = new.webhook_url(live.base_url)
    await _webhook(url, new.webhook_secret, "buy", "1")
    await _webhook(url, new.webhook_secret, "sell", "2")  # closes the 1, then sells 2

    await log_in(page)
    await page.get_by_role("link", name="Main").click()
    await expect(page.get_by_role("heading", name="Main", exact=True)).to_be_visible()
    position = page.locator("#position-chart")
    await expect(position.locator(".chart-summary")).to_have_text("BTCUSDT: -2 now")
    chart = position.get_by_role("img")
    await expect(chart).to_have_attribute(
        "aria-label", "Position over time per symbol: BTCUSDT: -2 now"
    )
    await expect(chart.locator("path.series")).to_have_count(1)
    orders = page.locator("#orders-chart")
    await expect(orders.locator(".chart-summary")).to_contain_text(
        "2 orders in the last 30 days: 2 filled"
    )
    await expect(orders.locator("rect.bar")).to_have_count(1)
    await shot(page, "charts")

    await page.get_by_role("link", name="its orders").click()
    sell = page.locator("#history-rows tbody tr").first  # newest first: the sell
    await sell.get_by_role("link").first.click()
    await expect(page.get_by_role("heading", name="Order: sell 2 BTCUSDT")).to_be_visible()
    stages = page.locator("#stages-chart")
    for stage in ("received", "queued", "executing", "placed"):  # each measured, in words
        await expect(stages.locator(f"li[data-stage='{stage}']")).to_have_text(
            re.compile(rf"^{stage}: [0-9.]+ (ms|s)$")
        )
    await expect(stages.locator("li[data-stage='admitted']")).to_contain_text("admitted at ")
    await expect(stages.locator("li[data-stage='filled']")).to_contain_text("filled at ")
    await expect(stages.locator("rect.stage")).to_have_count(4)
    await expect(page.locator(".order-fields")).to_contain_text("Automatic close")
    await shot(page, "order-stages")
