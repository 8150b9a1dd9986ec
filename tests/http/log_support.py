"""An app for the log tests: the embedded runtime on a fake clock, with chosen services, and a
fill verifier that leaves the checks to the test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import DummyCookieJar
from aiohttp.test_utils import TestClient, TestServer
from dependency_injector import providers
from http_support import PASSWORD, Env, container_for

from tradecore.testing.clock import FakeClock
from tradecore_adapters.http import runner_options
from tradecore_entrypoints.container import make_app
from tradecore_entrypoints.settings import Settings
from tradecore_entrypoints.system import FillPolling


@contextlib.asynccontextmanager
async def served(*, account_broker: object | None = None, **services: object) -> AsyncIterator[Env]:
    """The app over the embedded runtime on a fake clock (as ``http_support.running``), with
    ``services`` replacing the HTTP layer's and ``account_broker`` the broker calls of the
    account endpoints, and a fill verifier whose loop looks once at start, then sleeps past
    the test: the test runs the checks (``system.verifier.run_once``)."""
    clock = FakeClock()
    container = container_for(Settings(), clock)
    container.adapters.fill_polling.override(
        providers.Object(FillPolling(wait_s=0.0, idle_s=3600.0))
    )
    if account_broker is not None:
        container.services.account_broker.override(providers.Object(account_broker))
    if services:
        container.services.http.add_kwargs(
            **{name: providers.Object(value) for name, value in services.items()}
        )
    server = TestServer(make_app(container))
    await server.start_server(**runner_options())
    client: TestClient[Any, Any] = TestClient(server, cookie_jar=DummyCookieJar())
    await client.start_server()
    try:
        yield Env(client, container, container.services.system(), clock)
    finally:
        await client.close()


async def bearer_token(env: Env, email: str = "ada@example.com") -> str:
    """An access token through the password grant."""
    response = await env.client.post(
        "/auth/token",
        data={"grant_type": "password", "username": email, "password": PASSWORD},
    )
    assert response.status == 200, await response.text()
    token: str = (await response.json())["access_token"]
    return token
