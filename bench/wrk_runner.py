"""wrk (a C HTTP client) driving webhook orders with ``webhook.lua``: the closed loop of both
the embedded benchmark (``webhook_load.py wrk``) and the real-mode one (``real_mode/run.py
--client wrk``), so the client takes a twentieth of the CPU an asyncio client takes and
leaves it to the service under test.

Each call of ``run_wrk`` is one wrk process over ``accounts`` (dicts with ``webhook_url`` and
``webhook_secret``). Every account starts with a buy entry in every call, and sends its sell
exit only after its own entry was answered, so a position is never exited twice whatever an
earlier client (or an earlier call, cut off mid-order) left open: the positions stay long and
bounded, and every order can fill.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

SCRIPT = Path(__file__).resolve().parent / "webhook.lua"


def wrk_binary() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install -y wrk)")
    return wrk


def run_wrk(
    accounts: Sequence[dict[str, str]],
    base_url: str,
    *,
    threads: int,
    concurrency: int,
    seconds: float,
    timeout_s: float,
) -> dict[str, Any]:
    """One wrk run of ``seconds`` (whole seconds, at least one); what ``webhook.lua`` counted:
    requests, filled, non_200, not_filled, socket_errors, rate_per_s and latency_ms."""
    wrk = wrk_binary()
    entries = ",\n".join(
        f'{{path = "{urlsplit(a["webhook_url"]).path}", secret = "{a["webhook_secret"]}"}}'
        for a in accounts
    )
    with tempfile.TemporaryDirectory(prefix="tradecore-wrk-") as workdir:
        lua_accounts = Path(workdir) / "accounts.lua"
        lua_accounts.write_text(f"return {{\n{entries}\n}}\n")
        env = {**os.environ, "ACCOUNTS_LUA": str(lua_accounts), "WRK_THREADS": str(threads)}
        command = [wrk, f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(seconds))}s"]
        command += [f"--timeout={max(1, round(timeout_s))}s", "-s", str(SCRIPT), base_url]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    found = re.search(r"^WRK_RESULT (.*)$", done.stdout, re.MULTILINE)
    if found is None:
        raise SystemExit(f"wrk printed no result:\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(found.group(1))
    return result


class Meter(Protocol):
    """CPU over a window: ``mark`` at its start and end, then ``report`` (JSON-ready)."""

    def mark(self) -> None: ...

    def report(self) -> dict[str, float]: ...


def children_seconds() -> float:
    """CPU seconds of this process's finished children (the wrk runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def closed_loop(
    accounts: Sequence[dict[str, str]],
    base_url: str,
    *,
    threads: int,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    timeout_s: float,
    meter: Callable[[Callable[[], float]], Meter],
) -> dict[str, Any]:
    """A warm-up run (when ``warmup_s`` is a second or more), then the measured one, its CPU
    read by ``meter(children_seconds)`` (wrk's own CPU is that of the finished children): the
    result as the benchmarks report a closed-loop step."""

    def run(seconds: float) -> dict[str, Any]:
        return run_wrk(
            accounts,
            base_url,
            threads=threads,
            concurrency=concurrency,
            seconds=seconds,
            timeout_s=timeout_s,
        )

    if warmup_s >= 1:
        run(warmup_s)
    cpu = meter(children_seconds)
    cpu.mark()
    measured = run(duration_s)
    cpu.mark()
    kinds = {k: measured[k] for k in ("non_200", "not_filled", "socket_errors") if measured[k]}
    return {
        "requests": measured["requests"],
        "errors": sum(kinds.values()),
        "error_kinds": kinds,
        "achieved_rate_per_s": measured["rate_per_s"],
        "latency_ms": measured["latency_ms"],
        "concurrency": concurrency,
        "client": f"wrk -t{threads}",
        **cpu.report(),
    }
