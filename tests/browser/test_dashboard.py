"""The dashboard in a real browser: Debian's Chromium, driven by Playwright, against the app on
the embedded runtime. Each test fails on any console error, page error or CSP violation (the
``page`` fixture)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import aiohttp
from playwright.async_api import Page, expect

from browser.support import LiveApp, Shot, log_in


async def test_login_rejects_a_wrong_password_then_logs_in_and_out(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    await live.user()
    await page.goto("/ui/accounts")
    await expect(page).to_have_url(re.compile(r"/ui/login\?next=(/|%2F)ui(/|%2F)accounts$"))
    await page.get_by_label("Email", exact=True).fill("ada@example.com")
    await page.get_by_label("Password").fill("not the password at all")
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("alert")).to_be_visible()
    await shot(page, "login")
    await log_in(page)
    await expect(page.get_by_text("ada@example.com")).to_be_visible()
    await page.get_by_role("button", name="Log out").click()
    await expect(page).to_have_url(re.compile(r"/ui/login$"))
    await page.goto("/ui/orders")
    await expect(page).to_have_url(re.compile(r"/ui/login\?next=(/|%2F)ui(/|%2F)orders$"))


async def test_a_webhook_sent_from_outside_appears_in_the_history_without_a_reload(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    await live.user()
    await log_in(page)
    await page.get_by_label("Name").fill("Paper one")
    await page.get_by_role("button", name="Create account").click()
    url = (await page.locator("#webhook-url").text_content() or "").strip()
    secret = (await page.locator("#webhook-secret").text_content() or "").strip()
    assert url.startswith(live.base_url + "/webhook/") and url.endswith("/order")
    assert secret
    await expect(page.get_by_role("button", name="Copy")).to_have_count(2)
    row = page.locator("tr", has_text="Paper one")
    await expect(row.locator(".verified")).to_have_text("not verified")
    await shot(page, "accounts")
    await row.get_by_role("button", name="Verify credentials").click()
    await expect(row.locator(".verified")).to_have_text("verified")
    await expect(page.locator("#webhook-url")).to_have_count(0)

    await page.get_by_role("link", name="Order history").click()
    await expect(page.get_by_text("No orders")).to_be_visible()
    body = {
        "action": "buy",
        "symbol": "BTCUSDT",
        "quantity": "0.5",
        "timestamp": datetime.now(UTC).isoformat(),
        "secret": secret,
    }
    async with aiohttp.ClientSession() as client, client.post(url, json=body) as response:
        assert response.status in (200, 202), await response.text()
    history_row = page.locator("#history-rows tbody tr").first
    await expect(history_row).to_have_attribute("data-source", "webhook")
    await expect(history_row).to_have_attribute("data-status", "filled")
    await expect(history_row).to_contain_text("BTCUSDT")
    await expect(history_row).to_contain_text("0.5 at")
    await shot(page, "history")


async def test_a_manual_order_fills_and_reports_in_words(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    user = await live.user()
    await live.system.provisioning.create_account(user, "Main", credentials_verified=True)
    await log_in(page)
    await page.get_by_role("link", name="Manual order").click()
    await expect(page.locator("#symbol-list option[value='BTCUSDT']")).to_have_count(1)
    await page.get_by_label("Symbol").fill("BTCUSDT")
    await page.get_by_label("Quantity").fill("2")
    await page.get_by_role("button", name="Place order").click()
    status = page.locator("#order-result .order-status")
    await expect(status).to_have_attribute("data-status", "filled")
    await expect(status).to_contain_text("Filled: 2 at")
    await shot(page, "order")
    await page.get_by_label("Quantity").fill("-1")
    await page.get_by_role("button", name="Place order").click()
    await expect(page.locator("#order-result")).to_contain_text("Order refused: Invalid order")


async def test_an_api_key_is_shown_once_and_revoked(live: LiveApp, page: Page, shot: Shot) -> None:
    await live.user()
    await log_in(page)
    await page.get_by_role("link", name="API keys").click()
    await page.get_by_label("Name").fill("my bot")
    await page.get_by_role("button", name="Create key").click()
    key = (await page.locator("#api-key").text_content() or "").strip()
    assert len(key) > 20
    row = page.locator("tr", has_text="my bot")
    await expect(row.locator(".state")).to_have_text("active")
    await shot(page, "api-keys")
    await row.get_by_role("button", name="Revoke").click()
    await expect(row.locator(".state")).to_have_text("revoked")
    await expect(page.locator("#api-key")).to_have_count(0)
    async with (
        aiohttp.ClientSession() as client,
        client.get(
            live.base_url + "/auth/me", headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        assert response.status == 401


async def test_security_page_counts_an_attack(live: LiveApp, page: Page, shot: Shot) -> None:
    user = await live.user()
    account = await live.system.provisioning.create_account(user, "Main")
    body = {
        "action": "buy",
        "symbol": "BTCUSDT",
        "quantity": 1,
        "timestamp": datetime.now(UTC).isoformat(),
        "secret": "wrong-secret-" + "x" * 20,
    }
    url = f"{live.base_url}/webhook/{account.webhook_token}/order"
    async with aiohttp.ClientSession() as client, client.post(url, json=body) as response:
        assert response.status == 401
    await log_in(page)
    await page.get_by_role("link", name="Security").click()
    await expect(page.locator("table.counts")).to_be_visible()
    await expect(page.locator("table.events tbody tr")).not_to_have_count(0)
    await shot(page, "security")
