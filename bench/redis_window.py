"""What a Redis server did over a window of time: its CPU, and the calls and time of each
command (``INFO commandstats`` read before and after), with the number of keys at the end.

For a load that runs meanwhile, such as ``bench/real_mode/run.py``'s closed loop: start the
load, wait for its measured phase, then run this beside it. A command's time counts the
commands a script ran inside it too, so the column does not add up to the CPU. Usage::

    .venv/bin/python bench/redis_window.py --seconds 20 --url redis://127.0.0.1:6379/11
"""

from __future__ import annotations

import argparse
import json
import time

import redis


def _commands(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Each command's (calls, microseconds) so far."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (s["calls"], s["usec"]) for name, s in stats.items()}


def _cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--top", type=int, default=25, help="commands listed, by time")
    args = parser.parse_args()
    client = redis.Redis.from_url(args.url)
    before, cpu_before = _commands(client), _cpu_s(client)
    time.sleep(args.seconds)
    after, cpu_after = _commands(client), _cpu_s(client)
    rows = []
    for name, (calls, usec) in after.items():
        calls_before, usec_before = before.get(name, (0, 0))
        if calls > calls_before:
            rows.append((usec - usec_before, calls - calls_before, name))
    rows.sort(reverse=True)
    summary = {
        "seconds": args.seconds,
        "cpu_s": round(cpu_after - cpu_before, 3),
        "keys": client.dbsize(),
        "commands": sum(calls for _, calls, _ in rows),
    }
    print(json.dumps(summary))
    for usec, calls, name in rows[: args.top]:
        print(json.dumps({"command": name, "calls": calls, "usec": usec}))
    client.close()


if __name__ == "__main__":
    main()
