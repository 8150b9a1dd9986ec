"""The alert-message builder and the webhook tester in a real browser. Each test fails on any
console error, page error or CSP violation (the ``page`` fixture)."""

from __future__ import annotations

import json

from playwright.async_api import Page, expect

from browser.support import LiveApp, Shot, log_in


async def _message(page: Page) -> dict[str, object]:
    return dict(json.loads(await page.locator("#alert-json").text_content() or ""))


async def test_the_alert_builder_shows_the_message_and_tests_it_as_a_simulation(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    user = await live.user()
    await live.system.provisioning.create_account(user, "Main", credentials_verified=True)
    await log_in(page)
    await page.get_by_role("link", name="Alert builder").click()
    assert await _message(page) == {
        "action": "buy",
        "symbol": "{{ticker}}",
        "quantity": 1,
        "order_type": "entry",
        "timestamp": "{{timenow}}",
        "secret": "PASTE-THE-ACCOUNT-WEBHOOK-SECRET-HERE",
    }
    form = page.locator("#alert-form")
    await form.get_by_label("Action").select_option("sell")
    await expect(page.locator("#alert-json")).to_contain_text('"action": "sell"')
    await form.get_by_label("Quantity").fill("{{strategy.order.contracts}}")
    await expect(page.locator("#alert-json")).to_contain_text(
        '"quantity": "{{strategy.order.contracts}}"'
    )
    await form.get_by_label("Order type").select_option("exit")
    await expect(page.locator("#alert-json")).to_contain_text('"order_type": "exit"')
    message = await _message(page)
    assert message["action"] == "sell"
    assert message["timestamp"] == "{{timenow}}"
    await expect(page.get_by_role("button", name="Copy")).to_be_visible()

    await form.get_by_label("Quantity").fill("-2")
    await expect(page.locator("#alert-message [role=alert]")).to_contain_text("$.quantity")
    await form.get_by_label("Quantity").fill("0.5")
    await expect(page.locator("#alert-message [role=alert]")).to_have_count(0)
    await form.get_by_label("Order type").select_option("entry")
    await expect(page.locator("#alert-json")).to_contain_text('"quantity": 0.5')

    tester = page.locator("#alert-test")
    await tester.get_by_label("Test quantity").fill("3")
    await tester.get_by_role("button", name="Send a test order").click()
    result = page.locator("#alert-test-result")
    await expect(result).to_contain_text("Sell 3 BTCUSDT (simulation)")
    await expect(result.locator(".order-status")).to_have_attribute("data-status", "filled")
    await expect(result).to_contain_text("Filled: 3 at")
    await shot(page, "alerts")

    await tester.get_by_label("Test symbol").fill("NOPE")
    await tester.get_by_role("button", name="Send a test order").click()
    await expect(result.get_by_role("alert")).to_contain_text("Order refused")
