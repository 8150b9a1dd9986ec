"""What the browser tests share besides fixtures: the served app and the clock it reads, the
test user's password, the screenshot helper's type and logging in through the page."""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
from playwright.async_api import Page, expect

from tradecore.identity import Plan, User
from tradecore_entrypoints.system import System

PASSWORD = "correct horse battery staple"

Shot = Callable[[Page, str], Coroutine[Any, Any, Path]]


@attrs.define
class ShiftedClock:
    """The app's clock: the real time plus ``offset``, which only ``advance`` changes. A test
    moves the service's time ahead (an access token expires) while everything that waits
    (the browser, the workers, asyncio) keeps real time."""

    offset: timedelta = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, by: timedelta) -> None:
        self.offset += by


@attrs.define
class LiveApp:
    """The app on ``base_url``, its embedded system and the clock it reads."""

    base_url: str
    system: System
    clock: ShiftedClock = attrs.field(factory=ShiftedClock)

    async def user(self, email: str = "ada@example.com", *, terms: str | None = "1") -> User:
        return await self.system.provisioning.create_user(
            email, PASSWORD, plan=Plan.PRO, terms_version=terms
        )


async def log_in(page: Page, email: str = "ada@example.com") -> None:
    await page.goto("/")
    await expect(page).to_have_url(re.compile(r"/ui/login$"))
    await page.get_by_label("Email", exact=True).fill(email)
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("heading", name="Trading accounts")).to_be_visible()
