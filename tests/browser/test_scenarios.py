"""The issue's remaining browser scenarios: a rotated secret, a replay attack on the security
page, and a slow broker's 202 that turns to filled on screen. Each test fails on any console
error, page error or CSP violation (the ``page`` fixture)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Page, expect

from browser.support import LiveApp, Shot, log_in


def _alert(secret: str, quantity: str = "0.5") -> dict[str, Any]:
    return {
        "action": "buy",
        "symbol": "BTCUSDT",
        "quantity": quantity,
        "timestamp": datetime.now(UTC).isoformat(),
        "secret": secret,
    }


async def _post(url: str, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as client, client.post(url, json=body) as response:
        return response.status


async def test_rotating_the_secret_refuses_the_old_one(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    user = await live.user()
    await live.system.provisioning.create_account(user, "Main", credentials_verified=True)
    await log_in(page)
    # The account was created outside the page: rotate it here to learn its URL and secret.
    row = page.locator("tr", has_text="Main")
    await row.get_by_role("button", name="Rotate URL and secret").click()
    first_url = (await page.locator("#webhook-url").text_content() or "").strip()
    old_secret = (await page.locator("#webhook-secret").text_content() or "").strip()
    assert await _post(first_url, _alert(old_secret)) == 200

    await row.get_by_role("button", name="Rotate URL and secret").click()
    await expect(page.locator("#webhook-url")).not_to_have_text(first_url)
    await expect(page.get_by_role("status")).to_contain_text("the old ones no longer work")
    new_url = (await page.locator("#webhook-url").text_content() or "").strip()
    new_secret = (await page.locator("#webhook-secret").text_content() or "").strip()
    assert new_secret != old_secret
    await shot(page, "rotated")

    assert await _post(new_url, _alert(old_secret, "0.25")) == 401
    assert await _post(first_url, _alert(new_secret, "0.25")) == 404
    assert await _post(new_url, _alert(new_secret, "0.25")) == 200


async def test_a_replayed_alert_appears_on_the_security_page(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    user = await live.user()
    new = await live.system.provisioning.create_account(user, "Main", credentials_verified=True)
    url = new.webhook_url(live.base_url)
    body = _alert(new.webhook_secret)
    assert await _post(url, body) == 200
    assert await _post(url, body) == 409
    await log_in(page)
    await page.get_by_role("link", name="Security").click()
    await expect(page.locator("table.counts")).to_contain_text("webhook replay attack")
    events = page.locator("table.events tbody tr", has_text="webhook replay attack")
    await expect(events).to_have_count(1)
    await expect(events).to_contain_text("/webhook/<token>/order")  # the token is never shown
    await expect(page.locator("h3 + ul")).to_contain_text("Main: 1")
    await shot(page, "security-replay")


@pytest.mark.settings(paper_latency_ms=400, order_wait_s=0.1)
async def test_a_slow_broker_answers_202_then_the_page_shows_the_fill(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    user = await live.user()
    await live.system.provisioning.create_account(user, "Main", credentials_verified=True)
    await log_in(page)
    await page.get_by_role("link", name="Manual order").click()
    await page.get_by_label("Symbol").fill("BTCUSDT")
    await page.get_by_label("Quantity").fill("2")
    async with page.expect_response(
        lambda r: r.url.endswith("/ui/order") and r.request.method == "POST"
    ) as answered:
        await page.get_by_role("button", name="Place order").click()
    first = await (await answered.value).text()
    assert 'data-status="filled"' not in first
    assert "Accepted (202)" in first
    status = page.locator("#order-result .order-status")
    await expect(page.locator("#order-result .queued-note")).to_be_visible()
    await shot(page, "order-queued")
    await expect(status).to_have_attribute("data-status", "filled")
    await expect(status).to_contain_text("Filled: 2 at")
    await expect(status).not_to_contain_text("Updating")
