"""An access token that expires while a page is open, in a real browser.

The service's clock (``LiveApp.clock``) is moved past the access token's lifetime: the
service then refuses the token while the browser still sends its cookie, which is what
happens when a page stays open longer than the token lives. No test waits for real time.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from playwright.async_api import Page, Request, expect

from browser.support import PASSWORD, LiveApp, Shot, log_in

ACCESS_LIFETIME = timedelta(minutes=30)  # Settings().access_token_minutes
REFRESH_LIFETIME = timedelta(days=30)  # Settings().refresh_token_days


def _posts(page: Page) -> list[str]:
    """The paths of the page's POST requests, in order, from now on."""
    seen: list[str] = []

    def record(request: Request) -> None:
        if request.method == "POST":
            seen.append(re.sub(r"^https?://[^/]+", "", request.url))

    page.on("request", record)
    return seen


async def test_an_expired_access_token_is_renewed_and_the_action_goes_through(
    live: LiveApp, page: Page
) -> None:
    await live.user()
    await log_in(page)
    await page.get_by_role("link", name="API keys").click()
    posts = _posts(page)
    live.clock.advance(ACCESS_LIFETIME + timedelta(minutes=1))

    await page.get_by_label("Name").fill("after a coffee")
    await page.get_by_role("button", name="Create key").click()

    await expect(page.locator("tr", has_text="after a coffee").locator(".state")).to_have_text(
        "active"
    )
    await expect(page.locator("#api-key")).to_be_visible()
    assert posts == [
        "/ui/settings/api-keys",  # refused: the access token has expired
        "/auth/silent-refresh",
        "/ui/settings/api-keys",  # sent again once, with the renewed session
    ]
    await expect(page).to_have_url(re.compile(r"/ui/settings/api-keys$"))


@pytest.mark.refused_request("/auth/silent-refresh", 401)
async def test_a_session_that_cannot_be_renewed_leads_to_the_login_page_and_back(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    await live.user()
    await log_in(page)
    await page.goto("/ui/orders?status=filled")
    posts = _posts(page)
    # The refresh token has run out too: the renewal is refused (a 401 the browser logs as a
    # console error, which the ``page`` fixture lets through for this request only).
    live.clock.advance(REFRESH_LIFETIME + timedelta(minutes=1))

    # The history refreshes itself: its next request meets the expired session.
    await expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Forders%3Fstatus%3Dfilled$"))
    assert posts == ["/auth/silent-refresh"]
    await expect(page.get_by_role("status")).to_contain_text("Your session has ended")
    await shot(page, "login-session-ended")
    await page.get_by_label("Email", exact=True).fill("ada@example.com")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page).to_have_url(re.compile(r"/ui/orders\?status=filled$"))
    await expect(page.get_by_role("heading", name="Order history")).to_be_visible()


async def test_opening_a_page_without_a_session_returns_to_it_after_logging_in(
    live: LiveApp, page: Page
) -> None:
    await live.user()
    await page.goto("/ui/settings/security?page=1")
    await expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    await page.get_by_label("Email", exact=True).fill("ada@example.com")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page).to_have_url(re.compile(r"/ui/settings/security\?page=1$"))
    # Only this site's pages: anything else opens the trading accounts.
    await page.get_by_role("button", name="Log out").click()
    await expect(page).to_have_url(re.compile(r"/ui/login$"))
    await page.goto("/ui/login?next=https://evil.example/ui/x")
    await expect(page.locator("input[name=next]")).to_have_count(0)
    await page.get_by_label("Email", exact=True).fill("ada@example.com")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page).to_have_url(re.compile(r"/ui/accounts$"))
