"""Schemathesis against ``/openapi.json``: generated requests for every operation, run
against the app served on loopback, with bounded examples. Every response must be a non-5xx
that conforms to the document (status code, content type, headers, body schema).

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
from pathlib import Path
from typing import Any

import pytest
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
from tradecore_adapters.http import runner_options
from tradecore_entrypoints.admin import seed_demo
from tradecore_entrypoints.container import build_container, make_app
from tradecore_entrypoints.settings import Settings

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
    """The app on a loopback port, served from a background thread."""

    def __init__(self) -> None:
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
        container = build_container(Settings(), base_url=self.base_url)
        container.shared.hasher.override(providers.Object(fast_hasher()))
        self.demo = await seed_demo(container)
        runner = web.AppRunner(make_app(container), **runner_options())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server() as running:
        yield running


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
