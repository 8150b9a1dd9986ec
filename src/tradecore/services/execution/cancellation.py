"""Loops that run until their task is cancelled must end when it is.

redis-py can absorb a cancellation that lands inside a read with a timeout: the read returns
(or times out) normally and the task goes on, still marked as being cancelled. A loop whose
every turn awaits such a read would then never end, and a worker host would ignore SIGTERM
until it is killed (leases held, users waiting for their expiry). Each long-running loop
calls ``raise_if_cancelled`` once per turn, so a cancellation ends it at the next turn at the
latest.
"""

from __future__ import annotations

import asyncio


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` when the current task has a cancellation pending that was
    absorbed below (``Task.cancelling()``); do nothing otherwise."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
