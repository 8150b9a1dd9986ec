"""Deterministic time and randomness for tests: a clock that moves only when told to."""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from datetime import UTC, datetime, timedelta

import attrs

EPOCH = datetime(2026, 1, 5, 14, 30, tzinfo=UTC)  # a Monday afternoon, markets open


@attrs.define
class FakeClock:
    """A Clock whose time changes only through ``advance`` or ``set``."""

    current: datetime = EPOCH

    def now(self) -> datetime:
        return self.current

    def advance(self, seconds: float) -> None:
        self.current += timedelta(seconds=seconds)

    def set(self, when: datetime) -> None:
        self.current = when


@attrs.define
class FakeSleeper:
    """A Sleeper that advances its FakeClock instead of waiting, and records every sleep."""

    clock: FakeClock
    slept: list[float] = attrs.field(factory=list)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)
        await asyncio.sleep(0)


@attrs.define
class SeededRandom:
    """A RandomSource with reproducible output (never use outside tests)."""

    seed: int = 0
    _rng: random.Random = attrs.field(init=False)
    _counter: itertools.count[int] = attrs.field(init=False, factory=itertools.count)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)  # noqa: S311 - test determinism, not security

    def token_urlsafe(self, nbytes: int = 32) -> str:
        import base64

        raw = self._rng.randbytes(nbytes)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def new_id(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
