"""Settings > Security pages through its recent events, in a real browser; a bad page number is
refused in words."""

from __future__ import annotations

import aiohttp
from playwright.async_api import Page, expect

from browser.support import LiveApp, Shot, log_in
from tradecore.audit import AuditAction, RequestContext

EVENTS = 25  # one full page of 20 and five more


async def _attacks(live: LiveApp, user_id: str, account_id: str) -> None:
    """``EVENTS`` stale webhooks against the account, the n-th from 203.0.113.n."""
    for n in range(1, EVENTS + 1):
        context = RequestContext(
            ip_address=f"203.0.113.{n}",
            user_agent="TradingView-Webhook",
            request_path="/webhook/<token>/order",
            request_method="POST",
        )
        await live.system.events.record(
            AuditAction.WEBHOOK_TIMESTAMP_EXPIRED,
            context,
            user_id=user_id,
            success=False,
            metadata={"trading_account_id": account_id},
        )


async def test_the_recent_events_page_from_newest_to_oldest(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    user = await live.user()
    account = await live.system.provisioning.create_account(user, "Main")
    await _attacks(live, user.id, account.account.id)
    await log_in(page)
    await page.get_by_role("link", name="Security").click()

    rows = page.locator("table.events tbody tr")
    await expect(rows).to_have_count(20)
    await expect(rows.first).to_contain_text(f"203.0.113.{EVENTS}")
    await expect(rows.first).to_contain_text("Main")
    await expect(page.locator("#security-page")).to_have_text(
        f"{EVENTS} events in all; page 1 of 2."
    )
    await expect(page.get_by_role("link", name="Newer events")).to_have_count(0)
    await shot(page, "security-paged")

    await page.get_by_role("link", name="Older events").click()
    await expect(rows).to_have_count(EVENTS - 20)
    await expect(rows.first).to_contain_text("203.0.113.5")
    await expect(rows.last).to_contain_text("203.0.113.1")
    await expect(page.locator("#security-page")).to_contain_text("page 2 of 2")
    await expect(page.get_by_role("link", name="Older events")).to_have_count(0)
    await expect(page.locator("table.counts")).to_contain_text(str(EVENTS))

    await page.get_by_role("link", name="Newer events").click()
    await expect(rows.first).to_contain_text(f"203.0.113.{EVENTS}")


async def test_a_bad_page_number_is_refused_in_words(live: LiveApp, page: Page) -> None:
    await live.user()
    await log_in(page)
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    async with (
        aiohttp.ClientSession(cookies=cookies) as client,
        client.get(f"{live.base_url}/ui/settings/security?page=zero") as response,
    ):
        assert response.status == 400
        text = await response.text()
    assert 'role="alert"' in text
    assert "page" in text.split('role="alert">', 1)[1].split("</p>", 1)[0]
