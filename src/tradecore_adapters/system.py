"""The real clock, sleeper and randomness."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from datetime import UTC, datetime


class SystemClock:
    """Clock on the host's wall time, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class AsyncioSleeper:
    """Sleeper on the event loop."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class SecretsRandom:
    """RandomSource on the operating system's CSPRNG."""

    def token_urlsafe(self, nbytes: int = 32) -> str:
        return secrets.token_urlsafe(nbytes)

    def new_id(self) -> str:
        return str(uuid.uuid4())
