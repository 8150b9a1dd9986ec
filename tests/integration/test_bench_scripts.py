"""The benchmark scripts under ``bench/`` still drive the product, every order filled.

They are not tests of speed (their numbers are in docs/performance.md, measured by hand):
these runs are tiny and only check that the scripts work against the current code, since
they build the system through the same entry points as ``tradecore serve`` and would
otherwise break unnoticed. Real processes, loopback only, the embedded runtime.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The embedded runtime with default settings, whatever the test run's environment holds.
_UNSET = ("DATABASE_URL", "REDIS_URL", "TRADECORE_ENV", "PLAN_DAILY_ORDER_CAPS")
ENV = {k: v for k, v in os.environ.items() if k not in _UNSET}


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )


def last_dict(stdout: str) -> dict[str, Any]:
    result = ast.literal_eval(stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


def test_in_process_closed_fills_every_order() -> None:
    done = run_script(
        "bench/in_process.py", "closed", "--users", "8", "--concurrency", "4", "--orders", "16"
    )
    assert done.returncode == 0, done.stderr
    result = last_dict(done.stdout)
    assert result["orders"] == 16
    assert result["orders_per_s"] > 0 and result["cpu_us_per_order"] > 0


def test_in_process_open_times_every_order() -> None:
    done = run_script(
        "bench/in_process.py", "open", "--users", "8", "--rate", "40",
        "--warmup", "0.1", "--duration", "0.5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = last_dict(done.stdout)
    assert result["orders"] == 20
    assert result["latency_ms"]["p50"] is not None


@pytest.fixture
def seeded_server(tmp_path: Path) -> Iterator[Path]:
    """``bench/seeded_server.py`` on a free port; its accounts file once it serves."""
    accounts = tmp_path / "accounts.json"
    server = subprocess.Popen(
        [sys.executable, "bench/seeded_server.py", "--port", "0", "--users", "8",
         "--out", str(accounts)],
        cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not accounts.exists():
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            assert time.monotonic() < deadline, "the seeded server did not start"
            time.sleep(0.05)
        yield accounts
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert not accounts.exists()  # it removes the file when it stops


def test_the_load_generator_gets_every_webhook_filled(seeded_server: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    done = run_script(
        "bench/webhook_load.py", "open", "--rate", "20", "--warmup", "0", "--duration", "1",
        "--accounts-file", str(seeded_server), "--results-dir", str(results), "--label", "smoke",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [written] = results.glob("smoke-*.json")
    webhooks = json.loads(written.read_text())["webhooks"]
    assert webhooks["requests"] == 20
    assert webhooks["errors"] == 0, webhooks["error_kinds"]


@pytest.mark.parametrize("venue", ["binanceusdm", "paper"])
def test_the_venue_adapter_bench_fills_every_order(venue: str) -> None:
    done = run_script(
        "bench/venue_adapter.py", "--venue", venue, "--orders", "3", "--repeat", "1",
        "--warmup", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = last_dict(done.stdout)
    runs = result["runs"]
    assert [run["pacing"] for run in runs] == (["venue", "fast"] if venue != "paper" else ["none"])
    assert result["placed"] == 3 * len(runs)
    assert result["filled"] == result["placed"]
    assert all(run["place"]["cpu_us"] > 0 and run["status"]["cpu_us"] > 0 for run in runs)
