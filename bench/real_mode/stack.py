"""The real-mode stack for the benchmark: a throwaway Postgres database, a dedicated Redis
database, provisioned users, and ``tradecore serve`` / ``tradecore worker`` as separate
processes (one of each by default; ``apis`` and ``workers`` start more, sharing the users:
user ``i``'s webhook URL names API process ``i % apis``, and the worker hosts share the users
through their leases, as in production). Everything it creates is removed by ``Stack.close``
(processes ended, database dropped, Redis database flushed).

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


def is_cluster_url(url: str) -> bool:
    """A ``redis+cluster://`` URL (written here, not imported, so that the benchmark also
    drives builds from before cluster support, through PYTHONPATH)."""
    return url.split("://", 1)[0].lower() in ("redis+cluster", "rediss+cluster")


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The ``host:port`` nodes of a cluster URL (no credentials: the benchmark's own)."""
    nodes = urlsplit(url).netloc.rsplit("@", 1)[-1]
    return [(host, int(port)) for host, port in (n.rsplit(":", 1) for n in nodes.split(","))]


def _loopback(url: str) -> None:
    hosts = (
        [host for host, _ in cluster_nodes(url)]
        if is_cluster_url(url)
        else [urlsplit(url).hostname]
    )
    for host in hosts:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise SystemExit(f"the benchmark runs over loopback only, not {host}")


def flush_redis(url: str) -> None:
    """Empty the benchmark's Redis: its database on one server, every master of a cluster."""
    if not is_cluster_url(url):
        clients = [redis.Redis.from_url(url, socket_timeout=2.0)]
    else:
        host, port = cluster_nodes(url)[0]
        seed = redis.Redis(host=host, port=port, socket_timeout=2.0, decode_responses=True)
        try:
            # {"host:port": {"flags": "myself,master", ...}} (redis-py parses CLUSTER NODES)
            nodes = seed.execute_command("CLUSTER NODES")
        finally:
            seed.close()
        masters = [
            address.split("@")[0].rsplit(":", 1)
            for address, node in nodes.items()
            if "master" in node["flags"]
        ]
        clients = [redis.Redis(host=h, port=int(p), socket_timeout=2.0) for h, p in masters]
    for client in clients:
        try:
            client.flushall() if is_cluster_url(url) else client.flushdb()
        finally:
            client.close()


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
    """The database, the Redis database, the users and the processes: ``apis`` API processes
    and ``workers`` worker hosts. ``api`` and ``worker`` are the first of each."""

    def __init__(
        self, workdir: Path, *, apis: int = 1, workers: int = 1, redis_url: str = REDIS_URL
    ) -> None:
        _loopback(ADMIN_URL)
        _loopback(redis_url)
        self.redis_url = redis_url
        if apis < 1 or workers < 1:
            raise SystemExit("at least one API process and one worker host")
        self.workdir = workdir
        self.database = f"tradecore_bench_{secrets.token_hex(4)}"
        self.database_url = urlsplit(ADMIN_URL)._replace(path=f"/{self.database}").geturl()
        self.ports = [free_port() for _ in range(apis)]
        self.base_urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.port = self.ports[0]
        self.base_url = self.base_urls[0]
        self.worker_count = workers
        self.env = {k: v for k, v in os.environ.items() if k not in _CONFIG_VARIABLES}
        self.env.update(
            DATABASE_URL=self.database_url,
            REDIS_URL=redis_url,
            JWT_SECRET=secrets.token_urlsafe(48),
            ENCRYPTION_KEY=secrets.token_urlsafe(32),
            PUBLIC_BASE_URL=self.base_url,
        )
        self.apis: list[Process] = []
        self.workers: list[Process] = []
        self._created = False

    @property
    def api(self) -> Process | None:
        return self.apis[0] if self.apis else None

    @property
    def worker(self) -> Process | None:
        return self.workers[0] if self.workers else None

    def processes(self) -> list[Process]:
        return [*self.apis, *self.workers]

    def pids(self) -> dict[str, int]:
        """Each process's pid by a name: ``api``/``worker`` for one of each, else ``api1``,
        ``api2``..., ``worker1``... (the CPU meters report one share per name)."""
        named: dict[str, int] = {}
        for kind, group in (("api", self.apis), ("worker", self.workers)):
            for index, process in enumerate(group, start=1):
                named[kind if len(group) == 1 else f"{kind}{index}"] = process.pid
        return named

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
        container = build_container(
            Settings(database_url=self.database_url, redis_url=self.redis_url)
        )
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
                    "webhook_url": new.webhook_url(self.base_urls[index % len(self.base_urls)]),
                    "webhook_secret": new.webhook_secret,
                }

            accounts = list(await asyncio.gather(*(one(i) for i in range(count))))
        return accounts

    # -- processes ---------------------------------------------------------------------------

    def start_api(self) -> Process:
        """Start every API process; the first."""
        for index, (port, base_url) in enumerate(zip(self.ports, self.base_urls, strict=True)):
            name = "api" if len(self.ports) == 1 else f"api{index + 1}"
            args = [str(TRADECORE), "serve", "--host", "127.0.0.1", "--port", str(port)]
            process = Process(name, args, self.env, self.workdir / f"{name}.log")
            self.apis.append(process)
            asyncio.run(self._wait_ready(process, base_url))
        return self.apis[0]

    def start_worker(self) -> Process:
        """Start every worker host; the first."""
        for index in range(self.worker_count):
            name = "worker" if self.worker_count == 1 else f"worker{index + 1}"
            args = [str(TRADECORE), "worker"]
            self.workers.append(Process(name, args, self.env, self.workdir / f"{name}.log"))
        time.sleep(1.0)  # opening the pool and Redis takes well under a second
        for process in self.workers:
            if not process.running():
                raise SystemExit(f"{process.name} exited:\n{process.tail()}")
        return self.workers[0]

    def restart_worker(self) -> Process:
        """Stop every worker host, then start one (the memory phase measures one process)."""
        for process in self.workers:
            process.stop()
        self.workers.clear()
        self.worker_count = 1
        return self.start_worker()

    async def _wait_ready(self, api: Process, base_url: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if not api.running():
                    raise SystemExit(f"{api.name} exited:\n{api.tail()}")
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(f"{base_url}/health/ready") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise SystemExit(f"{api.name} not ready within {START_TIMEOUT_S} s:\n{api.tail()}")

    # -- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """End the processes, drop the database, flush the Redis database. Idempotent."""
        tear_down(self.processes(), self.database if self._created else None, self.workdir)
        self._created = False
        with contextlib.suppress(redis.RedisError):
            self._flush_redis()

    def _flush_redis(self) -> None:
        flush_redis(self.redis_url)

    def describe(self) -> dict[str, Any]:
        return {
            "database": self.database,
            "redis_url": self.redis_url,
            "base_url": self.base_url,
            "base_urls": self.base_urls,
            "workers": len(self.workers),
        }


def tear_down(processes: Sequence[Process], database: str | None, workdir: Path) -> None:
    """End ``processes``, drop ``database`` (None: nothing to drop) and remove ``workdir``
    (kept with BENCH_KEEP_LOGS set): a stack's teardown but for its Redis."""
    for process in processes:
        with contextlib.suppress(Exception):
            process.stop()
    if database is not None:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(database)))
    if not os.environ.get("BENCH_KEEP_LOGS"):
        shutil.rmtree(workdir, ignore_errors=True)


def dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
