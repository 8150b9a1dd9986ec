"""Helpers for the HTTP tests: the app over the container on a fake clock, a client that
keeps cookies by hand (aiohttp's jar will not send Secure cookies over plain http), and a
provisioned trader."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from http.cookies import SimpleCookie
from typing import Any

import argon2
import attrs
from aiohttp import ClientResponse, DummyCookieJar
from aiohttp.test_utils import TestClient, TestServer
from dependency_injector import providers

from tradecore.audit import AuditAction, StoredAuditEntry
from tradecore.identity import Plan, User
from tradecore.ports.identity import PasswordHasher
from tradecore.services.accounts.provisioning import NewAccount
from tradecore.services.execution.worker_host import HostSettings
from tradecore.testing.clock import FakeClock, FakeSleeper, SeededRandom
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.http import runner_options
from tradecore_entrypoints.container import Application, build_container, make_app
from tradecore_entrypoints.settings import Settings
from tradecore_entrypoints.system import System

PASSWORD = "correct horse battery staple"
BASE_URL = "http://tradecore.test"


def fast_hasher() -> Argon2PasswordHasher:
    return Argon2PasswordHasher(
        hasher=argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    )


@attrs.define
class Env:
    """One running app: its HTTP client, container, embedded system and clock."""

    client: TestClient[Any, Any]
    container: Application
    system: System
    clock: FakeClock

    async def trader(
        self,
        email: str = "ada@example.com",
        *,
        plan: Plan = Plan.PRO,
        terms: str | None = "1",
        verified: bool = True,
    ) -> Trader:
        user = await self.system.provisioning.create_user(
            email, PASSWORD, plan=plan, terms_version=terms
        )
        account = await self.system.provisioning.create_account(
            user, "Main", credentials_verified=verified
        )
        return Trader(self, user, account)

    def audit(self, user_id: str | None = None) -> list[StoredAuditEntry]:
        return [s for s in self.system.audit.all() if user_id is None or s.entry.user_id == user_id]

    def last_audit(self) -> StoredAuditEntry:
        return self.system.audit.all()[-1]


@attrs.define
class Trader:
    env: Env
    user: User
    account: NewAccount

    @property
    def path(self) -> str:
        return f"/webhook/{self.account.webhook_token}/order"

    def body(self, **changes: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "action": "buy",
            "symbol": "BTCUSDT",
            "quantity": 1,
            "timestamp": self.env.clock.now().isoformat(),
            "secret": self.account.webhook_secret,
        }
        fields.update(changes)
        return {k: v for k, v in fields.items() if v is not None}

    async def webhook(
        self,
        body: Mapping[str, Any] | bytes | None = None,
        *,
        simulation: bool = False,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> ClientResponse:
        data = body if isinstance(body, bytes) else json.dumps(body or self.body()).encode()
        return await self.env.client.post(
            self.path + ("?simulation=true" if simulation else ""),
            data=data,
            headers={"Content-Type": content_type, **(headers or {})},
        )

    def actions(self) -> list[AuditAction]:
        return [s.entry.action for s in self.env.audit(self.user.id)]


@attrs.define
class Session:
    """A logged-in browser: its cookies and CSRF token."""

    client: TestClient[Any, Any]
    cookies: dict[str, str]
    csrf_token: str

    def cookie_header(self, *, refresh: bool = False) -> str:
        names = ("access_token", "refresh_token") if refresh else ("access_token",)
        return "; ".join(f"{n}={self.cookies[n]}" for n in names if n in self.cookies)

    def headers(self, *, csrf: bool = True, refresh: bool = False) -> dict[str, str]:
        headers = {"Cookie": self.cookie_header(refresh=refresh)}
        if csrf:
            headers["X-CSRF-Token"] = self.csrf_token
        return headers

    async def request(
        self, method: str, path: str, *, csrf: bool = True, **kwargs: Any
    ) -> ClientResponse:
        headers = {**self.headers(csrf=csrf), **kwargs.pop("headers", {})}
        return await self.client.request(method, path, headers=headers, **kwargs)

    def absorb(self, response: ClientResponse) -> None:
        """Take the cookies a response sets (Max-Age=0 deletes)."""
        for name, morsel in cookies_of(response).items():
            if morsel["max-age"] == "0":
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = morsel.value


def cookies_of(response: ClientResponse) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for header in response.headers.getall("Set-Cookie", []):
        jar.load(header)
    return jar


async def login(client: TestClient[Any, Any], email: str, password: str = PASSWORD) -> Session:
    response = await client.post("/auth/login", json={"email": email, "password": password})
    assert response.status == 200, await response.text()
    body = await response.json()
    session = Session(client, {}, body["csrf_token"])
    session.absorb(response)
    return session


def container_for(settings: Settings, clock: FakeClock) -> Application:
    container = build_container(settings, base_url=BASE_URL)
    container.core.clock.override(providers.Object(clock))
    container.core.sleeper.override(providers.Object(FakeSleeper(clock)))
    container.core.random.override(providers.Object(SeededRandom(7)))
    container.core.host_settings.override(providers.Object(HostSettings(poll_s=0.005)))
    container.shared.hasher.override(providers.Object(fast_hasher()))
    return container


@contextlib.asynccontextmanager
async def running(
    settings: Settings | None = None, *, hasher: PasswordHasher | None = None, **server: Any
) -> AsyncIterator[Env]:
    """The app over the embedded runtime on a fake clock, served on a loopback port;
    ``hasher`` replaces the fast test hasher (a test that controls when hashing ends)."""
    clock = FakeClock()
    container = container_for(settings or Settings(), clock)
    if hasher is not None:
        container.shared.hasher.override(providers.Object(hasher))
    app = make_app(container)
    test_server = TestServer(app, **server)
    # TestServer drops constructor kwargs; the runner options go to start_server.
    await test_server.start_server(**runner_options())
    client: TestClient[Any, Any] = TestClient(test_server, cookie_jar=DummyCookieJar())
    await client.start_server()
    try:
        yield Env(client, container, container.services.system(), clock)
    finally:
        await client.close()


def iso(when: datetime) -> str:
    return when.isoformat()
