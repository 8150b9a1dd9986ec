"""Schemathesis against ``/openapi.json``: generated requests for every operation, run
against the app served on loopback, with bounded examples. Every response must be a non-5xx
that conforms to the document (status code, content type, headers, body schema).

The run happens twice: on the embedded runtime, and in real mode (a throwaway migrated
Postgres database, the test Redis database, a worker host in the same process), where a NUL
character or an out-of-range date that slipped past the HTTP layer would reach Postgres and
come back as a 500. Schemathesis generates NUL characters in strings by default
(``allow_x00``); the hostile inputs found by hand are replayed against both runtimes as well.

The server runs in its own thread and event loop, since Schemathesis calls it synchronously.
Requests carry a bearer access token (from the OAuth2 password grant) so the authenticated
operations are exercised beyond their 401; ``/auth/logout`` is left out so the token lives
through the run.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import schemathesis
from aiohttp import web
from dependency_injector import providers
from http_support import fast_hasher
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import tradecore_adapters.http
from contract.postgres_fixtures import create_database, drop_database, pg_admin_conninfo
from contract.redis_fixtures import redis_url
from tradecore_adapters.http import runner_options
from tradecore_adapters.postgres import migrate
from tradecore_entrypoints.admin import seed_demo
from tradecore_entrypoints.container import build_container, make_app
from tradecore_entrypoints.settings import Settings
from tradecore_entrypoints.system import System

__all__ = ["pg_admin_conninfo", "redis_url"]  # the real-mode run's fixtures

DOCUMENT = Path(tradecore_adapters.http.__file__).parent / "openapi.json"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

schema = schemathesis.openapi.from_path(str(DOCUMENT)).exclude(path="/auth/logout")


class Server:
    """The app on a loopback port, served from a background thread. With a database and a
    Redis URL in ``settings`` it runs in real mode, with a worker host beside the API."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.demo: dict[str, str] = {}
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="schemathesis-server", daemon=True)

    def __enter__(self) -> Server:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("server did not start")
        return self

    def __exit__(self, *_: Any) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with AsyncExitStack() as stack:
            if self._settings.database_url is not None:
                await migrate(self._settings.database_url)
                workers = build_container(self._settings)
                workers_system: System = workers.services.system()
                await stack.enter_async_context(workers_system.running(workers=True))
            container = build_container(self._settings, base_url=self.base_url)
            container.shared.hasher.override(providers.Object(fast_hasher()))
            runner = web.AppRunner(make_app(container), **runner_options())
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            self.demo = await seed_demo(container)
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()
            await self._stop.wait()


@pytest.fixture(scope="module", params=["embedded", "real"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    if request.param == "embedded":
        with Server(Settings()) as running:
            yield running
        return
    admin = request.getfixturevalue("pg_admin_conninfo")
    url = request.getfixturevalue("redis_url")
    redis.Redis.from_url(url).flushdb()
    database = create_database(admin)
    try:
        with Server(Settings(database_url=database, redis_url=url)) as running:
            yield running
    finally:
        drop_database(admin, database)


@pytest.fixture(scope="module")
def bearer(server: Server) -> dict[str, str]:
    response = requests.post(
        f"{server.base_url}/auth/token",
        data={
            "grant_type": "password",
            "username": server.demo["email"],
            "password": server.demo["password"],
        },
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_openapi_document(
    case: schemathesis.Case, server: Server, bearer: dict[str, str]
) -> None:
    headers = dict(case.headers or {})
    headers.setdefault("Authorization", bearer["Authorization"])
    response = case.call(base_url=server.base_url, headers=headers, timeout=10)
    case.validate_response(response, checks=CHECKS)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/trading/orders/abc%00"),
        ("DELETE", "/settings/api-keys/x%00"),
        ("GET", "/trading/orders?before=9999-12-31T23:59:59.999999"),
        ("GET", "/trading/orders?before=0001-01-01T00:00:00%2B01:00"),
        ("GET", "/settings/security-attacks?days=99999999999999999999"),
    ],
)
def test_hostile_paths_are_refused_before_any_store(
    server: Server, bearer: dict[str, str], method: str, path: str
) -> None:
    response = requests.request(method, server.base_url + path, headers=bearer, timeout=10)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_request"


@pytest.mark.parametrize(
    "body",
    [
        '{"trading_account_id": "a\\u0000", "symbol": "BTCUSDT", "action": "buy", "quantity": 1}',
        '{"trading_account_id": "%s", "symbol": "BTC\\u0000", "action": "buy", "quantity": 1}',
    ],
)
def test_a_nul_in_an_order_body_is_400_and_places_nothing(
    server: Server, bearer: dict[str, str], body: str
) -> None:
    if "%s" in body:
        body = body % server.demo["trading_account_id"]
    headers = {**bearer, "Content-Type": "application/json"}
    before = requests.get(f"{server.base_url}/trading/orders", headers=bearer, timeout=10).json()
    response = requests.post(
        f"{server.base_url}/trading/order", data=body, headers=headers, timeout=10
    )
    assert response.status_code == 400, response.text
    assert "NUL" in response.json()["detail"]
    after = requests.get(f"{server.base_url}/trading/orders", headers=bearer, timeout=10).json()
    assert after == before
