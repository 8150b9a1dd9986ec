"""Start the real-mode stack and hold it until Ctrl-C or SIGTERM (for profiling by hand):
``hold.py --users N --out FILE`` provisions N users, starts ``tradecore serve`` and
``tradecore worker``, writes the accounts and both pids to FILE, and cleans everything up
(processes, database, Redis database 13) when stopped."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stack import Stack, dump


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--apis", type=int, default=1, help="API processes")
    parser.add_argument("--workers", type=int, default=1, help="worker hosts")
    args = parser.parse_args()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stack = Stack(
        Path(tempfile.mkdtemp(prefix="tradecore-hold-")), apis=args.apis, workers=args.workers
    )
    try:
        stack.create()
        documents = asyncio.run(stack.provision(args.users))
        stack.start_api()
        stack.start_worker()
        dump(
            args.out,
            {
                **stack.describe(),
                "pids": stack.pids(),
                "logs": str(stack.workdir),
                "accounts": documents,
            },
        )
        print(f"holding; accounts and pids in {args.out}", flush=True)
        stop.wait()
    finally:
        stack.close()
        args.out.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
