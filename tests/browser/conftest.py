"""Fixtures for the browser tests: the real app on the embedded runtime served on a loopback
port, and Debian's Chromium driven by Playwright. The app's clock is the real one until a test
moves it ahead (``LiveApp.clock``).

Every page fixture fails its test on a console error, an uncaught page error or a
Content-Security-Policy violation (Chromium reports those on the console as errors too).
Screenshots go to the test's tmp dir (``shot``).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import argon2
import attrs
import pytest
from aiohttp import web
from dependency_injector import providers
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright, expect

from browser.support import LiveApp, ShiftedClock, Shot
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.http import runner_options
from tradecore_entrypoints.container import build_container, make_app
from tradecore_entrypoints.settings import Settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not CHROMIUM.exists():
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)

expect.set_options(timeout=10_000)


def fast_hasher() -> Argon2PasswordHasher:
    return Argon2PasswordHasher(
        hasher=argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "settings(**fields): start the app with Settings(**fields) for this test"
    )
    config.addinivalue_line(
        "markers",
        "refused_request(path, status): the browser logs one answer of this status from this "
        "path as a console error, which the test expects; it is let through once",
    )


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> Settings:
    """The app's settings: ``Settings(**fields)`` of the test's ``settings`` marker. A module
    whose settings depend on other fixtures (a local endpoint's port) overrides this."""
    marker = request.node.get_closest_marker("settings")
    return Settings(**marker.kwargs) if marker else Settings()


@pytest.fixture
async def live(settings: Settings) -> AsyncIterator[LiveApp]:
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    clock = ShiftedClock()
    container = build_container(settings, base_url=base_url)
    container.core.clock.override(providers.Object(clock))
    container.shared.hasher.override(providers.Object(fast_hasher()))
    runner = web.AppRunner(make_app(container), **runner_options())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield LiveApp(base_url, container.services.system(), clock)
    finally:
        await runner.cleanup()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield launched
        finally:
            await launched.close()


@attrs.define
class Problems:
    """What the page reported that a working UI never reports. ``refusals`` are the
    ``(path, status)`` answers the test expects (``refused_request``): Chromium logs any
    4xx answer to a script's request as a console error, and each of these is let through
    once, nothing else."""

    seen: list[str] = attrs.field(factory=list)
    refusals: list[tuple[str, int]] = attrs.field(factory=list)

    def console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        path = urlsplit(str(message.location.get("url", ""))).path
        for path_and_status in self.refusals:
            expected_path, status = path_and_status
            if path == expected_path and message.text.startswith(_REFUSED.format(status)):
                self.refusals.remove(path_and_status)
                return
        self.seen.append(f"console error: {message.text} ({message.location})")

    def page_error(self, error: Exception) -> None:
        self.seen.append(f"page error: {error}")

    def csp(self, violation: Any) -> None:
        self.seen.append(f"CSP violation: {violation}")


_REFUSED = "Failed to load resource: the server responded with a status of {} "

# Reports every CSP violation to the test through an exposed binding (runs in the page's
# isolated init context, which the page's CSP does not govern).
_CSP_LISTENER = """
document.addEventListener("securitypolicyviolation", (e) => {
  const where = `${e.sourceFile}:${e.lineNumber}`;
  window.__tradecoreCsp(`${e.violatedDirective} blocked ${e.blockedURI} at ${where}`);
});
"""


@pytest.fixture
async def page(
    live: LiveApp, browser: Browser, request: pytest.FixtureRequest
) -> AsyncIterator[Page]:
    context = await browser.new_context(base_url=live.base_url)
    refusals = [
        (marker.args[0], marker.args[1]) for marker in request.node.iter_markers("refused_request")
    ]
    problems = Problems(refusals=refusals)
    await context.expose_function("__tradecoreCsp", lambda text: problems.csp(text))
    await context.add_init_script(_CSP_LISTENER)
    opened = await context.new_page()
    opened.on("console", lambda message: problems.console(message))
    opened.on("pageerror", lambda error: problems.page_error(error))
    opened.on("dialog", lambda dialog: dialog.accept())
    try:
        yield opened
    finally:
        await context.close()
    assert problems.seen == []


@pytest.fixture
def shot(tmp_path: Path) -> Shot:
    """Save a full-page screenshot as ``<tmp>/<name>.png``."""

    async def take(page: Page, name: str) -> Path:
        path = tmp_path / f"{name}.png"
        await page.screenshot(path=str(path), full_page=True)
        return path

    return take
