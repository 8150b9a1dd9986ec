"""Argon2id password hashing off the event loop.

argon2-cffi's defaults are RFC 9106's low-memory profile (64 MiB, 3 passes, 4 lanes), the
specification's "recommended default parameters". Each hash takes ~64 MiB and 50-200 ms of
CPU, so hashing runs in worker threads behind a semaphore: the event loop never blocks and a
burst of logins cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import os

from argon2 import PasswordHasher as _Argon2
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError


class Argon2PasswordHasher:
    """PasswordHasher on argon2-cffi (Argon2id)."""

    def __init__(self, max_concurrency: int | None = None, hasher: _Argon2 | None = None) -> None:
        self._argon2 = hasher or _Argon2()
        self._limit = asyncio.Semaphore(max_concurrency or max(1, os.cpu_count() or 1))
        self._dummy_hash = self._argon2.hash("dummy password for unknown users")

    async def hash(self, password: str) -> str:
        async with self._limit:
            return await asyncio.to_thread(self._argon2.hash, password)

    async def verify(self, encoded: str, password: str) -> bool:
        async with self._limit:
            return await asyncio.to_thread(self._verify_sync, encoded, password)

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
