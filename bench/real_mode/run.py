"""The real-mode benchmark (issue 4, item 8): API and worker host as separate processes on
real Postgres and Redis, the paper broker without added latency.

One run: a throwaway database (migrated), Redis database 13 (flushed), ``--users`` pro users
with a verified paper account each plus ``--cold`` users kept for cold activation; then
``tradecore serve`` and ``tradecore worker``, and these phases:

* ``latency``: for each of ``--lower-rates`` and then ``--rate``, ``--latency-users`` fresh
  users primed (one order each, so their workers run), then open loop at that rate,
  ``--warmup`` + ``--duration`` s; latency from the scheduled send to the OrderResult.
* ``throughput``: ``--throughput-users`` users primed, then closed loop at each concurrency of
  ``--concurrency`` (``--step-warmup`` + ``--step-duration`` s each), driven by this process
  or, with ``--client wrk``, by wrk: the knee is the highest rate with no error; then open
  loop at ``--sustain-rate`` for ``--duration`` s.
* ``cold``: lease acquisition for ``--cold`` fresh user ids (``request_start`` to
  ``wait_active`` True), and the first order of ``--cold`` never-activated users (send to
  OrderResult), one at a time.
* ``memory``: a fresh worker process; ``--memory-users`` users each send one order (each
  starts a worker that then stays idle); after ``--idle`` s the worker process's VmRSS from
  /proc/PID/status, and its CPU while idle (always one worker host).

``--apis N --workers M`` start N API processes and M worker hosts that share the users (user
``i`` sends to API ``i % N``; the hosts share the users through their leases); the CPU of each
process is reported under its own name (``api1``, ``worker2``...).

``--design reference`` measures the reference design of issue 13 instead (``reference/``: a
lean batched API and worker host on their own tables, ``ReferenceStack``) with the same load
client and phases: latency and throughput only, one API process and one worker host. Its
results carry ``"design": "reference"`` and its files are named ``<label><N>-reference-...``.

Everything is removed at the end (processes, database, Redis database), also on Ctrl-C.
Results: ``bench/real_mode/results/run<N>-<time>.json`` and a summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import load  # noqa: E402
from stack import REDIS_URL, Stack, cpu_seconds, dump, proc_status, wait_quiet  # noqa: E402

RESULTS = HERE / "results"


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


def quiet(args: argparse.Namespace, what: str) -> float:
    busy = wait_quiet(args.quiet_wait)
    log(f"{what}: machine busy {busy:.0f}% of a core before start")
    return busy


def phase_latency(args: argparse.Namespace, stack: Stack, accounts: list[load.Account]) -> Any:
    """Each rate on its own ``--latency-users`` users (an overloaded step answers 202s, and the
    accounts it leaves out of step would turn the next step's exits into errors); the lower
    rates first."""
    steps = []
    for index, rate in enumerate([*args.lower_rates, args.rate]):
        users = accounts[index * args.latency_users : (index + 1) * args.latency_users]
        primed = asyncio.run(load.prime(users, 16))
        busy = quiet(
            args, f"latency at {rate:g}/s ({len(users)} users, primed {primed['outcomes']})"
        )
        step = asyncio.run(
            load.open_loop(users, rate, args.warmup, args.duration, pids(stack), args.open_client)
        )
        step["busy_before_percent"] = busy
        step["primed"] = primed
        steps.append(step)
        log(
            f"latency at {rate:g}/s: {step['achieved_rate_per_s']}/s errors {step['errors']} "
            f"{step['error_kinds']} p50 {step['latency_ms']['p50']} "
            f"p99 {step['latency_ms']['p99']} ms"
        )
    return {"open_loop": steps[-1], "lower_rates": steps[:-1]}


def latency_slices(args: argparse.Namespace) -> int:
    return (len(args.lower_rates) + 1) * args.latency_users


def phase_throughput(args: argparse.Namespace, stack: Stack, accounts: list[load.Account]) -> Any:
    start = latency_slices(args)
    users = accounts[start : start + args.throughput_users]
    primed = asyncio.run(load.prime(users, 32))
    log(f"throughput: primed {len(users)} users {primed['outcomes']}")
    steps = []
    for concurrency in args.concurrency:
        busy = quiet(args, f"closed loop c={concurrency}")
        if args.client == "wrk":
            step = load.closed_loop_wrk(
                users, concurrency, args.step_warmup, args.step_duration, pids(stack)
            )
        else:
            step = asyncio.run(
                load.closed_loop(
                    users, concurrency, args.step_warmup, args.step_duration, pids(stack)
                )
            )
        step["busy_before_percent"] = busy
        steps.append(step)
        log(
            f"closed c={concurrency}: {step['achieved_rate_per_s']}/s errors {step['errors']} "
            f"{step['error_kinds']} p50 {step['latency_ms']['p50']} "
            f"p99 {step['latency_ms']['p99']} ms"
        )
    clean = [s for s in steps if s["errors"] == 0]
    knee = max(clean, key=lambda s: s["achieved_rate_per_s"]) if clean else None
    busy = quiet(args, f"sustained open loop {args.sustain_rate}/s")
    sustained = asyncio.run(
        load.open_loop(
            users, args.sustain_rate, args.warmup, args.duration, pids(stack), args.open_client
        )
    )
    sustained["busy_before_percent"] = busy
    log(
        f"sustained {args.sustain_rate}/s: {sustained['achieved_rate_per_s']}/s errors "
        f"{sustained['errors']} {sustained['error_kinds']} p50 {sustained['latency_ms']['p50']} "
        f"p99 {sustained['latency_ms']['p99']} ms"
    )
    return {
        "primed": primed,
        "closed_loop": steps,
        "knee": None
        if knee is None
        else {"concurrency": knee["concurrency"], "rate_per_s": knee["achieved_rate_per_s"]},
        "sustained": sustained,
    }


def phase_cold(args: argparse.Namespace, stack: Stack, cold: list[load.Account]) -> Any:
    quiet(args, "cold")
    lease = asyncio.run(load.lease_acquisition(stack.redis_url, args.cold))
    log(f"lease acquisition: {lease['latency_ms']} missed {lease['not_active_within_5s']}")
    first = asyncio.run(load.cold_orders(cold))
    log(f"cold first order: {first['latency_ms']} {first['outcomes']}")
    return {"lease_acquisition": lease, "first_order": first}


def phase_memory(args: argparse.Namespace, stack: Stack, accounts: list[load.Account]) -> Any:
    worker = stack.restart_worker()
    time.sleep(2.0)
    baseline = proc_status(worker.pid)
    users = accounts[: args.memory_users]
    started = time.monotonic()
    primed = asyncio.run(load.prime(users, 32))
    seconds = time.monotonic() - started
    log(f"memory: {len(users)} first orders in {seconds:.1f} s {primed['outcomes']}")
    active = asyncio.run(count_active(stack.redis_url, users))
    time.sleep(args.idle)
    cpu_before, t0 = cpu_seconds(worker.pid), time.monotonic()
    time.sleep(10.0)
    idle_cpu = 100 * (cpu_seconds(worker.pid) - cpu_before) / (time.monotonic() - t0)
    after = proc_status(worker.pid)
    result = {
        "users": len(users),
        "primed": primed,
        "leases_held": active,
        "worker_pid": worker.pid,
        "rss_before_kib": baseline,
        "rss_idle_kib": after,
        "rss_idle_mib": round(after["VmRSS"] / 1024, 1),
        "per_worker_kib": round((after["VmRSS"] - baseline["VmRSS"]) / max(1, len(users)), 2),
        "idle_worker_cpu_percent": round(idle_cpu, 1),
    }
    before_mib = round(baseline["VmRSS"] / 1024, 1)
    log(
        f"memory: {active} leases, RSS {result['rss_idle_mib']} MiB (before {before_mib}), "
        f"idle CPU {result['idle_worker_cpu_percent']}%"
    )
    return result


async def count_active(redis_url: str, users: list[load.Account]) -> int:
    from tradecore_adapters.redis import RedisWorkerDirectory, open_connections

    connections = open_connections(redis_url)
    directory = RedisWorkerDirectory(connections)
    try:
        flags = [await directory.is_active(u.user_id) for u in users]
    finally:
        await connections.aclose()
    return sum(flags)


def pids(stack: Stack) -> dict[str, int]:
    assert stack.apis and stack.workers
    return stack.pids()


def one_run(args: argparse.Namespace, number: int, redis_url: str) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="tradecore-bench-"))
    if args.design == "reference":
        from reference.stack import ReferenceStack

        stack: Any = ReferenceStack(workdir, redis_url=redis_url)
    else:
        stack = Stack(workdir, apis=args.apis, workers=args.workers, redis_url=redis_url)
    report: dict[str, Any] = {
        "run": number,
        "design": args.design,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "args": {k: v for k, v in vars(args).items() if k != "func"},
    }
    try:
        started = time.monotonic()
        stack.create()
        total = max(args.memory_users, latency_slices(args) + args.throughput_users)
        documents = asyncio.run(stack.provision(total + args.cold))
        log(f"provisioned {len(documents)} users in {time.monotonic() - started:.1f} s")
        accounts = load.accounts_from(documents[:total])
        cold = load.accounts_from(documents[total:])
        stack.start_api()
        stack.start_worker()
        report["stack"] = stack.describe()
        if "latency" in args.phases:
            report["latency"] = phase_latency(args, stack, accounts)
        if "throughput" in args.phases:
            report["throughput"] = phase_throughput(args, stack, accounts)
        if "cold" in args.phases:
            report["cold"] = phase_cold(args, stack, cold)
        if "memory" in args.phases:
            report["memory"] = phase_memory(args, stack, accounts)
        for process in stack.processes():
            if not process.running():
                report.setdefault("crashed", []).append(process.name)
        report["logs"] = {p.name: p.tail(10) for p in stack.processes() if p.tail(10)}
    finally:
        stack.close()
    return report


def summary(reports: list[dict[str, Any]]) -> str:
    names = [f"run {r['run']}" + (f" ({r['design']})" if "design" in r else "") for r in reports]
    lines = ["| measure | goal | " + " | ".join(names) + " |"]
    lines.append("|---|---|" + "---|" * len(reports))

    def row(name: str, goal: str, pick: Any) -> None:
        cells = []
        for r in reports:
            try:
                cells.append(str(pick(r)))
            except (KeyError, TypeError):
                cells.append("-")
        lines.append(f"| {name} | {goal} | " + " | ".join(cells) + " |")

    row("p50 at 200/s (ms)", "<= 4", lambda r: r["latency"]["open_loop"]["latency_ms"]["p50"])
    row("p99 at 200/s (ms)", "<= 10", lambda r: r["latency"]["open_loop"]["latency_ms"]["p99"])
    row("errors at 200/s", "0", lambda r: r["latency"]["open_loop"]["errors"])
    for i, rate in enumerate(reports[0]["args"]["lower_rates"] if reports else []):
        row(
            f"p50 / p99 at {rate:g}/s (ms)",
            "-",
            lambda r, i=i: (
                f"{r['latency']['lower_rates'][i]['latency_ms']['p50']} / "
                f"{r['latency']['lower_rates'][i]['latency_ms']['p99']}"
            ),
        )
    row("knee, closed loop (orders/s)", ">= 500", lambda r: r["throughput"]["knee"])
    row(
        "sustained open loop (rate, errors)",
        ">= 500, 0",
        lambda r: (
            f"{r['throughput']['sustained']['achieved_rate_per_s']}/s, "
            f"{r['throughput']['sustained']['errors']} errors, "
            f"p99 {r['throughput']['sustained']['latency_ms']['p99']} ms"
        ),
    )
    row(
        "lease acquisition p50 / p99 (ms)",
        "<= 10 / <= 100",
        lambda r: (
            f"{r['cold']['lease_acquisition']['latency_ms']['p50']} / "
            f"{r['cold']['lease_acquisition']['latency_ms']['p99']}"
        ),
    )
    row(
        "cold first order p50 / p99 (ms)",
        "-",
        lambda r: (
            f"{r['cold']['first_order']['latency_ms']['p50']} / "
            f"{r['cold']['first_order']['latency_ms']['p99']}"
        ),
    )
    row(
        "10,000 idle workers: RSS (MiB)",
        "< 1024",
        lambda r: f"{r['memory']['rss_idle_mib']} ({r['memory']['leases_held']} leases)",
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--phases", default="latency,throughput,cold,memory", type=lambda s: s.split(",")
    )
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--sustain-rate", type=float, default=500.0)
    parser.add_argument(
        "--lower-rates",
        default="50,100",
        type=lambda s: [float(r) for r in s.split(",") if r],
        help="open-loop rates also measured in the latency phase (where the 200/s goal fails)",
    )
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument(
        "--concurrency", default="8,16,32,64", type=lambda s: [int(c) for c in s.split(",")]
    )
    parser.add_argument(
        "--client",
        choices=("aiohttp", "wrk"),
        default="aiohttp",
        help="the closed loop's client: this process (aiohttp) or wrk (a C client, which "
        "drives one API process: not with --apis above 1)",
    )
    parser.add_argument(
        "--open-client",
        choices=("lean", "aiohttp"),
        default="lean",
        help="the open loops' client: the lean raw HTTP/1.1 client (bench/lean_http.py, as "
        "the issue measured) or aiohttp's (this benchmark's before 2026-11-27)",
    )
    parser.add_argument("--step-warmup", type=float, default=3.0)
    parser.add_argument("--step-duration", type=float, default=12.0)
    parser.add_argument("--latency-users", type=int, default=400)
    parser.add_argument("--throughput-users", type=int, default=2000)
    parser.add_argument("--cold", type=int, default=200)
    parser.add_argument("--memory-users", type=int, default=10_000)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds before reading RSS")
    parser.add_argument("--quiet-wait", type=float, default=120.0)
    parser.add_argument("--label", default="run")
    parser.add_argument(
        "--design",
        choices=("tradecore", "reference"),
        default="tradecore",
        help="the service measured: tradecore, or issue 13's reference design (reference/)",
    )
    parser.add_argument("--apis", type=int, default=1, help="API processes")
    parser.add_argument("--workers", type=int, default=1, help="worker hosts")
    parser.add_argument(
        "--redis-cluster",
        action="store_true",
        help="run on a private three-master Redis Cluster started for the run "
        "(tests/contract/redis_cluster.py) instead of BENCH_REDIS_URL",
    )
    args = parser.parse_args()
    if args.client == "wrk" and args.apis > 1:
        # wrk sends every request to one address: the other API processes would sit idle
        parser.error("--client wrk drives one API process; use the aiohttp client with --apis")
    if args.design == "reference":
        if {"cold", "memory"} & set(args.phases):
            parser.error("--design reference runs the latency and throughput phases only")
        if args.apis != 1 or args.workers != 1 or args.redis_cluster:
            parser.error("--design reference runs one API process and one worker host on one Redis")

    # SIGTERM ends the run through the same cleanup as Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    RESULTS.mkdir(exist_ok=True)
    with contextlib.ExitStack() as cleanup:
        redis_url = REDIS_URL
        if args.redis_cluster:
            redis_url = cleanup.enter_context(private_cluster())
            log(f"Redis Cluster {redis_url}")
        reports = run_all(args, redis_url)
    print(summary(reports))
    print(json.dumps({"results": [r.get("at") for r in reports]}))


@contextlib.contextmanager
def private_cluster() -> Iterator[str]:
    """Three masters on free loopback ports (the contract tests' cluster), ended at exit."""
    sys.path.insert(0, str(HERE.parent.parent / "tests" / "contract"))
    from redis_cluster import ThreeMasterCluster

    workdir = Path(tempfile.mkdtemp(prefix="tradecore-bench-cluster-"))
    cluster = ThreeMasterCluster(workdir)
    try:
        cluster.start()
        yield cluster.url
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def run_all(args: argparse.Namespace, redis_url: str) -> list[dict[str, Any]]:
    reports = []
    for number in range(1, args.runs + 1):
        log(f"run {number} of {args.runs}")
        report = one_run(args, number, redis_url)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        design = "" if args.design == "tradecore" else f"-{args.design}"
        out = RESULTS / f"{args.label}{number}{design}-{stamp}.json"
        dump(out, report)
        log(f"written {out}")
        reports.append(report)
    return reports


if __name__ == "__main__":
    main()
