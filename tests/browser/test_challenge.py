"""The bot challenge on the login and registration pages, in a real browser.

Turnstile's script cannot load here (no network), and a test must not depend on Cloudflare
anyway. The page still asks for the real script URL (``CHALLENGE_SCRIPT_URL``), under the
real policy; Playwright answers that one request with a small stand-in that does what the
widget does for the form (implicit rendering: it fills every ``.cf-turnstile`` with a hidden
input named by ``data-response-field-name``, holding the token). Intercepting the real URL,
rather than configuring another script origin, keeps the production markup and policy under
test and adds no setting that could load scripts from elsewhere. The token then goes the
whole way: the form posts it, the service checks it with a local siteverify endpoint
(``TURNSTILE_VERIFY_URL``), which sees the token and the secret.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from aiohttp import web
from playwright.async_api import Page, Route, expect

from browser.support import PASSWORD, LiveApp, Shot
from tradecore_adapters.http.config import CHALLENGE_HOST, CHALLENGE_SCRIPT_URL, HttpConfig
from tradecore_entrypoints.settings import Settings

SITE_KEY = "1x-test-site-key"
SECRET = "test-turnstile-secret"
# What the stand-in widget hands the form: derived from the site key it was rendered for.
TOKEN = f"token-for-{SITE_KEY}"

STAND_IN_WIDGET = """
(function () {
  function render() {
    document.querySelectorAll(".cf-turnstile").forEach(function (box) {
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = box.getAttribute("data-response-field-name") || "cf-turnstile-response";
      input.value = "token-for-" + box.getAttribute("data-sitekey");
      box.appendChild(input);
      box.setAttribute("data-stand-in", "solved");
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", render);
  } else {
    render();
  }
})();
"""


@attrs.define
class SiteVerify:
    """A local Turnstile siteverify endpoint: it passes ``TOKEN`` sent with ``SECRET`` while
    ``passing``, and records every form it was sent."""

    url: str = ""
    passing: bool = True
    forms: list[dict[str, str]] = attrs.field(factory=list)

    async def answer(self, request: web.Request) -> web.Response:
        form = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
        self.forms.append(form)
        success = self.passing and form.get("secret") == SECRET and form.get("response") == TOKEN
        return web.json_response({"success": success})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def siteverify() -> AsyncIterator[SiteVerify]:
    endpoint = SiteVerify()
    app = web.Application()
    app.router.add_post("/siteverify", endpoint.answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    endpoint.url = f"http://127.0.0.1:{port}/siteverify"
    try:
        yield endpoint
    finally:
        await runner.cleanup()


@pytest.fixture
def settings(siteverify: SiteVerify, request: pytest.FixtureRequest) -> Settings:
    """The challenge on, checked by the local siteverify endpoint; a test's ``settings``
    marker changes fields of these."""
    marker = request.node.get_closest_marker("settings")
    fields: dict[str, Any] = {
        "captcha_enabled": True,
        "turnstile_secret": SECRET,
        "turnstile_verify_url": siteverify.url,
        "turnstile_site_key": SITE_KEY,
    }
    return Settings(**(fields | (marker.kwargs if marker else {})))


@pytest.fixture
async def widget(page: Page) -> list[str]:
    """Serve the stand-in for Turnstile's script; the URLs it was asked for."""
    asked: list[str] = []

    async def serve(route: Route) -> None:
        asked.append(route.request.url)
        await route.fulfill(status=200, content_type="text/javascript", body=STAND_IN_WIDGET)

    await page.route(CHALLENGE_SCRIPT_URL, serve)
    return asked


def test_the_policy_names_the_challenge_host_only_while_the_challenge_is_on() -> None:
    def directives(config: HttpConfig) -> dict[str, str]:
        policy = config.security_headers["Content-Security-Policy"]
        return dict(d.split(" ", 1) for d in policy.split("; "))

    on, off = directives(HttpConfig(challenge_enabled=True)), directives(HttpConfig())
    assert CHALLENGE_HOST in on["script-src"] and CHALLENGE_HOST in on["frame-src"]
    assert CHALLENGE_HOST not in off["script-src"] and CHALLENGE_HOST not in off["frame-src"]
    assert {k: v.replace(f" {CHALLENGE_HOST}", "") for k, v in on.items()} == off


async def test_logging_in_posts_the_widgets_token_which_the_service_verifies(
    live: LiveApp, page: Page, widget: list[str], siteverify: SiteVerify, shot: Shot
) -> None:
    await live.user()
    siteverify.passing = False
    response = await page.goto("/ui/login")
    assert response is not None
    policy = response.headers["content-security-policy"]
    assert CHALLENGE_HOST in policy
    box = page.locator("form .cf-turnstile")
    await expect(box).to_have_attribute("data-sitekey", SITE_KEY)
    await expect(box).to_have_attribute("data-stand-in", "solved")
    assert widget == [CHALLENGE_SCRIPT_URL]
    await shot(page, "login-challenge")

    await page.get_by_label("Email", exact=True).fill("ada@example.com")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("alert")).to_have_text("Bot challenge failed")
    assert [f["response"] for f in siteverify.forms] == [TOKEN]

    siteverify.passing = True
    await expect(page.locator("form .cf-turnstile")).to_have_attribute("data-stand-in", "solved")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("heading", name="Trading accounts")).to_be_visible()
    assert [(f["secret"], f["response"]) for f in siteverify.forms] == [(SECRET, TOKEN)] * 2


async def test_registering_posts_the_widgets_token(
    live: LiveApp, page: Page, widget: list[str], siteverify: SiteVerify
) -> None:
    await page.goto("/ui/register")
    await expect(page.locator("form .cf-turnstile")).to_have_attribute("data-stand-in", "solved")
    await page.get_by_label("Email", exact=True).fill("grace@example.com")
    await page.get_by_label("Password (8 characters or more)").fill(PASSWORD)
    await page.get_by_label("Password again").fill(PASSWORD)
    await page.get_by_role("button", name="Create account").click()
    await expect(page.get_by_role("status")).to_contain_text("Check your mail to continue")
    await expect(page).to_have_url(re.compile(r"/ui/register$"))
    assert [f["response"] for f in siteverify.forms] == [TOKEN]
    assert await live.system.users.by_email("grace@example.com") is not None


@pytest.mark.settings(turnstile_site_key=None)
async def test_without_a_site_key_the_pages_say_why_nobody_can_log_in_here(
    live: LiveApp, page: Page, widget: list[str]
) -> None:
    for path in ("/ui/login", "/ui/register"):
        await page.goto(path)
        await expect(page.get_by_role("alert")).to_contain_text("TURNSTILE_SITE_KEY")
        await expect(page.locator(".cf-turnstile")).to_have_count(0)
    assert widget == []


@pytest.mark.settings(captcha_enabled=False)
async def test_with_the_challenge_off_there_is_no_widget(
    live: LiveApp, page: Page, widget: list[str]
) -> None:
    await live.user()
    response = await page.goto("/ui/login")
    await expect(page.get_by_role("button", name="Log in")).to_be_visible()
    await expect(page.locator(".cf-turnstile")).to_have_count(0)
    assert widget == []
    assert response is not None
    assert CHALLENGE_HOST not in response.headers["content-security-policy"]
