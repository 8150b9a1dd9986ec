"""Time and randomness. The core never reads the clock or draws random bytes itself."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """The wall clock."""

    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...


@runtime_checkable
class Sleeper(Protocol):
    """Waiting. Tests inject one that advances a fake clock instead of waiting."""

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` have passed on the paired clock."""
        ...


@runtime_checkable
class RandomSource(Protocol):
    """Unpredictable values: tokens and identifiers."""

    def token_urlsafe(self, nbytes: int = 32) -> str:
        """A URL-safe text token carrying ``nbytes`` random bytes (``secrets.token_urlsafe``)."""
        ...

    def new_id(self) -> str:
        """A fresh, unique identifier (a UUID4 string)."""
        ...
