"""Waiting in memory for an event by key, as the in-memory messaging adapters do.

The adapters run on one event loop: an operation that changes what a waiter waits for rings
that waiter's key, and the waiter looks again. Blocking calls built on ``wait_for`` wait in
real time, up to their timeout, and return as soon as what they wait for arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

ANY = "*"
"""The key of a wait for anything of a queue (not for one user or one request)."""


def _resolve(waiter: asyncio.Future[bool], rung: bool) -> None:
    if not waiter.done():
        waiter.set_result(rung)


class Doorbell:
    """Wake-ups by key: ``ring(key)`` wakes every coroutine waiting on that key right now."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[asyncio.Future[bool]]] = {}

    def ring(self, key: str) -> None:
        waiters = self._waiting.pop(key, None)
        if waiters is not None:
            for waiter in waiters:
                _resolve(waiter, True)

    async def wait(self, key: str, deadline: float) -> bool:
        """True on the next ring of ``key``; False once the loop's time reached ``deadline``
        without one. A cancelled wait leaves nothing behind."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        waiters = self._waiting.get(key)
        if waiters is None:
            self._waiting[key] = [waiter]
        else:
            waiters.append(waiter)
        timer = loop.call_at(deadline, _resolve, waiter, False)
        try:
            return await waiter
        finally:
            timer.cancel()
            if not (waiter.done() and not waiter.cancelled() and waiter.result()):
                self._forget(key, waiter)  # a timeout or a cancellation: still listed

    def _forget(self, key: str, waiter: asyncio.Future[bool]) -> None:
        waiters = self._waiting.get(key)
        if waiters is None:
            return
        try:
            waiters.remove(waiter)
        except ValueError:  # rung after its timeout: the ring took the list already
            return
        if not waiters:
            del self._waiting[key]


async def wait_for(
    bell: Doorbell,
    key: str,
    ready: Callable[[], T | None],
    timeout_s: float,
    pause_s: Callable[[], float | None] | None = None,
) -> T | None:
    """``ready()`` as soon as it is not None, re-checked on every ring of ``key`` and, when
    ``pause_s`` is given, after at most ``pause_s()`` seconds (None: until a ring); None once
    ``timeout_s`` of real time passed. A ``timeout_s`` <= 0 checks once and never waits."""
    value = ready()
    if value is not None or timeout_s <= 0:
        return value
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        wake_at = deadline
        if pause_s is not None:
            pause = pause_s()
            if pause is not None:
                wake_at = min(deadline, loop.time() + pause)
        rung = await bell.wait(key, wake_at)
        value = ready()
        if value is not None or (not rung and wake_at == deadline) or loop.time() >= deadline:
            return value
