"""Slow and vanishing clients against a real server on a loopback port (issue 16, point 7).

The app is built by the container and served as ``tradecore serve`` serves it. The body-read
bound is lowered to a fraction of a second for the test (``bodies.BODY_READ_TIMEOUT_S``) so a
trickling client is cut within a couple of seconds.
Clients speak raw HTTP/1.1 over ``asyncio`` streams, so they can trickle and vanish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tradecore_adapters.http import bodies, runner_options
from tradecore_adapters.http.config import KEEPALIVE_TIMEOUT_S
from tradecore_entrypoints.container import build_container, make_app
from tradecore_entrypoints.settings import Settings

BOUND_S = 0.5
WAIT_S = 5.0
DECLARED = 100
PATHS = ("/webhook/no-such-token/order", "/auth/login")


@pytest.fixture
async def port(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[int]:
    """The app served as ``tradecore serve`` serves it (``AppRunner`` with the runner options;
    aiohttp's ``TestServer`` would also cancel handlers on a disconnect, which serve does not)."""
    monkeypatch.setattr(bodies, "BODY_READ_TIMEOUT_S", BOUND_S)
    app = make_app(build_container(Settings(), base_url="http://tradecore.test"))
    runner = web.AppRunner(app, handle_signals=False, **runner_options())
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    try:
        await web.SockSite(runner, sock).start()
        yield sock.getsockname()[1]
    finally:
        await runner.cleanup()
        sock.close()


def head(path: str, length: int = DECLARED) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: tradecore.test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def trickle(writer: asyncio.StreamWriter, interval_s: float) -> None:
    """One byte of the body per ``interval_s``, never the whole of it."""
    with contextlib.suppress(ConnectionError):
        for _ in range(DECLARED - 1):
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(interval_s)


@pytest.mark.parametrize("path", PATHS)
async def test_a_trickled_body_is_cut_with_408_within_the_bound(port: int, path: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head(path))
    started = time.monotonic()
    sender = asyncio.create_task(trickle(writer, 1.0))
    try:
        status_line = await asyncio.wait_for(reader.readline(), WAIT_S)
        elapsed = time.monotonic() - started
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    finally:
        sender.cancel()
        writer.close()
    assert status_line.startswith(b"HTTP/1.1 408 "), status_line
    assert BOUND_S <= elapsed < BOUND_S + 1.5
    assert b"application/problem+json" in answer


async def test_a_prompt_body_is_read_as_before(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head(PATHS[0], 2) + b"{}")
    try:
        status_line = await asyncio.wait_for(reader.readline(), WAIT_S)
    finally:
        writer.close()
    assert not status_line.startswith(b"HTTP/1.1 408 "), status_line


@pytest.mark.parametrize("path", PATHS)
async def test_a_client_leaving_mid_body_is_one_info_line_without_traceback(
    port: int, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head(path) + b'{"half": ')
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    await writer.wait_closed()
    deadline = time.monotonic() + WAIT_S
    while not any("client disconnected" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # let aiohttp finish the request after the handler
    (left,) = [r for r in caplog.records if "client disconnected" in r.getMessage()]
    assert left.levelno == logging.INFO
    assert left.exc_info is None
    assert "no-such-token" not in left.getMessage()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []


def test_the_keepalive_timeout_bounds_the_wait_for_headers() -> None:
    """aiohttp has no header-read timeout; the keep-alive timer, started when a connection
    opens, closes one whose headers are not complete by then."""
    assert runner_options()["keepalive_timeout"] == KEEPALIVE_TIMEOUT_S
    assert KEEPALIVE_TIMEOUT_S <= 120
