"""The ``tradecore`` command line (docs/api.md lists the commands).

Every command that reads configuration exits with status 2 and a one-line reason on stderr
when it is bad (``tradecore: JWT_SECRET must be at least 32 bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

import click
import psycopg
from aiohttp import web

from tradecore.errors import StoreUnavailable
from tradecore_adapters.http import runner_options
from tradecore_adapters.postgres import migrate
from tradecore_adapters.postgres.partitions import (
    PartitioningMissing,
    Retention,
    maintain_partitions,
)
from tradecore_entrypoints.admin import (
    admin_create_account,
    admin_create_user,
    admin_revoke_sessions,
    seed_demo,
)
from tradecore_entrypoints.audit_verification import is_seal, verify_audit_database
from tradecore_entrypoints.container import Application, build_container, make_app
from tradecore_entrypoints.logs import configure_logging
from tradecore_entrypoints.loop import run_fast, settle_heap
from tradecore_entrypoints.observability import metrics_for, serving_metrics
from tradecore_entrypoints.settings import ConfigError, Settings
from tradecore_entrypoints.system import System

log = logging.getLogger("tradecore.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
EMBEDDED_ADMIN = (
    "admin commands need DATABASE_URL: the embedded runtime keeps its data inside the serving "
    "process (use `tradecore serve --demo` for a ready user and account)"
)
EMBEDDED_VERIFY = (
    "verify-audit needs DATABASE_URL: the embedded runtime keeps its audit log in the memory "
    "of the serving process, so there is no stored chain to verify"
)


def _fail(reason: str) -> NoReturn:
    click.echo(f"tradecore: {reason}", err=True)
    sys.exit(2)


@click.group()
@click.version_option(package_name="tradecore", prog_name="tradecore")
@click.option("--log-level", default="WARNING", show_default=True, help="Python log level.")
def main(log_level: str) -> None:
    """tradecore: trading automation with per-user workers."""
    # LOG_FORMAT is applied by serve and worker once the settings are read
    configure_logging(level=log_level)


@main.command()
def demo() -> None:
    """Walk through the embedded system: reversals, a replay, a stale alert, a fill."""
    from tradecore_entrypoints.demo import run_demo

    asyncio.run(run_demo(click.echo))


@main.command()
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--demo",
    "seed_demo",
    is_flag=True,
    help="Seed a demo user and paper account and print them as one JSON line.",
)
def serve(host: str, port: int, seed_demo: bool) -> None:
    """Serve the HTTP API (the embedded runtime without DATABASE_URL and REDIS_URL)."""
    try:
        settings = Settings.from_env()
        if seed_demo and settings.production:
            raise ConfigError("--demo is refused with TRADECORE_ENV=production")
        configure_logging(settings.log_format)
        run_fast(serve_forever(settings, host, port, demo=seed_demo, echo=click.echo))
    except ConfigError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"cannot listen on {host}:{port} ({e.strerror or e})")
    except KeyboardInterrupt:
        pass


@main.group()
def admin() -> None:
    """Administrative commands (need DATABASE_URL)."""


def _admin_container() -> Application:
    try:
        settings = Settings.from_env()
        if settings.runtime == "embedded":
            raise ConfigError(EMBEDDED_ADMIN)
        return build_container(settings)
    except ConfigError as e:
        _fail(str(e))


def _run_admin(
    container: Application, work: Callable[[], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Run one admin action with the runtime's connections open; one-line failures."""

    async def run() -> dict[str, Any]:
        system: System = container.services.system()
        async with system.running(workers=False):
            return await work()

    try:
        return asyncio.run(run())
    except ValueError as e:
        _fail(str(e))
    except StoreUnavailable as e:
        _fail(f"store unavailable: {e}")


@main.command("migrate")
def migrate_command() -> None:
    """Apply the Postgres schema migrations (idempotent); prints {"applied": [...]}."""
    try:
        settings = Settings.from_env()
        if settings.database_url is None:
            raise ConfigError("DATABASE_URL is required for migrate")
        applied = asyncio.run(migrate(settings.database_url))
        # the months ahead too (never a drop), so every deployment has them
        ahead = asyncio.run(maintain_partitions(settings.database_url, now=datetime.now(UTC)))
    except ConfigError as e:
        _fail(str(e))
    except StoreUnavailable as e:  # its text already says "database unavailable: <cause>"
        _fail(f"{e}; check that PostgreSQL runs and DATABASE_URL points at it")
    click.echo(json.dumps({"applied": applied, "partitions_created": list(ahead.created)}))


AUDIT_RETENTION_ENV = "TRADECORE_AUDIT_RETENTION_MONTHS"
ORDER_RETENTION_ENV = "TRADECORE_ORDER_RETENTION_MONTHS"
DEFAULT_AUDIT_RETENTION = "24"
DEFAULT_ORDER_RETENTION = "forever"


class _Months(click.ParamType[int | None, Any]):
    """A retention: whole months (at least 1), or ``forever``."""

    name = "months"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | None:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "forever":
            return None
        if not text.isdigit() or int(text) < 1:
            self.fail(f"{value!r} is neither a number of months (1 or more) nor 'forever'")
        return int(text)


@main.command("partitions")
@click.option(
    "--audit-keep-months",
    type=_Months(),
    envvar=AUDIT_RETENTION_ENV,
    default=DEFAULT_AUDIT_RETENTION,
    show_default=True,
    help=f"Whole months of audit log kept, or 'forever' (env {AUDIT_RETENTION_ENV}).",
)
@click.option(
    "--orders-keep-months",
    type=_Months(),
    envvar=ORDER_RETENTION_ENV,
    default=DEFAULT_ORDER_RETENTION,
    show_default=True,
    help=f"Whole months of order history kept, or 'forever' (env {ORDER_RETENTION_ENV}).",
)
def partitions_command(audit_keep_months: int | None, orders_keep_months: int | None) -> None:
    """Create the coming months' partitions of order_history and audit_logs and drop the
    months past retention (docs/operations.md, "Partitions and retention"). Idempotent;
    concurrent runs take turns. Prints what it did as one JSON line."""
    try:
        settings = Settings.from_env()
        if settings.database_url is None:
            raise ConfigError("DATABASE_URL is required for partitions")
        retention = Retention(order_history=orders_keep_months, audit_logs=audit_keep_months)
        done = asyncio.run(
            maintain_partitions(settings.database_url, now=datetime.now(UTC), retention=retention)
        )
    except ConfigError as e:
        _fail(str(e))
    except PartitioningMissing as e:
        _fail(str(e))
    except StoreUnavailable as e:
        _fail(f"{e}; nothing was changed in the step that failed: run again")
    click.echo(json.dumps(done.as_json()))


@main.command()
def worker() -> None:
    """Run a worker host: per-user workers (under leases), fill verification, paper books."""
    try:
        settings = Settings.from_env()
        if settings.database_url is None or settings.redis_url is None:
            raise ConfigError("tradecore worker needs DATABASE_URL and REDIS_URL")
        configure_logging(settings.log_format)
        run_fast(run_worker(settings))
    except ConfigError as e:
        _fail(str(e))
    except StoreUnavailable as e:
        _fail(f"store unavailable: {e}")
    except KeyboardInterrupt:
        pass


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Start a worker host, run until ``stop`` is set or SIGINT/SIGTERM arrives, stop."""
    container = build_container(settings)
    metrics = metrics_for(container, settings)
    system: System = container.services.system()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    async with (
        system.running(workers=True),
        serving_metrics(metrics, system, settings, worker_host=True),
    ):
        log.warning("tradecore worker host %s running", system.host.holder)
        settle_heap()
        await stop.wait()


@admin.command("create-user")
@click.option("--email", required=True)
@click.option("--password-stdin", is_flag=True, required=True, help="Read the password from stdin.")
@click.option("--plan", type=click.Choice(["free", "pro"]), default="free", show_default=True)
@click.option("--accept-terms", is_flag=True, help="Record the current terms as accepted.")
@click.option("--admin", "is_admin", is_flag=True, help="Make the user an administrator.")
def create_user(
    email: str, password_stdin: bool, plan: str, accept_terms: bool, is_admin: bool
) -> None:
    """Create a user; prints {"user_id": ...}."""
    container = _admin_container()
    password = sys.stdin.readline().rstrip("\r\n")
    result = _run_admin(
        container,
        lambda: admin_create_user(container, email, password, plan, accept_terms, admin=is_admin),
    )
    click.echo(json.dumps(result))


@admin.command("create-account")
@click.option("--email", required=True)
@click.option("--name", required=True)
@click.option("--broker", default="paper", show_default=True)
@click.option("--verified", is_flag=True, help="Mark the broker credentials as verified.")
def create_account(email: str, name: str, broker: str, verified: bool) -> None:
    """Create a trading account; prints its id, webhook URL, token and secret."""
    container = _admin_container()
    result = _run_admin(
        container, lambda: admin_create_account(container, email, name, broker, verified)
    )
    click.echo(json.dumps(result))


@admin.command("revoke-sessions")
@click.option("--email", required=True)
def revoke_sessions(email: str) -> None:
    """Revoke every session of a user."""
    container = _admin_container()
    result = _run_admin(container, lambda: admin_revoke_sessions(container, email))
    click.echo(json.dumps(result))


@admin.command("verify-audit")
@click.option(
    "--expect-head",
    default=None,
    metavar="SEAL",
    help="A head printed by an earlier run: fail unless the chain still holds that entry.",
)
def verify_audit(expect_head: str | None) -> None:
    """Walk the sealed audit chain. Prints {"ok": true, "entries", "head"} and exits 0, or
    the first entry that does not hold ({"ok": false, "entry_id", "kind", "detail"}) and
    exits 1."""
    try:
        settings = Settings.from_env()
    except ConfigError as e:
        _fail(str(e))
    if settings.database_url is None:
        _fail(EMBEDDED_VERIFY)
    if expect_head is not None and not is_seal(expect_head):
        _fail("--expect-head must be a seal: 64 lowercase hexadecimal characters")
    if logging.getLogger().level >= logging.WARNING:
        # the pool warns at every failed connection attempt; the reason comes as one line
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    try:
        result = asyncio.run(verify_audit_database(settings.database_url, expect_head))
    except StoreUnavailable as e:
        _fail(f"cannot read the audit log: {e}")
    except psycopg.errors.UndefinedTable:
        _fail("the audit log tables are missing: run `tradecore migrate`")
    click.echo(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


async def serve_forever(
    settings: Settings,
    host: str,
    port: int,
    *,
    demo: bool,
    echo: Callable[[str], Any],
    stop: asyncio.Event | None = None,
) -> None:
    """Bind, print the demo line (with ``demo``), serve until ``stop`` is set or SIGINT or
    SIGTERM arrives, then shut down cleanly."""
    sock = socket.create_server((host, port), family=_family(host), reuse_port=False)
    bound_port = sock.getsockname()[1]
    container = build_container(settings, base_url=settings.base_url(host, bound_port))
    metrics = metrics_for(container, settings)
    app = make_app(container)
    line = await seed_demo(container) if demo else None
    runner = web.AppRunner(app, handle_signals=False, **runner_options())
    await runner.setup()
    settle_heap()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    try:
        await web.SockSite(runner, sock).start()
        if line is not None:
            echo(json.dumps(line))
        log.warning(
            "tradecore serving on %s (%s runtime)",
            settings.base_url(host, bound_port),
            settings.runtime,
        )
        system = container.services.system()
        async with serving_metrics(metrics, system, settings, worker_host=False):
            await stop.wait()
    finally:
        await runner.cleanup()
        sock.close()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
