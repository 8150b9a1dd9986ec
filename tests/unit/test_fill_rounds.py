"""The fill-verifier loop gathers the checks that fall due close together.

Every first check falls due at its own moment (2-3 s after its order's placement), so a loop
that looked again as soon as a round ended woke once per check: on Redis each look reads all
16 shards of the queue. After a round that took fewer checks than it could, the loop pauses
``gather_s`` (through the system's sleeper) so the checks falling due meanwhile go together;
a full round (a backlog) is followed at once by the next, and a round that brought nothing
keeps its own pause (``idle_s``).
"""

from __future__ import annotations

import asyncio

import attrs

from tradecore.fills import CHECK_GATHER_S
from tradecore.services.execution.fill_verifier import FillBatch
from tradecore_entrypoints.system import FILL_BATCH_LIMIT, FillPolling, System


def _round(checks: int) -> FillBatch:
    return FillBatch(decisions=(None,) * checks)


@attrs.define
class Scripted:
    """A verifier whose rounds take the scripted numbers of checks, then wait forever; and a
    sleeper; both write what happens, in order, to one log."""

    rounds: list[int]
    log: list[tuple[str, float]] = attrs.field(factory=list)
    finished: asyncio.Event = attrs.field(factory=asyncio.Event)

    async def run_batch(self, limit: int, wait_s: float) -> FillBatch:
        assert limit == FILL_BATCH_LIMIT
        if not self.rounds:
            self.finished.set()
            await asyncio.Event().wait()
        checks = self.rounds.pop(0)
        self.log.append(("round", checks))
        return _round(checks)

    async def sleep(self, seconds: float) -> None:
        self.log.append(("pause", seconds))
        await asyncio.sleep(0)


async def test_a_round_without_a_backlog_is_followed_by_the_gathering_pause(
    embedded: System,
) -> None:
    scripted = Scripted(rounds=[FILL_BATCH_LIMIT, 3, 0, 1])
    embedded.verifier = scripted  # type: ignore[assignment]
    embedded.sleeper = scripted
    embedded.fill_polling = FillPolling(wait_s=0.0, idle_s=0.0, gather_s=CHECK_GATHER_S)
    await embedded.start(workers=True, verify_fills=True)
    try:
        await asyncio.wait_for(scripted.finished.wait(), timeout=10)
    finally:
        await embedded.stop()
    assert scripted.log == [
        ("round", FILL_BATCH_LIMIT),  # a backlog: the next round at once
        ("round", 3),
        ("pause", CHECK_GATHER_S),
        ("round", 0),  # nothing came: the idle pause, not the gathering one
        ("round", 1),
        ("pause", CHECK_GATHER_S),
    ]


async def test_without_a_gathering_pause_the_loop_looks_again_at_once(embedded: System) -> None:
    scripted = Scripted(rounds=[3, 1])
    embedded.verifier = scripted  # type: ignore[assignment]
    embedded.sleeper = scripted
    embedded.fill_polling = FillPolling(wait_s=0.0, idle_s=0.0)
    await embedded.start(workers=True, verify_fills=True)
    try:
        await asyncio.wait_for(scripted.finished.wait(), timeout=10)
    finally:
        await embedded.stop()
    assert scripted.log == [("round", 3), ("round", 1)]
