"""Webhook order load against a server started by ``bench/seeded_server.py``.

Two modes:

* ``open``: requests on a fixed schedule (``--rate`` per second). Latency is measured from
  each request's *scheduled* send time, so a stalled server or client shows up in the numbers
  instead of silently slowing the schedule (no coordinated omission). The time from the
  actual send is reported too (``service``), and how late the client itself sent (``send
  lag``). ``--logins N`` runs N concurrent login loops (``POST /auth/login``, Argon2id on the
  server) for the whole run.
* ``closed``: ``--concurrency`` workers, each sending its next request as soon as the
  previous one is answered: the maximum throughput at that concurrency.

The client (``--client``) is ``lean`` by default: raw HTTP/1.1 over keep-alive connections,
one request at a time on each, so that the client costs little and adds little to the
latency; ``aiohttp`` is aiohttp's client session (the numbers before the lean client). The
login loops always use aiohttp. The event loop (``--loop``) is uvloop where installed. All
times come from ``time.perf_counter()``; a request counts as answered when the last byte of
its response has arrived.

Every body is unique (a microsecond timestamp and a per-account sequence number in the
quantity; the replay layer refuses duplicates). Each account alternates a ``buy`` entry and
a ``sell`` exit of the same quantity on BTCUSDT, one request at a time, so positions stay
flat or one entry long and margin stays bounded. A webhook counts as an error unless it is
answered 200 with ``status: filled``; a login unless 200. The first ``--warmup`` seconds are
run but not counted. The result is printed and written as JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import platform
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from lean_http import LeanClient, ProtocolError
from wrk_runner import closed_loop as wrk_closed_loop

SYMBOL = "BTCUSDT"
RESULTS = Path(__file__).resolve().parent / "results"
SPIN_US = 0.0  # open: default --spin-us; measured no gain beyond the noise (bench/README.md)


class Account:
    """One webhook account: its URL, secret, next action and a lock that keeps its requests
    strictly one after another (an exit never overtakes its entry)."""

    def __init__(self, url: str, secret: str) -> None:
        self.url = url
        self.path = urlsplit(url).path.encode()
        self.secret = secret
        self.sequence = 0
        self.open_quantity: str | None = None
        self.lock = asyncio.Lock()

    def next_body(self) -> tuple[bytes, str]:
        """The body and its quantity: a buy entry when flat, else the sell exit of the open
        quantity. The microsecond timestamp makes every body unique."""
        if self.open_quantity is None:
            self.sequence += 1
            quantity = f"0.{1000 + self.sequence % 9000:04d}1"  # 0.10001 .. 0.99991
            action, order_type = "buy", "entry"
        else:
            quantity = self.open_quantity
            action, order_type = "sell", "exit"
        timestamp = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        # The quantity as a raw JSON number: the server reads it as an exact Decimal.
        text = (
            f'{{"action": "{action}", "order_type": "{order_type}", '
            f'"symbol": "{SYMBOL}", "quantity": {quantity}, "timestamp": "{timestamp}", '
            f'"secret": "{self.secret}"}}'
        )
        return text.encode(), quantity

    def filled(self, quantity: str) -> None:
        """Advance the alternation after a filled order (an error leaves it where it was)."""
        self.open_quantity = quantity if self.open_quantity is None else None


def judge_webhook(account: Account, quantity: str, status: int, body: bytes) -> tuple[bool, str]:
    """(filled?, what came back when not) for a webhook's answer: ok only when it is 200 with a
    JSON object whose ``status`` is ``filled``; a fill advances the account's alternation."""
    if status != 200:
        return False, f"http {status}"
    try:
        payload = json.loads(body)
    except ValueError:
        return False, "not json"
    order_status = payload.get("status") if isinstance(payload, dict) else None
    if order_status != "filled":
        return False, f"status {order_status}"
    account.filled(quantity)
    return True, "filled"


# --- the two clients behind one interface -----------------------------------------------


class Client(Protocol):
    """Sends the benchmark's requests; each call returns (ok, what came back when not ok,
    ``perf_counter()`` when the answer was complete or the request failed)."""

    async def webhook(self, account: Account) -> tuple[bool, str, float]: ...

    async def health(self) -> tuple[bool, str, float]: ...

    async def close(self) -> None: ...


class LeanHttpClient:
    """The benchmark's requests over a LeanClient, each request's bytes built in one go."""

    def __init__(self, base_url: str, connections: int, timeout: float) -> None:
        url = urlsplit(base_url)
        assert url.hostname is not None and url.port is not None
        self._client = LeanClient(url.hostname, url.port, connections, timeout)
        self._host = url.netloc.encode()
        self._health = b"GET /health HTTP/1.1\r\nHost: %s\r\n\r\n" % self._host

    async def webhook(self, account: Account) -> tuple[bool, str, float]:
        body, quantity = account.next_body()
        request = (
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (account.path, self._host, len(body), body)
        )
        try:
            response, done = await self._client.exchange(request)
        except (OSError, ProtocolError, TimeoutError) as e:
            return False, type(e).__name__, time.perf_counter()
        return *judge_webhook(account, quantity, response.status, response.body), done

    async def health(self) -> tuple[bool, str, float]:
        try:
            response, done = await self._client.exchange(self._health)
        except (OSError, ProtocolError, TimeoutError) as e:
            return False, type(e).__name__, time.perf_counter()
        return response.status == 200, f"http {response.status}", done

    async def close(self) -> None:
        self._client.close()


class AiohttpClient:
    """The benchmark's requests through an aiohttp client session (no cookies)."""

    def __init__(self, base_url: str, connections: int, timeout: float) -> None:
        self._health_url = base_url + "/health"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, limit_per_host=connections),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=timeout),
        )

    async def webhook(self, account: Account) -> tuple[bool, str, float]:
        body, quantity = account.next_body()
        try:
            async with self._session.post(
                account.url, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                payload = await response.read()
                done = time.perf_counter()
        except (aiohttp.ClientError, TimeoutError) as e:
            return False, type(e).__name__, time.perf_counter()
        return *judge_webhook(account, quantity, response.status, payload), done

    async def health(self) -> tuple[bool, str, float]:
        try:
            async with self._session.get(self._health_url) as response:
                await response.read()
                done = time.perf_counter()
        except (aiohttp.ClientError, TimeoutError) as e:
            return False, type(e).__name__, time.perf_counter()
        return response.status == 200, f"http {response.status}", done

    async def close(self) -> None:
        await self._session.close()


def make_client(name: str, base_url: str, connections: int, timeout: float) -> Client:
    """The client ``--client`` names; call it inside the running loop."""
    if name == "lean":
        return LeanHttpClient(base_url, connections, timeout)
    return AiohttpClient(base_url, connections, timeout)


# --- the open loop's alarm -----------------------------------------------------------------


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Alarm:
    """Wakes the open-loop scheduler at ``perf_counter()`` instants, never before them.

    On Linux the alarm is a timerfd (absolute CLOCK_MONOTONIC, which is perf_counter's clock
    there) that the event loop watches: microsecond precision without polling. Elsewhere it is
    the loop's own timer, whole milliseconds (and on uvloop up to one early), and the
    remainder is spent yielding to the loop. ``kind`` says which."""

    CLOCK_MONOTONIC, TFD_TIMER_ABSTIME = 1, 1

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._fd: int | None = None
        self._libc: ctypes.CDLL | None = None
        with contextlib.suppress(OSError, AttributeError):
            if time.get_clock_info("perf_counter").implementation.endswith("(CLOCK_MONOTONIC)"):
                self._libc = ctypes.CDLL(None, use_errno=True)
                fd = self._libc.timerfd_create(
                    self.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC
                )  # TFD_NONBLOCK and TFD_CLOEXEC are these flags
                if fd >= 0:
                    self._fd = fd
                    self._loop.add_reader(fd, self._rang)
        self.kind = "timerfd" if self._fd is not None else "loop timer"

    async def sleep_until(self, instant: float, spin: float = 0.0) -> None:
        """Sleep until ``spin`` seconds before ``instant``, then yield to the loop in a busy
        loop (responses are still handled) until ``instant`` has passed."""
        wake = instant - spin
        if self._fd is not None and wake > time.perf_counter():
            nanoseconds = round(wake * 1e9)
            spec = _Itimerspec(
                _Timespec(0, 0),
                _Timespec(nanoseconds // 1_000_000_000, nanoseconds % 1_000_000_000),
            )
            assert self._libc is not None
            self._waiter = self._loop.create_future()
            if self._libc.timerfd_settime(
                self._fd, self.TFD_TIMER_ABSTIME, ctypes.byref(spec), None
            ):
                raise OSError(ctypes.get_errno(), "timerfd_settime")
            await self._waiter
        elif wake > time.perf_counter():
            await asyncio.sleep(wake - time.perf_counter())
        while time.perf_counter() < instant:  # noqa: ASYNC110 - a spin that still serves I/O
            await asyncio.sleep(0)

    def _rang(self) -> None:
        assert self._fd is not None
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None


def machine_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, summed over cores."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return float("nan"), float("nan")
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:8]) - idle) / tick, sum(fields[:8]) / tick


class CpuMeter:
    """CPU used over the measured window, in percent of one core: the server (all its
    threads), this client, and everything else on the machine (other processes disturb
    the numbers; the result shows by how much)."""

    def __init__(self, server_pid: int, client_seconds: Callable[[], float] = time.process_time):
        self._server_pid = server_pid
        self._client_seconds = client_seconds
        self._marks: list[tuple[float, float, float, float]] = []

    def _server_seconds(self) -> float:
        try:
            fields = Path(f"/proc/{self._server_pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def mark(self) -> None:
        busy, _ = machine_seconds()
        self._marks.append(
            (time.perf_counter(), self._server_seconds(), self._client_seconds(), busy)
        )

    def schedule(self, begin: float, end: float) -> None:
        """Mark at the ``perf_counter()`` instants begin and end (to the loop timer's
        precision, a millisecond at worst)."""
        loop = asyncio.get_running_loop()
        loop.call_later(begin - time.perf_counter(), self.mark)
        loop.call_later(end - time.perf_counter(), self.mark)

    def report(self) -> dict[str, float | None]:
        if len(self._marks) < 2:
            return {"server_cpu_percent": None, "client_cpu_percent": None}
        (t0, s0, c0, m0), (t1, s1, c1, m1) = self._marks[0], self._marks[1]

        def percent(seconds: float) -> float:
            return round(100 * seconds / (t1 - t0), 1)

        return {
            "server_cpu_percent": percent(s1 - s0),
            "client_cpu_percent": percent(c1 - c0),
            "other_cpu_percent": percent((m1 - m0) - (s1 - s0) - (c1 - c0)),
        }


class Recorder:
    """Samples of one kind of request: (scheduled or start time, latency, service, ok, tag)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float, bool, str]] = []

    def add(self, start: float, latency: float, service: float, ok: bool, tag: str) -> None:
        self.samples.append((start, latency, service, ok, tag))

    def window(self, begin: float, end: float) -> list[tuple[float, float, float, bool, str]]:
        return [s for s in self.samples if begin <= s[0] < end]


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank p50/p90/p99/p99.9 and max, in milliseconds."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "p99_9": None, "max": None}
    ordered = sorted(values)

    def rank(p: float) -> float:
        index = max(0, min(len(ordered) - 1, int(-(-p * len(ordered) // 100)) - 1))
        return round(ordered[index] * 1000, 3)

    return {
        "p50": rank(50),
        "p90": rank(90),
        "p99": rank(99),
        "p99_9": rank(99.9),
        "max": round(ordered[-1] * 1000, 3),
    }


def summarize(
    samples: list[tuple[float, float, float, bool, str]], begin: float, end: float
) -> dict[str, Any]:
    """Counts, rate, percentiles and the requests started in each second of the window."""
    errors = Counter(tag for _, _, _, ok, tag in samples if not ok)
    seconds = end - begin
    per_second = Counter(int(s[0] - begin) for s in samples)
    return {
        "requests": len(samples),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors.most_common(10)),
        "achieved_rate_per_s": round(len(samples) / seconds, 1) if seconds > 0 else None,
        "latency_ms": percentiles([s[1] for s in samples]),
        "service_ms": percentiles([s[2] for s in samples]),
        "per_second": [per_second.get(i, 0) for i in range(int(seconds + 0.5))],
    }


async def login_loop(
    session: aiohttp.ClientSession,
    url: str,
    credentials: dict[str, str],
    recorder: Recorder,
    stop: asyncio.Event,
) -> None:
    """Log in again and again until ``stop``; every answer but 200 is an error. The answer's
    session cookie is not kept (no request here needs it)."""
    body = json.dumps({"email": credentials["email"], "password": credentials["password"]})
    while not stop.is_set():
        started = time.perf_counter()
        try:
            async with session.post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                await response.read()
                ok, tag = response.status == 200, f"http {response.status}"
        except (aiohttp.ClientError, TimeoutError) as e:
            ok, tag = False, type(e).__name__
        elapsed = time.perf_counter() - started
        recorder.add(started, elapsed, elapsed, ok, tag)


async def open_loop(args: argparse.Namespace, document: dict[str, Any]) -> dict[str, Any]:
    accounts = [Account(a["webhook_url"], a["webhook_secret"]) for a in document["accounts"]]
    webhooks, lags, logins = Recorder(), Recorder(), Recorder()
    client = make_client(args.client, document["base_url"], args.connections, args.timeout)
    alarm = Alarm()
    login_connector = aiohttp.TCPConnector(limit=max(1, args.logins))
    stop_logins = asyncio.Event()
    async with aiohttp.ClientSession(
        connector=login_connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=args.timeout),
    ) as login_session:
        login_url = document["base_url"] + "/auth/login"
        login_tasks = [
            asyncio.create_task(
                login_loop(login_session, login_url, credentials, logins, stop_logins)
            )
            for credentials in document["logins"][: args.logins]
        ]
        if len(login_tasks) < args.logins:
            raise SystemExit(f"the server seeded only {len(login_tasks)} login users")

        async def fire(index: int, scheduled: float) -> None:
            account = accounts[index % len(accounts)]
            async with account.lock:
                sent = time.perf_counter()
                if args.health:
                    ok, tag, done = await client.health()
                else:
                    ok, tag, done = await client.webhook(account)
            webhooks.add(scheduled, done - scheduled, done - sent, ok, tag)
            lags.add(scheduled, sent - scheduled, 0.0, True, "")

        total = int((args.warmup + args.duration) * args.rate)
        start = time.perf_counter() + 0.05
        end = start + total / args.rate
        cpu = CpuMeter(document["pid"])
        cpu.schedule(start + args.warmup, end)
        spin = args.spin_us / 1e6
        in_flight: set[asyncio.Task[None]] = set()
        try:
            for index in range(total):
                scheduled = start + index / args.rate
                await alarm.sleep_until(scheduled, spin)
                task = asyncio.create_task(fire(index, scheduled))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                await asyncio.sleep(0)  # the request goes out before the alarm is set again
            await asyncio.gather(*in_flight)
            await asyncio.sleep(max(0.0, end - time.perf_counter()) + 0.01)  # the last CPU mark
        finally:
            stop_logins.set()
            await asyncio.gather(*login_tasks)
            await client.close()
            alarm.close()
    begin = start + args.warmup
    measured = webhooks.window(begin, end)
    result = summarize(measured, begin, end)
    result["target_rate_per_s"] = args.rate
    result["send_lag_ms"] = percentiles([s[1] for s in lags.window(begin, end)])
    result["alarm"] = alarm.kind
    result["spin_us"] = args.spin_us
    result.update(cpu.report())
    if args.logins:
        result["logins"] = summarize(logins.window(begin, end), begin, end)
    return result


async def closed_loop(args: argparse.Namespace, document: dict[str, Any]) -> dict[str, Any]:
    accounts = [Account(a["webhook_url"], a["webhook_secret"]) for a in document["accounts"]]
    webhooks = Recorder()
    client = make_client(args.client, document["base_url"], args.concurrency, args.timeout)
    start = time.perf_counter()
    end = start + args.warmup + args.duration
    cpu = CpuMeter(document["pid"])
    cpu.schedule(start + args.warmup, end)

    async def worker(mine: list[Account]) -> None:
        turn = 0
        while True:
            account = mine[turn % len(mine)]
            turn += 1
            # Each account belongs to one worker, so its requests never overlap.
            sent = time.perf_counter()
            if sent >= end:
                return
            if args.health:
                ok, tag, done = await client.health()
            else:
                ok, tag, done = await client.webhook(account)
            webhooks.add(sent, done - sent, done - sent, ok, tag)

    try:
        workers = [accounts[i :: args.concurrency] for i in range(args.concurrency)]
        await asyncio.gather(*(worker(mine) for mine in workers if mine))
    finally:
        await client.close()
    begin = start + args.warmup
    measured = webhooks.window(begin, end)
    result = summarize(measured, begin, end)
    result["concurrency"] = args.concurrency
    result.update(cpu.report())
    return result


def wrk_loop(args: argparse.Namespace, document: dict[str, Any]) -> dict[str, Any]:
    """The closed loop driven by wrk (a C client) with bench/webhook.lua: a warm-up run, then
    the measured one."""
    return wrk_closed_loop(
        document["accounts"],
        document["base_url"],
        threads=args.threads,
        concurrency=args.concurrency,
        warmup_s=args.warmup,
        duration_s=args.duration,
        timeout_s=args.timeout,
        meter=lambda client_seconds: CpuMeter(document["pid"], client_seconds),
    )


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop ``--loop`` names."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def main() -> None:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        default_loop = "asyncio"
    else:
        default_loop = "uvloop"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("open", "closed", "wrk"))
    parser.add_argument("--accounts-file", type=Path, default=RESULTS / "accounts.json")
    parser.add_argument("--rate", type=float, default=200.0, help="open: requests per second")
    parser.add_argument("--concurrency", type=int, default=16, help="closed, wrk: workers")
    parser.add_argument("--threads", type=int, default=1, help="wrk: threads")
    parser.add_argument("--connections", type=int, default=256, help="open: connection cap")
    parser.add_argument("--logins", type=int, default=0, help="open: concurrent login loops")
    parser.add_argument(
        "--health", action="store_true", help="GET /health instead of webhooks (the HTTP floor)"
    )
    parser.add_argument(
        "--client", choices=("lean", "aiohttp"), default="lean", help="open, closed: HTTP client"
    )
    parser.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default=default_loop, help="open, closed"
    )
    parser.add_argument(
        "--spin-us",
        type=float,
        default=SPIN_US,
        help="open: wake this many microseconds before each send and yield until it is due",
    )
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request seconds")
    parser.add_argument("--label", default=None, help="result file name (default: mode+time)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where to write it")
    args = parser.parse_args()

    document = json.loads(args.accounts_file.read_text())
    if not document["base_url"].startswith(("http://127.0.0.1:", "http://[::1]:")):
        parser.error("the benchmark runs over loopback only")
    if args.mode == "wrk":
        result = wrk_loop(args, document)
        client, loop = "wrk", None
    else:
        scenario = open_loop if args.mode == "open" else closed_loop
        with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
            result = runner.run(scenario(args, document))
        client, loop = args.client, args.loop
    budget = 60 * len(document["accounts"]) / (args.warmup + args.duration)
    report = {
        "mode": args.mode + ("-health" if args.health else ""),
        "label": args.label,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "client": client,
        "loop": loop,
        "machine": machine(),
        "accounts": len(document["accounts"]),
        "max_rate_within_user_limits_per_s": round(budget, 1),
        "warmup_s": args.warmup,
        "duration_s": args.duration,
        "webhooks": result,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.results_dir / f"{args.label or args.mode}-{stamp}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
