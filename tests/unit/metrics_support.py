"""The embedded runtime with its metrics on, served to an aiohttp test client, on a fake clock."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import argon2
import attrs
from aiohttp import ClientResponse, DummyCookieJar
from aiohttp.test_utils import TestClient, TestServer
from dependency_injector import providers

from tradecore.identity import Plan
from tradecore.services.accounts.provisioning import NewAccount
from tradecore.services.execution.worker_host import HostSettings
from tradecore.testing.clock import FakeClock, FakeSleeper, SeededRandom
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.http import runner_options
from tradecore_adapters.metrics import ProcessMetrics
from tradecore_entrypoints.container import Application, build_container, make_app
from tradecore_entrypoints.observability import instrument
from tradecore_entrypoints.settings import Settings
from tradecore_entrypoints.system import System

PASSWORD = "correct horse battery staple"


def sample(metrics: ProcessMetrics, name: str, **labels: str) -> float:
    """A sample's value; 0 when the series was never written."""
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@attrs.define
class MeteredEnv:
    client: TestClient[Any, Any]
    container: Application
    system: System
    clock: FakeClock
    metrics: ProcessMetrics

    async def account(self, email: str = "ada@example.com") -> NewAccount:
        user = await self.system.provisioning.create_user(
            email, PASSWORD, plan=Plan.PRO, terms_version="1"
        )
        return await self.system.provisioning.create_account(
            user, "Main", credentials_verified=True
        )

    async def webhook(self, account: NewAccount, **changes: Any) -> ClientResponse:
        body: Mapping[str, Any] = {
            "action": "buy",
            "symbol": "BTCUSDT",
            "quantity": 1,
            "timestamp": self.clock.now().isoformat(),
            "secret": account.webhook_secret,
            **changes,
        }
        return await self.client.post(
            f"/webhook/{account.webhook_token}/order",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )


@contextlib.asynccontextmanager
async def metered(settings: Settings | None = None) -> AsyncIterator[MeteredEnv]:
    """The instrumented app over the embedded runtime (workers in process)."""
    clock = FakeClock()
    container = build_container(settings or Settings(), base_url="http://tradecore.test")
    metrics = instrument(container)
    container.core.clock.override(providers.Object(clock))
    container.core.sleeper.override(providers.Object(FakeSleeper(clock)))
    container.core.random.override(providers.Object(SeededRandom(11)))
    container.core.host_settings.override(providers.Object(HostSettings(poll_s=0.005)))
    fast = argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    container.shared.hasher.override(providers.Object(Argon2PasswordHasher(hasher=fast)))
    server = TestServer(make_app(container))
    await server.start_server(**runner_options())
    client: TestClient[Any, Any] = TestClient(server, cookie_jar=DummyCookieJar())
    await client.start_server()
    try:
        yield MeteredEnv(client, container, container.services.system(), clock, metrics)
    finally:
        await client.close()
