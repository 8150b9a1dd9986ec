"""The real-mode stack for the benchmark: a throwaway Postgres database, a dedicated Redis
database, provisioned users, and ``tradecore serve`` / ``tradecore worker`` as separate
processes. Everything it creates is removed by ``Stack.close`` (processes ended, database
dropped, Redis database flushed).

Loopback only: the admin URL and the Redis URL must point at 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psycopg
import redis
from dependency_injector import providers
from psycopg import sql

from tradecore.identity import Plan
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.postgres import migrate
from tradecore_entrypoints.container import build_container
from tradecore_entrypoints.settings import Settings

TRADECORE = Path(sys.executable).with_name("tradecore")
ADMIN_URL = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
PASSWORD = "bench-password-not-secret-1"
PROVISION_CONCURRENCY = 32
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0

# Variables of the caller's environment that would change what the processes do.
_CONFIG_VARIABLES = (
    "TRADECORE_ENV",
    "DATABASE_URL",
    "REDIS_URL",
    "PUBLIC_BASE_URL",
    "TRUSTED_PROXIES",
    "RATE_LIMIT_PER_MINUTE",
    "PLAN_DAILY_ORDER_CAPS",
    "PAPER_BROKER_LATENCY_MS",
    "PAPER_BROKER_DISCONNECT_EVERY",
    "WORKER_IDLE_TIMEOUT_S",
    "WORKER_MARK_TTL_S",
    "WEBHOOK_RESPONSE_WAIT_S",
)


def _loopback(url: str) -> None:
    host = urlsplit(url).hostname
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise SystemExit(f"the benchmark runs over loopback only, not {host}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ReusedHash:
    """A PasswordHasher that hashes once (Argon2id) and stores that hash for every bench
    user: nobody logs in during the benchmark, and 10,000 real hashes would take minutes."""

    def __init__(self) -> None:
        self._real = Argon2PasswordHasher()
        self._encoded: str | None = None

    async def hash(self, password: str) -> str:
        if self._encoded is None:
            self._encoded = await self._real.hash(password)
        return self._encoded

    async def verify(self, encoded: str, password: str) -> bool:
        return await self._real.verify(encoded, password)

    def needs_rehash(self, encoded: str) -> bool:
        return False

    async def verify_dummy(self, password: str) -> None:
        await self._real.verify_dummy(password)


class Process:
    """One tradecore process with its output in a log file."""

    def __init__(self, name: str, args: Sequence[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._file = log.open("wb")
        self.popen = subprocess.Popen(
            list(args), env=env, stdout=self._file, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S."""
        if self.running():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(STOP_TIMEOUT_S)
        self._file.close()


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak) and RssAnon of a process, in KiB."""
    wanted = {"VmRSS", "VmHWM", "RssAnon", "Threads"}
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            found[key] = int(value.split()[0])
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, summed over cores."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def wait_quiet(max_wait_s: float, *, seconds: int = 3, max_busy_percent: float = 15.0) -> float:
    """Wait (at most ``max_wait_s``) until the machine has been nearly idle for ``seconds``
    seconds in a row; returns the busy percent (of one core) of the last second."""
    deadline = time.monotonic() + max_wait_s
    quiet = 0
    busy_percent = float("nan")
    while True:
        before = machine_busy_seconds()
        time.sleep(1.0)
        busy_percent = 100 * (machine_busy_seconds() - before)
        quiet = quiet + 1 if busy_percent <= max_busy_percent else 0
        if quiet >= seconds or time.monotonic() >= deadline:
            return busy_percent


class Stack:
    """The database, the Redis database, the users and the two processes."""

    def __init__(self, workdir: Path) -> None:
        _loopback(ADMIN_URL)
        _loopback(REDIS_URL)
        self.workdir = workdir
        self.database = f"tradecore_bench_{secrets.token_hex(4)}"
        self.database_url = urlsplit(ADMIN_URL)._replace(path=f"/{self.database}").geturl()
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k not in _CONFIG_VARIABLES}
        self.env.update(
            DATABASE_URL=self.database_url,
            REDIS_URL=REDIS_URL,
            JWT_SECRET=secrets.token_urlsafe(48),
            ENCRYPTION_KEY=secrets.token_urlsafe(32),
            PUBLIC_BASE_URL=self.base_url,
        )
        self.api: Process | None = None
        self.worker: Process | None = None
        self._created = False

    # -- setup -------------------------------------------------------------------------------

    def create(self) -> None:
        """Create and migrate the database; flush the Redis database."""
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self._created = True
        asyncio.run(migrate(self.database_url))
        self._flush_redis()

    async def provision(self, count: int, *, prefix: str = "u") -> list[dict[str, str]]:
        """``count`` pro users (terms accepted), each with one verified paper account; their
        webhook URLs and secrets, in creation order."""
        container = build_container(Settings(database_url=self.database_url, redis_url=REDIS_URL))
        container.shared.hasher.override(providers.Object(ReusedHash()))
        system = container.services.system()
        accounts: list[dict[str, str]] = []
        async with system.running():
            gate = asyncio.Semaphore(PROVISION_CONCURRENCY)

            async def one(index: int) -> dict[str, str]:
                async with gate:
                    user = await system.provisioning.create_user(
                        f"{prefix}{index}@bench.example.com",
                        PASSWORD,
                        plan=Plan.PRO,
                        terms_version="1",
                    )
                    new = await system.provisioning.create_account(
                        user, f"bench {index}", credentials_verified=True
                    )
                return {
                    "user_id": user.id,
                    "webhook_url": new.webhook_url(self.base_url),
                    "webhook_secret": new.webhook_secret,
                }

            accounts = list(await asyncio.gather(*(one(i) for i in range(count))))
        return accounts

    # -- processes ---------------------------------------------------------------------------

    def start_api(self) -> Process:
        args = [str(TRADECORE), "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        self.api = Process("api", args, self.env, self.workdir / "api.log")
        asyncio.run(self._wait_ready())
        return self.api

    def start_worker(self) -> Process:
        self.worker = Process(
            "worker", [str(TRADECORE), "worker"], self.env, self.workdir / "worker.log"
        )
        time.sleep(1.0)  # opening the pool and Redis takes well under a second
        if not self.worker.running():
            raise SystemExit(f"worker exited:\n{self.worker.tail()}")
        return self.worker

    def restart_worker(self) -> Process:
        if self.worker is not None:
            self.worker.stop()
        return self.start_worker()

    async def _wait_ready(self) -> None:
        assert self.api is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if not self.api.running():
                    raise SystemExit(f"api exited:\n{self.api.tail()}")
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(f"{self.base_url}/health/ready") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise SystemExit(f"api not ready within {START_TIMEOUT_S} s:\n{self.api.tail()}")

    # -- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """End the processes, drop the database, flush the Redis database. Idempotent."""
        for process in (self.api, self.worker):
            if process is not None:
                with contextlib.suppress(Exception):
                    process.stop()
        if self._created:
            with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(self.database)
                    )
                )
            self._created = False
        with contextlib.suppress(redis.RedisError):
            self._flush_redis()
        if not os.environ.get("BENCH_KEEP_LOGS"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _flush_redis(self) -> None:
        client = redis.Redis.from_url(REDIS_URL, socket_timeout=2.0)
        try:
            client.flushdb()
        finally:
            client.close()

    def describe(self) -> dict[str, Any]:
        return {"database": self.database, "redis_url": REDIS_URL, "base_url": self.base_url}


def dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
