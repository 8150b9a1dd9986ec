"""Argon2id password hashing off the event loop.

argon2-cffi's defaults are RFC 9106's low-memory profile (64 MiB, 3 passes, 4 lanes), the
specification's "recommended default parameters". Each hash takes ~64 MiB and 50-200 ms of
CPU, so hashing runs in worker threads behind a semaphore: the event loop never blocks and a
burst of logins cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from argon2 import PasswordHasher as _Argon2
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

T = TypeVar("T")


class Argon2PasswordHasher:
    """PasswordHasher on argon2-cffi (Argon2id)."""

    def __init__(self, max_concurrency: int | None = None, hasher: _Argon2 | None = None) -> None:
        self._argon2 = hasher or _Argon2()
        workers = max_concurrency or max(1, os.cpu_count() or 1)
        self._limit = asyncio.Semaphore(workers)
        self._threads = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="argon2", initializer=_lower_priority
        )
        self._dummy_hash = self._argon2.hash("dummy password for unknown users")

    async def hash(self, password: str) -> str:
        async with self._limit:
            return await self._run(self._argon2.hash, password)

    async def verify(self, encoded: str, password: str) -> bool:
        async with self._limit:
            return await self._run(self._verify_sync, encoded, password)

    def needs_rehash(self, encoded: str) -> bool:
        try:
            return self._argon2.check_needs_rehash(encoded)
        except InvalidHashError:
            return True

    async def verify_dummy(self, password: str) -> None:
        await self.verify(self._dummy_hash, password)

    def _verify_sync(self, encoded: str, password: str) -> bool:
        try:
            return self._argon2.verify(encoded, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False

    async def _run(self, call: Callable[..., T], *args: str) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, call, *args)


def _lower_priority() -> None:
    """Hashing threads yield the CPU to the event loop, so a burst of logins never slows the
    order paths. Linux: the thread's policy becomes ``SCHED_IDLE`` (it runs only on a core
    nothing else wants; libargon2's lane threads inherit it) and its nice value 19, which is
    what remains where the policy cannot be set. Elsewhere this does nothing."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
