"""What the edge adds to a webhook's answer time, paced at a steady rate.

Starts ``tradecore serve --demo`` behind the repository's nginx edge (ModSecurity v3 and the
OWASP CRS, ``deploy/edge``), as the edge tests do (``tests/edge/edge_harness.py``, with the
blanket rate limit raised so the run is never blocked, and jemalloc preloaded into nginx as
the image does), then sends ``--requests`` webhooks at ``--rate`` per second over one
keep-alive connection for each path:

* ``direct``: straight to the API, the baseline (run first and last, to see drift);
* ``edge, alert source``: through the edge from the alert-source address (rule 2 admits it
  before ModSecurity runs);
* ``edge, ModSecurity+CRS``: through the edge from another address, so every ModSecurity
  rule (rate windows, the CRS, known bad inputs, the reputation list) inspects it;
* one path per ``--compare NAME=DIR[:ALLOCATOR[:LIBDIR]]``: the same through another edge
  configuration (``DIR``, a copy of deploy/edge, for example from an earlier commit) with
  nginx on ``ALLOCATOR`` (``jemalloc``, the default, or ``glibc``) and, with ``LIBDIR``, the
  libraries in that directory first (``LD_LIBRARY_PATH``: another libmodsecurity build),
  proxying to the same API process, so a change is measured against what it replaces in the
  same sitting.

``--rounds`` repeats the whole sequence, alternating the paths, since a shared machine's load
changes from minute to minute. The webhook names no real account, so the API answers 404
after its full webhook parse; the edge does the same work whatever the API answers. Reports,
per path and round, p50 and p99 answer times in ms and, for the edge paths, the CPU time
nginx's worker spent per webhook (from /proc, less sensitive to the machine's load than the
answer time), then each path's median p50 over the rounds and the median of what it adds
at p50 to the direct runs of its round.

``--instructions N`` measures instead what stays repeatable on a loaded machine: the
instructions nginx executes per webhook, counted by valgrind's callgrind over N webhooks
after 20 warm-up ones, for the shipped edge from the alert-source address and from another
address, and for each ``--compare`` configuration (nginx runs in one process under
valgrind, about 100 times slower, so an N of 200 is plenty).

Needs nginx with the ModSecurity module and the CRS (Debian: nginx,
libnginx-mod-http-modsecurity, modsecurity-crs; libjemalloc2 for the shipped allocator;
valgrind for ``--instructions``).

    .venv/bin/python bench/edge_latency.py --rate 200 --requests 2000
    git archive HEAD~1 deploy/edge | tar -x -C /tmp/before
    .venv/bin/python bench/edge_latency.py --rounds 3 \\
        --compare before=/tmp/before/deploy/edge:glibc
    .venv/bin/python bench/edge_latency.py --instructions 200 \\
        --compare before=/tmp/before/deploy/edge:glibc
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "edge"))

import edge_harness

NON_ALERT_SOURCE = "127.0.4.1"
WARM_UP_WEBHOOKS = 20
VALGRIND_START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class EdgePath:
    """One path a webhook is sent along: ``port`` from ``source``; ``cpu_ns`` reads the CPU
    time of the nginx worker that serves it (None for the direct path)."""

    name: str
    port: int
    source: str
    cpu_ns: Callable[[], int] | None = None


class ComparedEdge:
    """Another edge configuration (``edge_dir``) in front of the same API process, started as
    the harness starts the shipped one; ``close`` stops it. With ``callgrind_out``, nginx runs
    in one process under callgrind with instrumentation off until ``count_instructions``."""

    def __init__(
        self,
        root: Path,
        edge_dir: Path,
        allocator: str,
        upstream_port: int,
        callgrind_out: Path | None = None,
        library_dir: str = "",
    ) -> None:
        self.port = edge_harness.free_port()
        self.callgrind_out = callgrind_out
        conf = edge_harness.render_edge(
            root, listen_port=self.port, upstream_port=upstream_port, edge_dir=edge_dir
        )
        args = [edge_harness.NGINX, "-p", str(root), "-e", str(root / "logs" / "error.log")]
        args += ["-c", str(conf), "-g", "daemon off;"]
        start_timeout_s = edge_harness.START_TIMEOUT_S
        if callgrind_out is not None:
            args[-1] = "daemon off; master_process off;"
            valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind_out}"]
            args = [*valgrind, "--instr-atstart=no", *args]
            start_timeout_s = VALGRIND_START_TIMEOUT_S
        env = {"PATH": "/usr/bin:/bin", "HOME": str(root), **edge_harness.allocator_env(allocator)}
        if library_dir:
            env["LD_LIBRARY_PATH"] = library_dir
        self.nginx = edge_harness.Process(args, root / "nginx.out", env)
        deadline = time.monotonic() + start_timeout_s
        while not self._answers():
            if time.monotonic() > deadline or self.nginx.popen.poll() is not None:
                self.close()
                raise RuntimeError(f"the edge of {edge_dir} did not start:\n{self.nginx.output()}")
            time.sleep(edge_harness.POLL_S)

    def _answers(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request("GET", "/health", headers={"Host": edge_harness.HOST})
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def worker_cpu_ns(self) -> int:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.nginx.popen.pid:
                return int((stat.parent / "schedstat").read_text().split()[0])
        raise RuntimeError("no nginx worker")

    def count_instructions(self, source: str, count: int) -> float:
        """The instructions nginx executes per webhook from ``source``, over ``count`` webhooks
        after the warm-up ones; stops nginx (callgrind writes its counts at the exit)."""
        assert self.callgrind_out is not None
        path = EdgePath("counted", self.port, source)
        paced_webhooks(path, rate=1e9, count=WARM_UP_WEBHOOKS)
        pid = str(self.nginx.popen.pid)
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        paced_webhooks(path, rate=1e9, count=count)
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        # callgrind writes its counts as nginx exits, which takes longer than the harness's
        # stop allows on a loaded machine
        self.nginx.popen.send_signal(signal.SIGTERM)
        self.nginx.popen.wait(VALGRIND_START_TIMEOUT_S)
        self.close()
        totals = re.search(r"^totals: (\d+)", self.callgrind_out.read_text(), re.MULTILINE)
        assert totals is not None, f"no totals in {self.callgrind_out}"
        return int(totals.group(1)) / count

    def close(self) -> None:
        self.nginx.stop()


def paced_webhooks(path: EdgePath, rate: float, count: int) -> dict[str, object]:
    """Send ``count`` webhooks along ``path`` at ``rate`` per second; the answer times."""
    body = json.dumps(
        {
            "action": "buy",
            "symbol": "BTCUSDT",
            "quantity": 0.01,
            "timestamp": datetime.now(UTC).isoformat(),
            "secret": "x" * 43,
        }
    ).encode()
    url = "/webhook/" + "A" * 43 + "/order"
    headers = {"Content-Type": "application/json", "Host": edge_harness.HOST}
    connection = http.client.HTTPConnection("127.0.0.1", path.port, source_address=(path.source, 0))
    times_ms: list[float] = []
    status = 0
    cpu_before = path.cpu_ns() if path.cpu_ns is not None else 0
    start = time.perf_counter()
    try:
        for i in range(count):
            pause = start + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            sent = time.perf_counter()
            connection.request("POST", url, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            times_ms.append((time.perf_counter() - sent) * 1000)
            status = response.status
    finally:
        connection.close()
    times_ms.sort()
    result: dict[str, object] = {
        "status": status,
        "p50_ms": round(statistics.median(times_ms), 3),
        "p99_ms": round(times_ms[int(len(times_ms) * 0.99)], 3),
    }
    if path.cpu_ns is not None:
        result["nginx_cpu_ms_per_webhook"] = round((path.cpu_ns() - cpu_before) / 1e6 / count, 3)
    return result


class Compared(NamedTuple):
    """One ``--compare``: a name, an edge directory, nginx's allocator, a library directory
    searched first ("" for none)."""

    name: str
    directory: Path
    allocator: str
    library_dir: str


def _compared(spec: str) -> Compared:
    """``NAME=DIR[:ALLOCATOR[:LIBDIR]]`` of ``--compare``."""
    name, _, rest = spec.partition("=")
    directory, _, rest = rest.partition(":")
    allocator, _, library_dir = rest.partition(":")
    if not name or not directory:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR[:ALLOCATOR[:LIBDIR]], got {spec!r}")
    return Compared(name, Path(directory), allocator or "jemalloc", library_dir)


def instruction_counts(
    root: Path, upstream_port: int, compared: list[Compared], count: int
) -> None:
    """Print the instructions per webhook of the shipped edge (from the alert-source address
    and from another one) and of each compared configuration (from another address)."""
    shipped = edge_harness.EDGE_DIR
    runs = [
        ("edge, alert source", shipped, "jemalloc", "", edge_harness.ALERT_SOURCE_IP),
        ("edge, ModSecurity+CRS", shipped, "jemalloc", "", NON_ALERT_SOURCE),
    ]
    runs += [
        (f"{c.name}, ModSecurity+CRS", c.directory, c.allocator, c.library_dir, NON_ALERT_SOURCE)
        for c in compared
    ]
    for number, (name, edge_dir, allocator, library_dir, source) in enumerate(runs):
        run_root = root / f"callgrind-{number}"
        run_root.mkdir()
        out = run_root / "callgrind.out"
        edge = ComparedEdge(
            run_root, edge_dir, allocator, upstream_port, callgrind_out=out, library_dir=library_dir
        )
        try:
            per_webhook = edge.count_instructions(source, count)
        finally:
            edge.close()
        print(json.dumps({"path": name, "instructions_per_webhook": round(per_webhook)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="webhooks per second")
    parser.add_argument("--requests", type=int, default=2000, help="webhooks per path")
    parser.add_argument("--rounds", type=int, default=1, help="times to run every path")
    parser.add_argument(
        "--compare",
        type=_compared,
        action="append",
        default=[],
        metavar="NAME=DIR[:ALLOCATOR[:LIBDIR]]",
        help="another edge configuration to measure alongside (repeatable)",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="N",
        help="count nginx's instructions per webhook over N webhooks (valgrind) instead",
    )
    args = parser.parse_args()
    edge_harness.BLANKET_LIMIT = 1_000_000  # measure the rules' cost, never their refusal
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "shipped").mkdir()
        stack = edge_harness.EdgeStack(root / "shipped")
        compared: list[ComparedEdge] = []
        try:
            if args.instructions:
                instruction_counts(root, stack.app_port, args.compare, args.instructions)
                return
            direct = EdgePath("direct", stack.app_port, "127.0.0.1")
            paths = [
                EdgePath(
                    "edge, alert source",
                    stack.edge_port,
                    edge_harness.ALERT_SOURCE_IP,
                    stack.worker_cpu_ns,
                ),
                EdgePath(
                    "edge, ModSecurity+CRS", stack.edge_port, NON_ALERT_SOURCE, stack.worker_cpu_ns
                ),
            ]
            for name, directory, allocator, library_dir in args.compare:
                (root / name).mkdir()
                edge = ComparedEdge(
                    root / name, directory, allocator, stack.app_port, library_dir=library_dir
                )
                compared.append(edge)
                paths.append(
                    EdgePath(
                        f"{name}, ModSecurity+CRS", edge.port, NON_ALERT_SOURCE, edge.worker_cpu_ns
                    )
                )
            shipped = stack.nginx_env.get("LD_PRELOAD", "glibc malloc")
            print(json.dumps({"shipped_edge_allocator": shipped}))
            p50s: dict[str, list[float]] = {}
            added: dict[str, list[float]] = {}
            for round_number in range(1, args.rounds + 1):
                load = Path("/proc/loadavg").read_text().split()[:3]
                print(json.dumps({"round": round_number, "load_average": load}))
                round_p50: dict[str, float] = {}
                direct_p50: list[float] = []
                for path in [direct, *paths, direct]:
                    result = paced_webhooks(path, args.rate, args.requests)
                    print(json.dumps({"path": path.name, **result}))
                    p50 = float(str(result["p50_ms"]))
                    if path is direct:
                        direct_p50.append(p50)
                    else:
                        round_p50[path.name] = p50
                baseline = statistics.fmean(direct_p50)
                for name, p50 in round_p50.items():
                    p50s.setdefault(name, []).append(p50)
                    added.setdefault(name, []).append(p50 - baseline)
            for name in p50s:
                summary = {
                    "summary": name,
                    "median_p50_ms": round(statistics.median(p50s[name]), 3),
                    "median_added_at_p50_ms": round(statistics.median(added[name]), 3),
                }
                print(json.dumps(summary))
        finally:
            for edge in compared:
                edge.close()
            stack.close()


if __name__ == "__main__":
    main()
