"""The operator's paths over HTTP: the first-run setup (open, then closed for good, one
administrator out of concurrent requests), the administrator-only deployment status in the
embedded runtime and in real mode (Postgres and Redis), and ``/public/*`` without a session."""

from __future__ import annotations

import asyncio
from importlib import metadata
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from dependency_injector import providers
from http_support import PASSWORD, Env, fast_hasher, login, running

from contract.postgres_fixtures import fresh_pg_database, pg_admin_conninfo
from contract.redis_fixtures import redis_url
from tradecore.audit import AuditAction
from tradecore.ports.messaging import FillTask
from tradecore.testing.orders import order_request
from tradecore_adapters.postgres import migrate
from tradecore_adapters.postgres.migrate import migration_files
from tradecore_entrypoints.admin import admin_create_user
from tradecore_entrypoints.cli import main
from tradecore_entrypoints.container import build_container
from tradecore_entrypoints.settings import Settings

__all__ = ["fresh_pg_database", "pg_admin_conninfo", "redis_url"]  # real mode's fixtures

ROOT = "root@example.com"


class BarrierHasher:
    """The fast hasher, except that the first two ``hash`` calls wait for each other: two
    setup requests are then both past their "is setup open?" look before either stores, so
    the store alone must decide between them. Later calls pass straight through."""

    def __init__(self) -> None:
        self._inner = fast_hasher()
        self._gate: asyncio.Barrier | None = asyncio.Barrier(2)

    async def hash(self, password: str) -> str:
        if self._gate is not None:
            gate = self._gate
            async with asyncio.timeout(30):  # a bound so a broken race fails, never hangs
                await gate.wait()
            self._gate = None
        return await self._inner.hash(password)

    async def verify(self, encoded: str, password: str) -> bool:
        return await self._inner.verify(encoded, password)

    def needs_rehash(self, encoded: str) -> bool:
        return self._inner.needs_rehash(encoded)

    async def verify_dummy(self, password: str) -> None:
        await self._inner.verify_dummy(password)


def setup_body(email: str = ROOT, **changes: Any) -> dict[str, Any]:
    return {"email": email, "password": PASSWORD, "terms_version": "1", **changes}


async def create_admin(env: Env, email: str = ROOT) -> dict[str, Any]:
    response = await env.client.post("/setup/admin", json=setup_body(email))
    assert response.status == 201, await response.text()
    user: dict[str, Any] = (await response.json())["user"]
    return user


def setup_entries(env: Env) -> list[tuple[bool, str | None, str | None]]:
    return [
        (s.entry.success, s.entry.error_message, s.entry.user_id)
        for s in env.audit()
        if s.entry.action is AuditAction.SETUP_ADMIN_CREATED
    ]


# --- first-run setup -------------------------------------------------------------------------


async def test_setup_creates_the_first_admin_then_closes_for_good(env: Env) -> None:
    status = await env.client.get("/setup/status")
    assert status.status == 200
    assert status.headers["Cache-Control"] == "no-store"
    assert await status.json() == {"open": True, "terms_version": "1"}

    user = await create_admin(env, "Root@Example.com")
    assert user["email"] == ROOT and user["is_admin"] is True
    assert user["plan"] == "pro" and user["terms_accepted"] is True
    stored = await env.system.users.by_email(ROOT)
    assert stored is not None and stored.is_admin and stored.id == user["id"]
    assert setup_entries(env) == [(True, None, user["id"])]
    assert PASSWORD not in repr(env.audit())

    # closed: anonymous callers are asked to authenticate, and that attempt is audited
    assert (await env.client.get("/setup/status")).status == 401
    again = await env.client.post("/setup/admin", json=setup_body("second@example.com"))
    assert again.status == 401
    assert setup_entries(env)[-1][0] is False
    assert await env.system.users.by_email("second@example.com") is None

    admin = await login(env.client, ROOT)
    closed = await admin.request("GET", "/setup/status", csrf=False)
    assert await closed.json() == {"open": False, "terms_version": "1"}
    refused = await admin.request("POST", "/setup/admin", json=setup_body("second@example.com"))
    assert refused.status == 409
    assert (await refused.json())["code"] == "setup_closed"
    assert setup_entries(env)[-1] == (False, "setup closed", user["id"])
    assert await env.system.users.by_email("second@example.com") is None


async def test_setup_is_closed_by_any_user_not_only_an_admin(env: Env) -> None:
    trader = await env.trader()
    assert (await env.client.get("/setup/status")).status == 401
    session = await login(env.client, trader.user.email)
    response = await session.request("POST", "/setup/admin", json=setup_body())
    assert response.status == 403
    assert (await response.json())["code"] == "admin_required"
    assert setup_entries(env) == [(False, "administrator required", trader.user.id)]
    assert await env.system.users.by_email(ROOT) is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (setup_body(email="not an address"), "e-mail"),
        (setup_body(password="short"), "at least 8"),
        (setup_body(password="x" * 1025), "at most 1024"),
        (setup_body(terms_version="0"), "terms_version"),
        ({"email": ROOT, "password": PASSWORD}, "terms_version"),
        (setup_body(password=12345678901), "string"),
    ],
)
async def test_bad_setup_input_is_400_and_setup_stays_open(
    env: Env, body: dict[str, Any], reason: str
) -> None:
    response = await env.client.post("/setup/admin", json=body)
    assert response.status == 400
    assert reason in (await response.json())["detail"]
    assert setup_entries(env) == [(False, "invalid request", None)]
    assert await (await env.client.get("/setup/status")).json() == {
        "open": True,
        "terms_version": "1",
    }


async def test_a_malformed_setup_body_is_refused_and_audited(env: Env) -> None:
    response = await env.client.post(
        "/setup/admin", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status == 400
    assert [s for s, *_ in setup_entries(env)] == [False]
    assert await env.system.users.by_email(ROOT) is None


async def test_concurrent_setup_requests_create_exactly_one_admin() -> None:
    async with running(hasher=BarrierHasher()) as env:
        first, second = await asyncio.gather(
            env.client.post("/setup/admin", json=setup_body("one@example.com")),
            env.client.post("/setup/admin", json=setup_body("two@example.com")),
        )
        assert sorted([first.status, second.status]) == [201, 409]
        loser = first if first.status == 409 else second
        assert (await loser.json())["code"] == "setup_closed"
        stored = [
            await env.system.users.by_email(e) for e in ("one@example.com", "two@example.com")
        ]
        assert len([u for u in stored if u is not None]) == 1
        assert sorted(ok for ok, *_ in setup_entries(env)) == [False, True]


async def test_setup_and_public_paths_skip_browser_only_in_production() -> None:
    settings = Settings(production=True, allowed_origins=frozenset({"https://app.example.com"}))
    async with running(settings) as env:
        assert (await env.client.get("/public/terms")).status == 200
        assert (await env.client.post("/setup/admin", json=setup_body())).status == 201
        # /deployment/* is not exempt: a script calls it with a bearer access token
        token = await env.client.post(
            "/auth/token", data={"grant_type": "password", "username": ROOT, "password": PASSWORD}
        )
        bearer = {"Authorization": f"Bearer {(await token.json())['access_token']}"}
        assert (await env.client.get("/deployment/status", headers=bearer)).status == 200
        bare = await env.client.get("/deployment/status")
        assert bare.status == 403
        assert (await bare.json())["code"] == "browser_only"


# --- administrators only ---------------------------------------------------------------------


async def test_operator_paths_refuse_users_who_are_not_administrators(env: Env) -> None:
    await create_admin(env)
    trader = await env.trader()
    assert (await env.client.get("/deployment/status")).status == 401
    session = await login(env.client, trader.user.email)
    for method, path in (("GET", "/setup/status"), ("GET", "/deployment/status")):
        response = await session.request(method, path, csrf=False)
        assert response.status == 403, path
        assert (await response.json())["code"] == "admin_required"
    key = await session.request("POST", "/settings/api-keys", json={"name": "ops"})
    bearer = {"Authorization": f"Bearer {(await key.json())['key']}"}
    by_key = await env.client.get("/deployment/status", headers=bearer)
    assert by_key.status == 403


async def test_deployment_status_in_the_embedded_runtime(env: Env) -> None:
    admin = await env.system.provisioning.create_user(
        "ops@example.com", PASSWORD, admin=True, terms_version="1"
    )
    trader = await env.trader()
    assert (await trader.webhook()).status == 200  # its worker now holds the user's lease

    token = await env.client.post(
        "/auth/token",
        data={"grant_type": "password", "username": admin.email, "password": PASSWORD},
    )
    bearer = {"Authorization": f"Bearer {(await token.json())['access_token']}"}
    response = await env.client.get("/deployment/status", headers=bearer)
    assert response.status == 200
    assert response.headers["Cache-Control"] == "no-store"
    body = await response.json()
    assert body["version"] == metadata.version("tradecore")
    assert body["checked_at"] == env.clock.now().isoformat().replace("+00:00", "Z")
    assert body["schema"] == {"store": "memory", "applied": [], "pending": []}
    assert body["worker_hosts"] == [{"holder": "embedded", "users": [trader.user.id]}]
    assert body["queues"]["order_requests"] == []
    assert body["queues"]["dead_letter_count"] == 0
    assert body["dead_letters"] == []
    assert body["truncated"] is False


async def test_create_user_admin_flag() -> None:
    container = build_container(Settings(), base_url="http://127.0.0.1:8080")
    container.shared.hasher.override(providers.Object(fast_hasher()))
    users = container.services.system().users
    made = await admin_create_user(container, "ops@example.com", PASSWORD, "pro", True, admin=True)
    plain = await admin_create_user(container, "ada@example.com", PASSWORD, "free", False)
    assert (await users.get(made["user_id"])).is_admin  # type: ignore[union-attr]
    assert not (await users.get(plain["user_id"])).is_admin  # type: ignore[union-attr]
    usage = CliRunner().invoke(main, ["admin", "create-user", "--help"])
    assert usage.exit_code == 0 and "--admin" in usage.output


# --- /public/* -------------------------------------------------------------------------------


async def test_public_paths_need_no_session(env: Env) -> None:
    terms = await env.client.get("/public/terms")
    assert terms.status == 200
    body = await terms.json()
    assert body["version"] == "1" and "broker" in body["text"]
    key = await env.client.get("/public/public-key")
    assert key.status == 200
    assert await key.json() == await (await env.client.get("/auth/public-key")).json()
    assert (await key.json())["alg"] == "RSA-OAEP-256"


# --- real mode -------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.redis
async def test_setup_and_deployment_status_in_real_mode(
    fresh_pg_database: str, redis_url: str
) -> None:
    await migrate(fresh_pg_database)
    redis.Redis.from_url(redis_url).flushdb()
    settings = Settings(database_url=fresh_pg_database, redis_url=redis_url)
    async with running(settings, hasher=BarrierHasher()) as env:
        assert await (await env.client.get("/setup/status")).json() == {
            "open": True,
            "terms_version": "1",
        }
        responses = await asyncio.gather(
            env.client.post("/setup/admin", json=setup_body("one@example.com")),
            env.client.post("/setup/admin", json=setup_body("two@example.com")),
        )
        assert sorted(r.status for r in responses) == [201, 409]
        winner = next(r for r in responses if r.status == 201)
        admin_email = (await winner.json())["user"]["email"]
        assert (await env.client.get("/setup/status")).status == 401

        # what the status reports, put in place through the adapters themselves
        system = env.system
        assert await system.directory.acquire("user-a", "worker-host-1", 60) is not None
        await system.queue.park(order_request("r1", "user-b"))
        await system.fill_tasks.send(FillTask("order-9", "user-c", "acct"), 0)
        delivery = await system.fill_tasks.receive(0)
        assert delivery is not None
        await system.fill_tasks.dead_letter(delivery, "fill not confirmed after 3 checks")

        admin = await login(env.client, admin_email)
        response = await admin.request("GET", "/deployment/status", csrf=False)
        assert response.status == 200, await response.text()
        body = await response.json()
        assert body["schema"]["store"] == "postgres"
        assert [m["name"] for m in body["schema"]["applied"]] == [n for n, _ in migration_files()]
        assert body["schema"]["pending"] == []
        assert body["worker_hosts"] == [{"holder": "worker-host-1", "users": ["user-a"]}]
        assert body["queues"] == {
            "order_requests": [{"user_id": "user-b", "waiting": 1, "in_flight": 0}],
            "fill_tasks_pending": 0,
            "dead_letter_count": 1,
        }
        assert body["dead_letters"] == [
            {
                "order_id": "order-9",
                "user_id": "user-c",
                "trading_account_id": "acct",
                "reason": "fill not confirmed after 3 checks",
            }
        ]

        trader = await env.trader()
        session = await login(env.client, trader.user.email)
        refused = await session.request("GET", "/deployment/status", csrf=False)
        assert refused.status == 403
