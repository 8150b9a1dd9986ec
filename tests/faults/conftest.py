"""Fixtures of the fault tests (harness.py describes the parts).

* ``trader`` (per module): a throwaway database created through the admin URL
  (``TRADECORE_TEST_POSTGRES_URL``, default ``postgresql://postgres@127.0.0.1:5432/postgres``),
  migrated with ``tradecore migrate``, dropped at the end; and one user made with
  ``tradecore admin create-user`` (plan pro, terms accepted).
* ``stack`` (per test): a private redis-server, a proxy in front of Postgres, and the
  tradecore processes the test starts; all ended when the test ends. On failure the
  processes' logs are added to the report.

Without redis-server, Postgres or the ``tradecore`` script the tests are skipped with the
reason, except in CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import warnings
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import psycopg
import pytest
from harness import (
    CLI_TIMEOUT_S,
    PASSWORD,
    TRADECORE,
    Database,
    RedisServer,
    Stack,
    TcpProxy,
    Trader,
    Unavailable,
    base_environment,
    secrets_environment,
)
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ADMIN_URL_ENV = "TRADECORE_TEST_POSTGRES_URL"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
_LOGS = pytest.StashKey[Stack]()


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the fault tests need {reason} in CI (CI=true)", pytrace=False)
    pytest.skip(f"fault tests: {reason}")


def _cli(args: list[str], env: dict[str, str], stdin: str = "") -> dict[str, object]:
    done = subprocess.run(
        [str(TRADECORE), *args],
        input=stdin.encode(),
        env=env,
        capture_output=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"tradecore {' '.join(args)} exited {done.returncode}: {done.stderr.decode().strip()}"
        )
    printed: dict[str, object] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return printed


@pytest.fixture(scope="module")
def trader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trader]:
    """The module's database and user (see the module doc)."""
    if not TRADECORE.exists():
        _unavailable(f"the tradecore script ({TRADECORE})")
    try:
        admin_redis = RedisServer(tmp_path_factory.mktemp("admin-redis"))
    except Unavailable as e:
        _unavailable(str(e))
    admin = os.environ.get(ADMIN_URL_ENV, DEFAULT_ADMIN_URL)
    name = f"tradecore_faults_{secrets.token_hex(6)}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.OperationalError as e:
        _unavailable(f"a reachable PostgreSQL ({ADMIN_URL_ENV}): {str(e).strip()}")
    conninfo = make_conninfo(admin, dbname=name)
    parts = conninfo_to_dict(conninfo)
    database = Database(
        conninfo, str(parts.get("host") or "127.0.0.1"), int(parts.get("port") or 5432)
    )
    shared = secrets_environment()
    env = base_environment(DATABASE_URL=database.url, REDIS_URL=admin_redis.url, **shared)
    try:
        admin_redis.start()
        _cli(["migrate"], env)
        email = f"{name}@example.com"
        created = _cli(
            [
                "admin",
                "create-user",
                "--email",
                email,
                "--password-stdin",
                "--plan",
                "pro",
                "--accept-terms",
            ],
            env,
            stdin=PASSWORD + "\n",
        )
        yield Trader(database, env, shared, email, str(created["user_id"]))
    finally:
        admin_redis.kill()
        _drop(admin, name)


def _drop(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
async def stack(
    trader: Trader, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Stack]:
    """This test's private Redis, Postgres proxy and (once started) tradecore processes."""
    server = RedisServer(tmp_path / "redis")
    await asyncio.to_thread(server.start)
    proxy = TcpProxy(trader.database.host, trader.database.port)
    proxy.start()
    running = Stack(tmp_path, trader, server, proxy)
    request.node.stash[_LOGS] = running
    try:
        yield running
    finally:
        await running.close()
        proxy.close()
        await asyncio.to_thread(server.kill)
        for process in running.processes:
            if process.forced:
                warnings.warn(
                    f"{process.name} did not stop within 5 s of SIGTERM:\n{process.tail()}",
                    stacklevel=1,
                )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    running = item.stash.get(_LOGS, None)
    if running is not None and report.failed:
        report.sections.append(("tradecore processes", running.logs()))
    return report
