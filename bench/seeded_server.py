"""The app ``tradecore serve`` runs, seeded for the webhook benchmark.

Builds the server exactly as ``tradecore serve`` does (``Settings.from_env``,
``build_container``, ``make_app``, ``web.AppRunner`` with ``runner_options()``, the collector
settings of ``settle_heap``, a ``SockSite`` on a pre-bound socket, ``--log-level WARNING``),
seeds it, writes the accounts to a JSON file and serves until SIGINT or SIGTERM:

* ``--users N`` webhook users: plan pro, current terms accepted, one paper account each with
  verified credentials. They share one Argon2id hash (hashing 1,000 passwords would take a
  minute and measures nothing here); they never log in.
* ``--login-users M`` login users, created through ``Provisioning.create_user`` (a real
  Argon2id hash each, the library defaults) for the concurrent-login scenario.

The accounts file (written atomically once the socket accepts connections)::

    {"base_url": ..., "pid": ...,
     "accounts": [{"email", "webhook_url", "webhook_secret", "trading_account_id"}, ...],
     "logins": [{"email", "password"}, ...]}

Run from the repository root: ``.venv/bin/python bench/seeded_server.py --port 8099
--users 1000 --login-users 20 --out bench/results/accounts.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from tradecore.identity import Plan, User
from tradecore_adapters.http import runner_options
from tradecore_entrypoints.container import Application, build_container, make_app
from tradecore_entrypoints.loop import run_fast, settle_heap
from tradecore_entrypoints.settings import ConfigError, Settings

log = logging.getLogger("bench.seeded_server")


async def seed(container: Application, users: int, login_users: int) -> dict[str, Any]:
    """Create the webhook users with their accounts and the login users; return the file's
    content (without base_url and pid)."""
    settings: Settings = container.core.settings()
    system = container.services.system()
    hasher = container.shared.hasher()
    shared_hash = await hasher.hash(secrets.token_urlsafe(18))
    now = system.clock.now()
    accounts: list[dict[str, str]] = []
    for i in range(users):
        user = User(
            id=system.random.new_id(),
            email=f"bench-{i:05d}@example.com",
            password_hash=shared_hash,
            plan=Plan.PRO,
            created_at=now,
            accepted_terms_version=settings.terms_version,
        )
        if not await system.users.add(user):
            raise RuntimeError(f"duplicate bench user {user.email}")
        new = await system.provisioning.create_account(
            user, f"Bench paper {i}", credentials_verified=True
        )
        accounts.append(
            {
                "email": user.email,
                "webhook_url": new.webhook_url(container.core.base_url()),
                "webhook_secret": new.webhook_secret,
                "trading_account_id": new.account.id,
            }
        )
    logins: list[dict[str, str]] = []
    for i in range(login_users):
        password = secrets.token_urlsafe(18)
        user = await system.provisioning.create_user(
            f"login-{i:03d}@example.com",
            password,
            plan=Plan.PRO,
            terms_version=settings.terms_version,
        )
        logins.append({"email": user.email, "password": password})
    return {"accounts": accounts, "logins": logins}


def write_atomically(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".tmp")
    partial.write_text(json.dumps(document))
    os.replace(partial, path)


async def serve(args: argparse.Namespace) -> None:
    """``cli.serve_forever`` with the bench seeding in place of ``--demo``."""
    settings = Settings.from_env()
    if settings.runtime != "embedded":
        raise ConfigError("the benchmark measures the embedded runtime: unset DATABASE_URL")
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.create_server((args.host, args.port), family=family, reuse_port=False)
    bound_port = sock.getsockname()[1]
    container = build_container(settings, base_url=settings.base_url(args.host, bound_port))
    app = make_app(container)
    started = time.perf_counter()
    document = await seed(container, args.users, args.login_users)
    seeded_s = time.perf_counter() - started
    runner = web.AppRunner(app, handle_signals=False, **runner_options())
    await runner.setup()
    settle_heap()  # as `tradecore serve` does once it is set up
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await web.SockSite(runner, sock).start()
        base_url = settings.base_url(args.host, bound_port)
        write_atomically(args.out, {"base_url": base_url, "pid": os.getpid(), **document})
        log.warning(
            "seeded %d webhook users and %d login users in %.1f s; serving on %s",
            args.users,
            args.login_users,
            seeded_s,
            base_url,
        )
        await stop.wait()
    finally:
        await runner.cleanup()
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--users", type=int, default=1000, help="webhook users (one account each)")
    parser.add_argument("--login-users", type=int, default=0, help="users for the login load")
    parser.add_argument("--out", type=Path, default=Path("bench/results/accounts.json"))
    args = parser.parse_args()
    if args.host not in ("127.0.0.1", "::1"):
        parser.error("the benchmark serves on loopback only")
    # The same logging as `tradecore serve` (its default --log-level WARNING).
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    try:
        run_fast(serve(args))  # the event loop of `tradecore serve`
    except ConfigError as e:
        print(f"seeded_server: {e}", file=sys.stderr)
        sys.exit(2)
    with contextlib.suppress(FileNotFoundError):
        args.out.unlink()


if __name__ == "__main__":
    main()
