"""Accessibility by contract: every page passes axe-core without a violation of serious or
critical impact, and logging in works from the keyboard alone. Each test fails on any console
error, page error or CSP violation (the ``page`` fixture); axe runs in Playwright's evaluation
context, which the page's CSP does not govern."""

from __future__ import annotations

import re
from typing import Any

from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Page, expect

from browser.support import PASSWORD, LiveApp, log_in

BLOCKING_IMPACTS = ("serious", "critical")


async def _violations(page: Page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now, in words."""
    results = await Axe().run(page)
    assert results.response["testEngine"]["name"] == "axe-core"  # it ran on this page
    found: list[dict[str, Any]] = results.response["violations"]
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at "
        + ", ".join(str(node["target"]) for node in v["nodes"])
        for v in found
        if v["impact"] in BLOCKING_IMPACTS
    ]


async def test_every_page_passes_axe_core(live: LiveApp, page: Page) -> None:
    user = await live.user()
    new = await live.system.provisioning.create_account(user, "Main", credentials_verified=True)
    account_id = new.account.id
    signed_out = ["/ui/login", "/ui/register", "/ui/forgot-password", "/reset-password"]
    problems: dict[str, list[str]] = {}
    for path in signed_out:
        await page.goto(path)
        problems[path] = await _violations(page)

    await log_in(page)
    await page.get_by_role("link", name="Manual order").click()
    await expect(page.locator("#symbol-list option[value='BTCUSDT']")).to_have_count(1)
    await page.get_by_label("Symbol").fill("BTCUSDT")
    await page.get_by_label("Quantity").fill("1")
    await page.get_by_role("button", name="Place order").click()
    await expect(page.locator("#order-result .order-status")).to_have_attribute(
        "data-status", "filled"
    )
    problems["/ui/order (after an order)"] = await _violations(page)
    [order] = await live.system.orders.list_for_user(user.id, limit=1)

    signed_in = [
        "/ui/accounts",
        f"/ui/accounts/{account_id}",
        "/ui/orders",
        f"/ui/orders/{order.id}",
        "/ui/alerts",
        "/ui/settings/security",
        "/ui/settings/api-keys",
        "/ui/terms",
    ]
    for path in signed_in:
        await page.goto(path)
        await expect(page.locator("main h1")).to_be_visible()
        problems[path] = await _violations(page)
    assert {path: found for path, found in problems.items() if found} == {}


async def test_logging_in_from_the_keyboard_alone(live: LiveApp, page: Page) -> None:
    await live.user()
    await page.goto("/ui/login")
    await expect(page.get_by_label("Email", exact=True)).to_be_focused()
    await page.keyboard.type("ada@example.com")
    await page.keyboard.press("Tab")
    await expect(page.get_by_label("Password")).to_be_focused()
    await page.keyboard.type(PASSWORD)
    await page.keyboard.press("Tab")
    await expect(page.get_by_role("button", name="Log in")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(r"/ui/accounts$"))
    await expect(page.get_by_role("heading", name="Trading accounts")).to_be_visible()
