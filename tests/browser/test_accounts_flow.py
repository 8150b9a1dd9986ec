"""Registration, the terms page and the password reset in a real browser. Each test fails on
any console error, page error or CSP violation (the ``page`` fixture)."""

from __future__ import annotations

import asyncio
import re

from playwright.async_api import Page, expect

from browser.support import PASSWORD, LiveApp, Shot
from tradecore.ports.identity import MailMessage

NEW_PASSWORD = "another horse battery staple"


async def _mails(live: LiveApp) -> list[MailMessage]:
    """The outbox once the reset mail (sent in the background) is there, at most 5 s on."""
    for _ in range(250):
        if live.system.outbox.sent:
            break
        await asyncio.sleep(0.02)
    return list(live.system.outbox.sent)


async def test_a_new_user_registers_accepts_the_terms_and_lands_on_the_accounts(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    await page.goto("/ui/login")
    await page.get_by_role("link", name="Create an account").click()
    await expect(page).to_have_url(re.compile(r"/ui/register$"))
    await page.get_by_label("Email", exact=True).fill("grace@example.com")
    await page.get_by_label("Password (8 characters or more)").fill(PASSWORD)
    await page.get_by_label("Password again").fill("not the same password")
    await page.get_by_role("button", name="Create account").click()
    await expect(page.get_by_role("alert")).to_have_text("The passwords differ")
    await page.get_by_label("Password (8 characters or more)").fill(PASSWORD)
    await page.get_by_label("Password again").fill(PASSWORD)
    await shot(page, "register")
    await page.get_by_role("button", name="Create account").click()
    # Registering signs nobody in (a new and a taken address are answered alike): log in.
    await expect(page.get_by_role("status")).to_contain_text("Check your mail to continue")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Log in").click()

    await expect(page).to_have_url(re.compile(r"/ui/terms$"))
    await expect(page.get_by_role("heading", name="Terms of service")).to_be_visible()
    await expect(page.locator("#terms-banner")).to_have_count(0)
    await shot(page, "terms")
    await page.get_by_role("button", name="Accept the terms").click()
    await expect(page).to_have_url(re.compile(r"/ui/accounts$"))
    await expect(page.get_by_role("heading", name="Trading accounts")).to_be_visible()
    await expect(page.locator("#terms-banner")).to_have_count(0)
    await expect(page.get_by_text("grace@example.com")).to_be_visible()
    user = await live.system.users.by_email("grace@example.com")
    assert user is not None
    assert user.accepted_terms_version == "1"

    await page.get_by_role("button", name="Log out").click()
    await expect(page).to_have_url(re.compile(r"/ui/login$"))
    await page.goto("/ui/register")
    await page.get_by_label("Email", exact=True).fill("grace@example.com")
    await page.get_by_label("Password (8 characters or more)").fill(PASSWORD)
    await page.get_by_label("Password again").fill(PASSWORD)
    await page.get_by_role("button", name="Create account").click()
    await expect(page.get_by_role("status")).to_contain_text("Check your mail to continue")
    await expect(page.get_by_role("alert")).to_have_count(0)


async def test_a_forgotten_password_is_reset_through_the_mailed_link(
    live: LiveApp, page: Page, shot: Shot
) -> None:
    await live.user()
    await page.goto("/ui/login")
    await page.get_by_role("link", name="Forgot your password?").click()
    await page.get_by_label("Email", exact=True).fill("ada@example.com")
    await page.get_by_role("button", name="Send a reset link").click()
    await expect(page.get_by_role("status")).to_contain_text("a reset link is on its way")
    await shot(page, "forgot-password")
    [mail] = await _mails(live)
    link = re.search(r"http\S+/reset-password#token=\S+", mail.text)
    assert link is not None

    await page.goto(link.group(0))
    await expect(page.locator("input[name=token]")).not_to_have_value("")
    assert "#" not in page.url
    await page.get_by_label("New password (8 characters or more)").fill(NEW_PASSWORD)
    await page.get_by_label("New password again").fill(NEW_PASSWORD)
    await shot(page, "reset-password")
    await page.get_by_role("button", name="Change the password").click()
    await expect(page).to_have_url(re.compile(r"/reset-password$"))
    await expect(page.get_by_role("status")).to_contain_text("Your password was changed")
    await page.get_by_label("Email", exact=True).fill("ada@example.com")
    await page.get_by_label("Password").fill(NEW_PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("heading", name="Trading accounts")).to_be_visible()

    await page.goto(link.group(0))
    await page.get_by_label("New password (8 characters or more)").fill(PASSWORD)
    await page.get_by_label("New password again").fill(PASSWORD)
    await page.get_by_role("button", name="Change the password").click()
    await expect(page.get_by_role("alert")).to_contain_text("invalid or has expired")
