"""What the edge adds to a webhook's answer time, paced at a steady rate.

Starts ``tradecore serve --demo`` behind the repository's nginx edge (ModSecurity v3 and the
OWASP CRS, ``deploy/edge``), as the edge tests do (``tests/edge/edge_harness.py``, with the
blanket rate limit raised so the run is never blocked), then sends ``--requests`` webhooks
at ``--rate`` per second over one keep-alive connection for each path:

* ``direct``: straight to the API, the baseline (run first and last, to see drift);
* ``edge, alert source``: through the edge from the alert-source address (rule 2 admits it
  before ModSecurity runs);
* ``edge, ModSecurity+CRS``: through the edge from another address, so every ModSecurity
  rule (rate windows, the CRS, known bad inputs, the reputation list) inspects it.

The webhook names no real account, so the API answers 404 after its full webhook parse; the
edge does the same work whatever the API answers. Reports p50 and p99 answer times in ms.
Needs nginx with the ModSecurity module and the CRS (Debian: nginx,
libnginx-mod-http-modsecurity, modsecurity-crs).

    .venv/bin/python bench/edge_latency.py --rate 200 --requests 2000
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "edge"))

import edge_harness


def paced_webhooks(port: int, source: str, rate: float, count: int) -> dict[str, float | int]:
    """Send ``count`` webhooks from ``source`` at ``rate`` per second; the answer times."""
    body = json.dumps(
        {
            "action": "buy",
            "symbol": "BTCUSDT",
            "quantity": 0.01,
            "timestamp": datetime.now(UTC).isoformat(),
            "secret": "x" * 43,
        }
    ).encode()
    path = "/webhook/" + "A" * 43 + "/order"
    headers = {"Content-Type": "application/json", "Host": edge_harness.HOST}
    connection = http.client.HTTPConnection("127.0.0.1", port, source_address=(source, 0))
    times_ms: list[float] = []
    status = 0
    start = time.perf_counter()
    try:
        for i in range(count):
            pause = start + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            sent = time.perf_counter()
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            times_ms.append((time.perf_counter() - sent) * 1000)
            status = response.status
    finally:
        connection.close()
    times_ms.sort()
    return {
        "status": status,
        "p50_ms": round(statistics.median(times_ms), 3),
        "p99_ms": round(times_ms[int(len(times_ms) * 0.99)], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="webhooks per second")
    parser.add_argument("--requests", type=int, default=2000, help="webhooks per path")
    args = parser.parse_args()
    edge_harness.BLANKET_LIMIT = 1_000_000  # measure the rules' cost, never their refusal
    with tempfile.TemporaryDirectory() as root:
        stack = edge_harness.EdgeStack(Path(root))
        try:
            runs = [
                ("direct", stack.app_port, "127.0.0.1"),
                ("edge, alert source", stack.edge_port, edge_harness.ALERT_SOURCE_IP),
                ("edge, ModSecurity+CRS", stack.edge_port, "127.0.4.1"),
                ("direct", stack.app_port, "127.0.0.1"),
            ]
            for name, port, source in runs:
                result = paced_webhooks(port, source, args.rate, args.requests)
                print(json.dumps({"path": name, **result}))
        finally:
            stack.close()


if __name__ == "__main__":
    main()
