"""TurnstileVerifier against a local stand-in of the siteverify API, and DisabledCaptcha."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tradecore.ports.identity import CaptchaVerifier
from tradecore_adapters.captcha import DisabledCaptcha
from tradecore_adapters.captcha.turnstile import TurnstileVerifier

SECRET = "0x4AAAAAAA-test-secret"
TOKEN = "XXXX.DUMMY.TOKEN.XXXX"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@attrs.define
class Siteverify:
    """The stand-in: records every form it receives and answers with ``handler``."""

    server: TestServer
    forms: list[dict[str, str]]
    content_types: list[str]
    handler: Handler | None = None

    @property
    def url(self) -> str:
        return str(self.server.make_url("/siteverify"))


async def _success(request: web.Request) -> web.StreamResponse:
    return web.json_response({"success": True, "error-codes": []})


@pytest.fixture
async def siteverify() -> AsyncIterator[Siteverify]:
    forms: list[dict[str, str]] = []
    types: list[str] = []
    holder: list[Siteverify] = []

    async def route(request: web.Request) -> web.StreamResponse:
        types.append(request.content_type)
        forms.append({k: str(v) for k, v in (await request.post()).items()})
        handler = holder[0].handler or _success
        return await handler(request)

    app = web.Application()
    app.router.add_post("/siteverify", route)
    app.router.add_post("/elsewhere", route)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    state = Siteverify(server, forms, types)
    holder.append(state)
    try:
        yield state
    finally:
        await server.close()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def verifier(client: aiohttp.ClientSession, url: str, timeout_s: float = 2.0) -> TurnstileVerifier:
    return TurnstileVerifier(client, SECRET, verify_url=url, timeout_s=timeout_s)


async def test_posts_secret_token_and_client_ip_as_a_form(
    siteverify: Siteverify, client: aiohttp.ClientSession
) -> None:
    assert await verifier(client, siteverify.url).verify(TOKEN, "203.0.113.7") is True
    assert siteverify.forms == [{"secret": SECRET, "response": TOKEN, "remoteip": "203.0.113.7"}]
    assert siteverify.content_types == ["application/x-www-form-urlencoded"]


async def test_the_client_ip_is_sent_normalized(
    siteverify: Siteverify, client: aiohttp.ClientSession
) -> None:
    await verifier(client, siteverify.url).verify(TOKEN, "::ffff:198.51.100.9")
    assert siteverify.forms[0]["remoteip"] == "198.51.100.9"


async def test_an_unknown_client_ip_is_left_out(
    siteverify: Siteverify, client: aiohttp.ClientSession
) -> None:
    await verifier(client, siteverify.url).verify(TOKEN, "0.0.0.0")
    assert "remoteip" not in siteverify.forms[0]


async def test_a_session_factory_is_accepted(
    siteverify: Siteverify, client: aiohttp.ClientSession
) -> None:
    lazy = TurnstileVerifier(lambda: client, SECRET, verify_url=siteverify.url)
    assert await lazy.verify(TOKEN, "203.0.113.7") is True


def _answer(body: object, status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status)

    return handler


def _raw(text: str, status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(text=text, status=status, content_type="application/json")

    return handler


async def _redirect(request: web.Request) -> web.StreamResponse:
    raise web.HTTPTemporaryRedirect("/elsewhere")


@pytest.mark.parametrize(
    "handler",
    [
        _answer({"success": False, "error-codes": ["invalid-input-response"]}),
        _answer({"success": "true"}),
        _answer({"success": 1}),
        _answer({}),
        _answer([True]),
        _answer({"success": True}, status=500),
        _answer({"success": True}, status=403),
        _raw("not json"),
        _raw('{"success": true'),
        _raw('{"success": true, "pad": "' + "x" * 70_000 + '"}'),
        _redirect,
    ],
    ids=[
        "refused",
        "string-true",
        "one",
        "empty",
        "list",
        "http-500",
        "http-403",
        "not-json",
        "truncated",
        "oversized",
        "redirect",
    ],
)
async def test_anything_but_an_explicit_success_fails_closed(
    siteverify: Siteverify, client: aiohttp.ClientSession, handler: Handler
) -> None:
    siteverify.handler = handler
    assert await verifier(client, siteverify.url).verify(TOKEN, "203.0.113.7") is False
    # A redirect is not followed: the secret is posted to the configured URL only.
    assert len(siteverify.forms) == 1


async def test_a_slow_provider_fails_closed_at_the_timeout(
    siteverify: Siteverify, client: aiohttp.ClientSession
) -> None:
    release = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response({"success": True})

    siteverify.handler = stall
    try:
        assert (
            await verifier(client, siteverify.url, timeout_s=0.05).verify(TOKEN, "1.2.3.4") is False
        )
    finally:
        release.set()


async def test_an_unreachable_provider_fails_closed(client: aiohttp.ClientSession) -> None:
    app = web.Application()
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("/siteverify"))
    await server.close()  # nothing listens on that port any more
    assert await verifier(client, url).verify(TOKEN, "203.0.113.7") is False


async def test_a_closed_client_session_fails_closed(siteverify: Siteverify) -> None:
    session = aiohttp.ClientSession()
    await session.close()
    assert await verifier(session, siteverify.url).verify(TOKEN, "203.0.113.7") is False


@pytest.mark.parametrize("token", ["", "x" * 2049, None, 12])
async def test_an_empty_or_oversized_token_is_refused_without_a_call(
    siteverify: Siteverify, client: aiohttp.ClientSession, token: object
) -> None:
    assert await verifier(client, siteverify.url).verify(token, "203.0.113.7") is False  # type: ignore[arg-type]
    assert siteverify.forms == []


@pytest.mark.parametrize(
    "url", ["http://challenges.example.com/siteverify", "ftp://127.0.0.1/x", "siteverify", ""]
)
async def test_a_plain_http_url_off_the_host_is_refused(
    client: aiohttp.ClientSession, url: str
) -> None:
    with pytest.raises(ValueError, match="https"):
        TurnstileVerifier(client, SECRET, verify_url=url)


async def test_an_empty_secret_is_refused(client: aiohttp.ClientSession) -> None:
    with pytest.raises(ValueError, match="TURNSTILE_SECRET"):
        TurnstileVerifier(client, "")


async def test_repr_hides_the_secret(client: aiohttp.ClientSession) -> None:
    assert SECRET not in repr(TurnstileVerifier(client, SECRET))


async def test_both_implement_the_port(client: aiohttp.ClientSession) -> None:
    assert isinstance(TurnstileVerifier(client, SECRET), CaptchaVerifier)
    assert isinstance(DisabledCaptcha(), CaptchaVerifier)


async def test_the_disabled_verifier_always_passes() -> None:
    assert await DisabledCaptcha().verify("", "0.0.0.0") is True
    assert await DisabledCaptcha().verify("anything", "203.0.113.7") is True
