"""Process management for the fault tests: tradecore's API and worker hosts as separate OS
processes against real Postgres and Redis, and the faults the tests inject.

* ``RedisServer``: a private ``redis-server`` on a free loopback port (no persistence), which a
  test may kill and start again on the same port, or flush, without touching the shared one.
* ``TcpProxy``: the processes reach Postgres through it. ``stop`` closes every connection and
  refuses new ones (Postgres is "down"); ``start`` forwards again on the same port.
* ``Stack``: one test's processes (``tradecore serve`` and ``tradecore worker``) with their
  environment, each one's output in a log file under the test's ``tmp_path``; ``close`` ends
  every process (SIGTERM, then SIGKILL).
* ``Api``: the HTTP calls a user makes (webhook, login, dashboard order, order lookup) and,
  as a ``Browser`` (a cookie session with its CSRF token), the account management calls.
* ``Database``: the module's throwaway database, for reading what the processes wrote.

Every wait is bounded; a timeout names what was awaited and shows the processes' logs.
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
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import attrs
import psycopg
import redis

from tradecore_adapters.redis.messaging import mark_key, processing_key
from tradecore_entrypoints.settings import VARIABLES

T = TypeVar("T")

TRADECORE = Path(sys.executable).with_name("tradecore")
PASSWORD = "correct horse battery staple"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
CLI_TIMEOUT_S = 30.0
POLL_S = 0.05
HTTP_TIMEOUT_S = 20.0
SETTLE_TIMEOUT_S = 15.0

# Variables of the operator's environment that would change what the processes do.
_CONFIG_VARIABLES = frozenset(
    name
    for variable in VARIABLES
    for name in (variable.name, f"{variable.name}_FILE" if variable.secret else variable.name)
)
"""Every variable ``Settings.from_env`` reads (with the ``*_FILE`` forms of the secrets): the
test processes get only what a test gives them, whatever the surrounding environment holds."""


class Unavailable(Exception):
    """A service the fault tests need is missing (skip, or fail in CI)."""


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def base_environment(**variables: str) -> dict[str, str]:
    """The test process's environment without tradecore's configuration, plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if k not in _CONFIG_VARIABLES}
    env.update(variables)
    return env


def secrets_environment() -> dict[str, str]:
    """JWT_SECRET and ENCRYPTION_KEY, shared by every process of one test."""
    return {"JWT_SECRET": secrets.token_urlsafe(48), "ENCRYPTION_KEY": secrets.token_urlsafe(32)}


async def eventually(
    check: Callable[[], Awaitable[bool]],
    what: str,
    *,
    timeout_s: float = START_TIMEOUT_S,
    diagnose: Callable[[], str] | None = None,
) -> None:
    """Poll ``check`` until it is true; AssertionError naming ``what`` after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if await check():
            return
        if loop.time() >= deadline:
            detail = "" if diagnose is None else "\n" + diagnose()
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{detail}")
        await asyncio.sleep(POLL_S)


# --- Redis ------------------------------------------------------------------------------------


class RedisServer:
    """A private redis-server on ``port`` (kept across ``kill`` and ``start``). Its methods
    block; async code calls them through ``asyncio.to_thread``."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        executable = shutil.which("redis-server")
        if executable is None:
            raise Unavailable("redis-server is not installed")
        self.executable = executable
        self.workdir = workdir
        self.port = port or free_port()
        self.log = workdir / f"redis-{self.port}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A short-lived synchronous client (close it)."""
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=2.0, socket_connect_timeout=2.0
        )

    def start(self) -> None:
        """Start the server and return once it answers PING."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    self.executable,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.workdir),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ping():
            if self._process.poll() is not None:
                raise AssertionError(
                    f"redis-server exited ({self._process.returncode})\n{_tail(self.log)}"
                )
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"redis-server on port {self.port} did not answer\n{_tail(self.log)}"
                )
            time.sleep(POLL_S)

    def kill(self) -> None:
        """SIGKILL: the server vanishes with its data, as in a crash."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
        if process is not None:
            process.wait(STOP_TIMEOUT_S)

    def flushall(self) -> None:
        """FLUSHALL: every key is gone, as after a failover to an empty replica."""
        self._with_client(lambda client: client.flushall())

    def _with_client(self, call: Callable[[redis.Redis], T]) -> T:
        """``call`` on a short-lived client, closed after it."""
        client = self.client()
        try:
            return call(client)
        finally:
            client.close()

    def delete(self, key: str) -> None:
        self._with_client(lambda client: client.delete(key))

    def exists(self, key: str) -> bool:
        return bool(self._with_client(lambda client: client.exists(key)))

    def length(self, key: str) -> int:
        """LLEN of a list (0 when it does not exist)."""
        return int(self._with_client(lambda client: client.llen(key)))

    def _ping(self) -> bool:
        client = self.client()
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


# --- Postgres ---------------------------------------------------------------------------------


class TcpProxy:
    """A TCP forwarder on 127.0.0.1 to ``target``, run by its own thread and event loop, so
    it keeps forwarding while a test waits on anything."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tcp-proxy", daemon=True
        )
        self._thread.start()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self.port = 0

    def start(self) -> None:
        """Accept and forward (on the same port as before, once one was chosen)."""
        self._call(self._start())

    def stop(self) -> None:
        """Close every forwarded connection and refuse new ones."""
        self._call(self._stop())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        self._loop.close()

    def _call(self, work: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(work, self._loop).result(STOP_TIMEOUT_S)

    async def _start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._forward, "127.0.0.1", self.port, reuse_address=True
            )
            self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._links.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            self._links.discard(writer)
            return
        self._links.add(up_writer)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                end.transport.abort()
                self._links.discard(end)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    with contextlib.suppress(OSError):
        sink.transport.abort()


@attrs.frozen
class Database:
    """The module's migrated database: ``conninfo`` reaches it directly (not via a proxy)."""

    conninfo: str
    host: str
    port: int

    def via(self, host: str, port: int) -> str:
        """The same database at another address (the proxy), as a postgresql:// URL."""
        parts = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        user = quote(str(parts.get("user") or "postgres"), safe="")
        password = parts.get("password")
        credentials = user if password is None else f"{user}:{quote(str(password), safe='')}"
        return f"postgresql://{credentials}@{host}:{port}/{parts['dbname']}"

    @property
    def url(self) -> str:
        return self.via(self.host, self.port)

    async def rows(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, connect_timeout=5
        ) as conn:
            cursor = await conn.execute(query, params)
            return await cursor.fetchall()

    async def order_status(self, order_id: str) -> str | None:
        found = await self.rows("SELECT status FROM order_history WHERE id = %s", order_id)
        return None if not found else str(found[0][0])

    async def broker_orders(self, account_id: str) -> dict[str, dict[str, Any]]:
        """The paper broker's recorded orders of the account's live book, by document name."""
        found = await self.rows(
            "SELECT name, body FROM documents WHERE name LIKE %s",
            f"paper:live:{account_id}:order:%",
        )
        return {str(name): body for name, body in found}

    async def position(self, account_id: str, symbol: str) -> Decimal:
        """The signed position in the account's stored paper book (0 when flat or absent)."""
        found = await self.rows(
            "SELECT body FROM documents WHERE name = %s", f"paper:live:{account_id}"
        )
        if not found:
            return Decimal(0)
        holding = found[0][0].get("holdings", {}).get(symbol)
        return Decimal(0) if holding is None else Decimal(str(holding["quantity"]))


# --- tradecore processes ----------------------------------------------------------------------


class Process:
    """One tradecore process; its stdout and stderr go to ``log``."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, log: Path) -> None:
        self.name = name
        self.process = process
        self.log = log
        self.forced = False
        """True when ``stop`` had to SIGKILL it: SIGTERM did not end it in time."""

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self) -> str:
        forced = ", SIGKILLed after SIGTERM" if self.forced else ""
        header = f"--- {self.name} (pid {self.pid}, exit {self.process.returncode}{forced}) ---"
        return header + "\n" + _tail(self.log)

    async def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.running:
            self.process.kill()
        await self.process.wait()

    async def stop(self) -> None:
        """SIGTERM, and SIGKILL when it has not exited within STOP_TIMEOUT_S (its stacks
        are first dumped into its log when py-spy is installed)."""
        if self.running:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT_S)
                return
            except TimeoutError:
                self.forced = True
                await self._dump_stacks()
                self.process.kill()
        await self.process.wait()

    async def _dump_stacks(self) -> None:
        py_spy = Path(sys.executable).with_name("py-spy")
        if not py_spy.exists():
            return
        with self.log.open("ab") as log:
            log.write(b"\n--- stacks at SIGKILL (py-spy dump) ---\n")
            log.flush()
            dump = await asyncio.create_subprocess_exec(
                str(py_spy), "dump", "--pid", str(self.pid), stdout=log, stderr=log
            )
            try:
                await asyncio.wait_for(dump.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                dump.kill()
                await dump.wait()


@attrs.frozen
class Account:
    """What ``tradecore admin create-account`` printed (or ``POST /trading/accounts``
    answered: ``from_created``)."""

    trading_account_id: str
    webhook_token: str
    webhook_secret: str

    @property
    def path(self) -> str:
        return f"/webhook/{self.webhook_token}/order"

    @classmethod
    def from_created(cls, body: Mapping[str, Any]) -> Account:
        """The account of a ``POST /trading/accounts`` answer (its webhook URL's token)."""
        url = str(body["webhook_url"])
        prefix, _, token = url.removesuffix("/order").rpartition("/webhook/")
        assert prefix and token, f"not a webhook URL: {url}"
        return cls(str(body["account"]["id"]), token, str(body["webhook_secret"]))


async def run_cli_output(args: Sequence[str], env: Mapping[str, str], *, stdin: str = "") -> str:
    """Run ``tradecore <args>`` to completion; its standard output. AssertionError on failure
    (with its standard error) or when it has not finished within ``CLI_TIMEOUT_S``."""
    process = await asyncio.create_subprocess_exec(
        str(TRADECORE),
        *args,
        env=dict(env),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin.encode()), CLI_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"tradecore {' '.join(args)} did not finish") from None
    if process.returncode != 0:
        raise AssertionError(
            f"tradecore {' '.join(args)} exited {process.returncode}: {err.decode().strip()}"
        )
    return out.decode()


async def run_cli(
    args: Sequence[str], env: Mapping[str, str], *, stdin: str = ""
) -> dict[str, Any]:
    """Run ``tradecore <args>`` to completion; its JSON line. AssertionError on failure."""
    out = await run_cli_output(args, env, stdin=stdin)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


@attrs.frozen
class Trader:
    """The module's user, created with ``tradecore admin create-user``; ``admin_env`` runs
    admin commands (database reached directly, the module's own Redis)."""

    database: Database
    admin_env: Mapping[str, str]
    secrets: Mapping[str, str]
    email: str
    user_id: str


class Stack:
    """One test's tradecore processes over its private Redis and a Postgres proxy."""

    def __init__(
        self, workdir: Path, trader: Trader, redis_server: RedisServer, proxy: TcpProxy
    ) -> None:
        self.workdir = workdir
        self.trader = trader
        self.db = trader.database
        self.redis = redis_server
        self.proxy = proxy
        self.env = base_environment(
            DATABASE_URL=trader.database.via("127.0.0.1", proxy.port),
            REDIS_URL=redis_server.url,
            WORKER_START_TIMEOUT_S="10",
            **trader.secrets,
        )
        self.processes: list[Process] = []
        self._accounts = 0

    async def new_account(self) -> Account:
        """A verified paper account of the trader (``tradecore admin create-account``)."""
        self._accounts += 1
        printed = await run_cli(
            [
                "admin",
                "create-account",
                "--email",
                self.trader.email,
                "--name",
                f"{self.workdir.name} {self._accounts}",
                "--verified",
            ],
            self.trader.admin_env,
        )
        return Account(
            printed["trading_account_id"], printed["webhook_token"], printed["webhook_secret"]
        )

    async def end_lease(self) -> None:
        """The trader's worker lease runs out now (as it would 30 s after its host died)."""
        await asyncio.to_thread(self.redis.delete, mark_key(self.trader.user_id))

    async def order_in_hand(self, order_id: str) -> None:
        """Return once a worker has taken the trader's order ``order_id`` and not yet
        recorded its outcome: the request is in the trader's processing list and the row
        still ``queued`` (a one-step paper order is claimed with its outcome, so ``queued``
        until then). AssertionError with the logs when that is not seen in
        ``SETTLE_TIMEOUT_S``."""
        processing = processing_key(self.trader.user_id)

        async def taken() -> bool:
            return await asyncio.to_thread(self.redis.length, processing) > 0

        await eventually(taken, f"a worker to take order {order_id}", diagnose=self.logs)
        assert await self.db.order_status(order_id) == "queued", "finished before it was seen"

    async def order_reaches(
        self, order_id: str, status: str, *, timeout_s: float = SETTLE_TIMEOUT_S
    ) -> None:
        """Return once the order-history row has ``status``; AssertionError with the row
        and the logs after ``timeout_s``."""
        last: list[tuple[Any, ...]] = []

        async def reached() -> bool:
            last[:] = await self.db.rows(
                "SELECT status, error FROM order_history WHERE id = %s", order_id
            )
            return bool(last) and last[0][0] == status

        def diagnose() -> str:
            return f"the row (status, error): {last}\n{self.logs()}"

        await eventually(
            reached, f"order {order_id} to be {status}", timeout_s=timeout_s, diagnose=diagnose
        )

    async def executed(self, reply: Reply) -> None:
        """The order ``reply`` answered was carried out: 200 filled, or 202 (the worker was
        still reconnecting) and filled soon after."""
        assert reply.status in (200, 202), reply
        if reply.status == 200:
            assert reply.body["status"] == "filled", reply
        await self.order_reaches(reply.body["order_id"], "filled")

    async def api(self, **extra_env: str) -> Api:
        """Start ``tradecore serve`` on a free port; return once ``/health/ready`` is 200."""
        port = free_port()
        process = await self._spawn(
            f"api-{port}", ["serve", "--host", "127.0.0.1", "--port", str(port)], extra_env
        )
        api = Api(f"http://127.0.0.1:{port}", process)

        async def ready() -> bool:
            if not process.running:
                raise AssertionError(f"the API process exited\n{process.tail()}")
            return await api.ready_status() == 200

        await eventually(ready, f"{process.name} to be ready", diagnose=self.logs)
        return api

    async def worker(self, *, log_level: str | None = None, **extra_env: str) -> Process:
        """Start ``tradecore worker`` (at ``log_level``, the command's default if None);
        return once it reports it is running."""
        args = ["worker"] if log_level is None else ["--log-level", log_level, "worker"]
        process = await self._spawn(f"worker-{len(self.processes)}", args, extra_env)

        async def running() -> bool:
            if not process.running:
                raise AssertionError(f"the worker process exited\n{process.tail()}")
            return "worker host" in process.output() and "running" in process.output()

        await eventually(running, f"{process.name} to run", diagnose=self.logs)
        return process

    async def _spawn(self, name: str, args: list[str], extra_env: Mapping[str, str]) -> Process:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                str(TRADECORE),
                *args,
                env={**self.env, **extra_env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        started = Process(name, process, log)
        self.processes.append(started)
        return started

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.processes)

    async def close(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.processes), return_exceptions=True)


# --- HTTP -------------------------------------------------------------------------------------


@attrs.frozen
class Reply:
    status: int
    content_type: str
    body: Any
    cookies: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    """The cookies the answer set (name to value)."""

    def __str__(self) -> str:
        return f"{self.status} {self.content_type} {self.body!r}"


def webhook_body(
    account: Account,
    *,
    action: str = "buy",
    symbol: str = "BTCUSDT",
    quantity: str = "0.1",
    timestamp: datetime | None = None,
) -> bytes:
    """A valid webhook body; each call without ``timestamp`` is a new, distinct alert."""
    when = timestamp or datetime.now(UTC)
    return json.dumps(
        {
            "action": action,
            "symbol": symbol,
            "quantity": float(quantity),
            "timestamp": when.isoformat(),
            "secret": account.webhook_secret,
        }
    ).encode()


@attrs.frozen
class Browser:
    """A logged-in browser: the session cookies and the session's CSRF token."""

    cookies: Mapping[str, str] = attrs.field(repr=False)
    csrf_token: str = attrs.field(repr=False)

    @property
    def access_token(self) -> str:
        """The access token of the session (also good as a bearer token)."""
        return self.cookies["access_token"]

    def headers(self) -> dict[str, str]:
        """What the browser sends with an unsafe request: its cookies and the CSRF token."""
        cookie = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        return {"Cookie": cookie, "X-CSRF-Token": self.csrf_token}


class Api:
    """One API process, called as a user would call it."""

    def __init__(self, base_url: str, process: Process | None = None) -> None:
        self.base_url = base_url
        self.process = process

    async def _call(
        self, method: str, path: str, *, headers: Mapping[str, str] | None = None, **kwargs: Any
    ) -> Reply:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, self.base_url + path, headers=headers, **kwargs) as response,
        ):
            text = await response.text()
            try:
                body: Any = json.loads(text) if text else None
            except ValueError:
                body = text
            cookies = {name: morsel.value for name, morsel in response.cookies.items()}
            return Reply(response.status, response.content_type, body, cookies)

    async def ready_status(self) -> int | None:
        try:
            return (await self._call("GET", "/health/ready")).status
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def webhook(self, account: Account, body: bytes, *, simulation: bool = False) -> Reply:
        query = "?simulation=true" if simulation else ""
        return await self._call(
            "POST",
            account.path + query,
            data=body,
            headers={"Content-Type": "application/json"},
        )

    async def login(self, email: str, password: str = PASSWORD) -> Reply:
        return await self._call(
            "POST",
            "/auth/login",
            json={"email": email, "password": password, "turnstile_token": ""},
        )

    async def browser(self, email: str, password: str = PASSWORD) -> Browser:
        """Log in as a browser does (aiohttp's jar would not send the Secure cookies over
        plain http, so they are kept by hand)."""
        reply = await self.login(email, password)
        assert reply.status == 200, f"login failed: {reply}"
        assert "access_token" in reply.cookies, f"no session cookie: {reply}"
        return Browser(dict(reply.cookies), str(reply.body["csrf_token"]))

    async def create_trading_account(
        self,
        browser: Browser,
        name: str,
        broker: str,
        credentials: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> Reply:
        """``POST /trading/accounts`` (201 with the webhook URL and secret)."""
        body: dict[str, Any] = {"name": name, "broker": broker, **fields}
        if credentials is not None:
            body["credentials"] = dict(credentials)
        return await self._call("POST", "/trading/accounts", json=body, headers=browser.headers())

    async def as_browser(self, browser: Browser, method: str, path: str, **kwargs: Any) -> Reply:
        """Any dashboard call of the logged-in ``browser`` (``json=`` for a body)."""
        return await self._call(method, path, headers=browser.headers(), **kwargs)

    async def verify_credentials(self, browser: Browser, account_id: str) -> Reply:
        """``POST /trading/accounts/{id}/verify-credentials`` (the API asks the venue)."""
        return await self._call(
            "POST",
            f"/trading/accounts/{account_id}/verify-credentials",
            headers=browser.headers(),
        )

    async def access_token(self, email: str, password: str = PASSWORD) -> str:
        reply = await self._call(
            "POST",
            "/auth/token",
            data={"grant_type": "password", "username": email, "password": password},
        )
        assert reply.status == 200, f"no access token: {reply}"
        token: str = reply.body["access_token"]
        return token

    async def dashboard_order(
        self,
        token: str,
        account: Account,
        *,
        action: str = "buy",
        symbol: str = "BTCUSDT",
        quantity: str = "0.1",
    ) -> Reply:
        return await self._call(
            "POST",
            "/trading/order",
            json={
                "trading_account_id": account.trading_account_id,
                "symbol": symbol,
                "action": action,
                "quantity": float(quantity),
                "order_type": "entry",
            },
            headers={"Authorization": f"Bearer {token}"},
        )

    async def order(self, token: str, order_id: str) -> Reply:
        return await self._call(
            "GET", f"/trading/orders/{order_id}", headers={"Authorization": f"Bearer {token}"}
        )


def _tail(path: Path, lines: int = 60) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
