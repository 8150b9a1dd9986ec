"""``ReferenceStack``: the reference design in place of ``stack.Stack`` for ``run.py``'s
latency and throughput phases (``--design reference``).

A throwaway database with the reference's own tables (dropped at close), the benchmark's
Redis database (``stack.REDIS_URL``, database 13 unless BENCH_REDIS_URL says otherwise;
flushed at start and close), N accounts provisioned with tokens and secrets (their documents
in ``Stack.provision``'s shape, for ``load.accounts_from``), and one API process and one
worker host, ``python -m reference.api`` / ``reference.worker`` on this interpreter, named
``api`` and ``worker`` as ``Stack.pids`` names them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import redis
from psycopg import sql
from stack import (
    ADMIN_URL,
    REDIS_URL,
    START_TIMEOUT_S,
    Process,
    _loopback,
    flush_redis,
    free_port,
    tear_down,
)

HERE = Path(__file__).resolve().parent.parent  # bench/real_mode: where ``reference`` lives

SCHEMA = """
CREATE TABLE accounts (
    id text PRIMARY KEY, user_id text NOT NULL, token_hash text NOT NULL UNIQUE,
    secret_hash text NOT NULL, allowed_ips text[] NOT NULL DEFAULT '{}',
    max_request_age integer NOT NULL DEFAULT 300, daily_cap integer NOT NULL DEFAULT 1000,
    max_quantity numeric NOT NULL DEFAULT 1000000, real_orders boolean NOT NULL DEFAULT true,
    credentials_verified boolean NOT NULL DEFAULT true, disabled boolean NOT NULL DEFAULT false
);
CREATE TABLE intents (
    id text COLLATE "C" PRIMARY KEY, request_id text NOT NULL, user_id text NOT NULL,
    account_id text NOT NULL, symbol text NOT NULL, action text NOT NULL,
    order_type text NOT NULL, quantity numeric NOT NULL, status text NOT NULL,
    fingerprint text NOT NULL, reply_to text NOT NULL, created_at timestamptz NOT NULL,
    client_order_id text UNIQUE,  -- idempotent placement by client order id
    fill_price numeric, fill_quantity numeric NOT NULL DEFAULT 0, position_before numeric,
    filled_at timestamptz,
    UNIQUE (user_id, fingerprint)  -- the durable replay fingerprint
);
CREATE INDEX intents_by_user ON intents (user_id, created_at DESC);
CREATE INDEX intents_queued ON intents (created_at) WHERE status = 'queued';
CREATE TABLE audit_log (  -- tradecore's audit_logs columns
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, user_id text, action text NOT NULL,
    success boolean NOT NULL, ip_address inet NOT NULL, user_agent text NOT NULL,
    request_path text NOT NULL, request_method text NOT NULL, error_message text,
    resource_type text, resource_id text, metadata jsonb NOT NULL,
    created_at timestamptz NOT NULL, previous_seal text NOT NULL, seal text NOT NULL
);
CREATE INDEX audit_log_user_time ON audit_log (user_id, created_at DESC);
CREATE TABLE chain_head (seal text NOT NULL);
INSERT INTO chain_head VALUES (repeat('0', 64));
CREATE TABLE books (user_id text PRIMARY KEY, cash numeric NOT NULL, holdings jsonb NOT NULL);
"""


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ReferenceStack:
    """What ``run.py`` uses of ``Stack`` for the latency and throughput phases."""

    def __init__(self, workdir: Path, *, redis_url: str = REDIS_URL) -> None:
        _loopback(ADMIN_URL)
        _loopback(redis_url)
        self.workdir, self.redis_url = workdir, redis_url
        self.database = f"reference_bench_{secrets.token_hex(4)}"
        self.database_url = urlsplit(ADMIN_URL)._replace(path=f"/{self.database}").geturl()
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "PYTHONPATH": str(HERE)}
        self.apis: list[Process] = []
        self.workers: list[Process] = []
        self._created = False

    def processes(self) -> list[Process]:
        return [*self.apis, *self.workers]

    def pids(self) -> dict[str, int]:
        return {"api": self.apis[0].pid, "worker": self.workers[0].pid}

    def create(self) -> None:
        """Create the database and its tables; flush the Redis database."""
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self._created = True
        with psycopg.connect(self.database_url) as conn:
            conn.execute(SCHEMA)
        flush_redis(self.redis_url)

    async def provision(self, count: int) -> list[dict[str, str]]:
        """``count`` accounts (one per user, real orders allowed, credentials verified):
        their webhook URLs, secrets and user ids, in creation order."""
        documents, rows = [], []
        for _ in range(count):
            user_id, token, secret = (
                str(uuid.uuid4()),
                secrets.token_urlsafe(32),
                secrets.token_hex(16),
            )
            rows.append((str(uuid.uuid4()), user_id, sha256(token), sha256(secret)))
            url = f"{self.base_url}/webhook/{token}/order"
            documents.append({"user_id": user_id, "webhook_url": url, "webhook_secret": secret})
        async with await psycopg.AsyncConnection.connect(self.database_url) as conn:
            copy_sql = "COPY accounts (id, user_id, token_hash, secret_hash) FROM STDIN"
            async with conn.cursor() as cursor, cursor.copy(copy_sql) as copy:
                for row in rows:
                    await copy.write_row(row)
        return documents

    def _start(self, name: str, module: str, *extra: str) -> Process:
        args = [sys.executable, "-m", module, "--database-url", self.database_url]
        args += ["--redis-url", self.redis_url, *extra]
        return Process(name, args, self.env, self.workdir / f"{name}.log")

    def start_api(self) -> Process:
        """Start the API process and wait until it serves (its accounts loaded)."""
        api = self._start("api", "reference.api", "--port", str(self.port), "--api-id", "api1")
        self.apis.append(api)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not api.running():
                raise SystemExit(f"api exited:\n{api.tail()}")
            ready = f"{self.base_url}/health/ready"
            with contextlib.suppress(OSError), urllib.request.urlopen(ready, timeout=1) as answer:
                if answer.status == 200:
                    return api
            time.sleep(0.1)
        raise SystemExit(f"api not ready within {START_TIMEOUT_S} s:\n{api.tail()}")

    def start_worker(self) -> Process:
        worker = self._start("worker", "reference.worker")
        self.workers.append(worker)
        time.sleep(1.0)
        if not worker.running():
            raise SystemExit(f"worker exited:\n{worker.tail()}")
        return worker

    def close(self) -> None:
        """End the processes, drop the database, flush the Redis database. Idempotent."""
        tear_down(self.processes(), self.database if self._created else None, self.workdir)
        self._created = False
        with contextlib.suppress(redis.RedisError):
            flush_redis(self.redis_url)

    def describe(self) -> dict[str, Any]:
        return {
            "design": "reference",
            "database": self.database,
            "redis_url": self.redis_url,
            "base_url": self.base_url,
            "base_urls": [self.base_url],
            "workers": len(self.workers),
        }
